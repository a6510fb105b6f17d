/* Shortest round-trip decimal form of a double (the digits Python's repr and
 * JavaScript print), fast and exact for the values records carry. */
#ifndef SDTK_DTOA_H
#define SDTK_DTOA_H

#include <stddef.h>

int sd_dtoa_shortest(double v, char *out, size_t cap);
int sd_dtoa_shortest_printf(double v, char *out, size_t cap);

#endif
