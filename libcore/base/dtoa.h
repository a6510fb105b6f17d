/* Shortest round-trip decimal form of a double (the digits Python's repr and
 * JavaScript print), fast and exact for the values records carry. */
#ifndef SDTK_DTOA_H
#define SDTK_DTOA_H

#include <stddef.h>

int sd_dtoa_shortest(double v, char *out, size_t cap);
int sd_dtoa_shortest_printf(double v, char *out, size_t cap);
/* The double nearest the shortest decimal that reads back as the float v
 * (1e-05 for 1e-5f, which as a double prints 9.999999747378752e-06). */
double sd_f32_shortest(float v);

#endif
