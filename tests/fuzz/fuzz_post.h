/* One booru post through sd-meta's worker path (build the record, apply
 * the rules, write both output formats), shared by fuzz_booru (fuzzed
 * posts, fixed rules) and fuzz_rules (fixed posts, fuzzed rules). */
#ifndef SDTK_FUZZ_POST_H
#define SDTK_FUZZ_POST_H

#include <stddef.h>
#include <stdint.h>

#include "rules.h"

void fuzz_post(const char *text, size_t len, uint64_t ordinal, const sd_rules *r, int e621, const char *pattern);

#endif
