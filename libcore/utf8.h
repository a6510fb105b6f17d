/* UTF-8 validation (captions and tags must be valid UTF-8 to be written as JSON). */
#ifndef SDTK_UTF8_H
#define SDTK_UTF8_H

#include <stddef.h>

size_t sd_utf8_check(const char *s, size_t n);
int sd_utf8_encode(unsigned cp, char out[4]);

#endif
