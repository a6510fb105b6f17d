/* UTF-8 validation (captions and tags must be valid UTF-8 to be written as JSON). */
#ifndef SDTK_UTF8_H
#define SDTK_UTF8_H

#include <stddef.h>

size_t sd_utf8_check(const char *s, size_t n);
int sd_utf8_encode(unsigned cp, char out[4]);
/* 3 when s starts with a UTF-8 byte order mark (Windows editors write one), else 0. */
size_t sd_bom_len(const char *s, size_t n);
/* Whether a NUL-terminated name is valid UTF-8 (records must be). */
int sd_name_is_utf8(const char *s);
/* A name for messages: valid UTF-8 copied, other bytes and control bytes as \xHH (cap >= 8); returns out. */
const char *sd_name_escape(const char *s, char *out, size_t cap);

#endif
