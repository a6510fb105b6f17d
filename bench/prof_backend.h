/* A timing wrapper around a backend table, for the benchmarks: every op
 * call is timed and summed per op class (on a device each op is waited
 * for, so the classes add up to the whole). */
#ifndef SDTK_BENCH_PROF_BACKEND_H
#define SDTK_BENCH_PROF_BACKEND_H

#include "backend.h"

enum { C_CONV, C_ATTN, C_LINEAR, C_NORM, C_ELEM, C_N };
extern const char *const class_name[C_N];
/* seconds per class since the last reset */
extern double tsum[C_N];

/* The table of be with every op replaced by its timed wrapper. */
const sd_backend *prof_backend(const sd_backend *be);

#endif
