/* 8-bit RGB PNG files with one optional text chunk, written by hand over
 * libdeflate (png_write.c): the bytes depend only on the pixels and the
 * text. sd-sample's and sd-train's sample images. */
#ifndef SDTK_PNG_WRITE_H
#define SDTK_PNG_WRITE_H

#include <stdint.h>

#include "buf.h"
#include "err.h"

/* 8-bit RGB [h, w, 3] as a PNG in out, with a text chunk key = text when
 * both are given (tEXt when text is Latin-1, else iTXt, as PIL writes
 * A1111's). */
sd_status sd_png_encode(const uint8_t *rgb, int w, int h, const char *key, const char *text, sd_buf *out,
                        sd_error *err);

#endif
