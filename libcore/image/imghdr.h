/* Image size from the header alone (JPEG, PNG, WebP, GIF): a few KiB of
 * reading instead of a decode, with the checks that keep a bad or hostile
 * file from reaching a decoder (truncation, zero or absurd dimensions). The
 * size and EXIF orientation are the ones the decoders (libvips 8.14, the
 * direct decoders of image_dec.c) will produce, or the planned shape would
 * stretch the image. BMP is recognised only to be refused: libvips 8.14
 * reads it through ImageMagick alone, which sdtk blocks. */
#ifndef SDTK_IMGHDR_H
#define SDTK_IMGHDR_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef enum { SD_IMG_UNKNOWN = 0, SD_IMG_JPEG, SD_IMG_PNG, SD_IMG_WEBP, SD_IMG_GIF, SD_IMG_BMP } sd_img_format;

enum { SD_IMGHDR_MAX_SIDE = 65535 };
/* PIL's decompression-bomb error threshold (2 * MAX_IMAGE_PIXELS). */
#define SD_IMGHDR_MAX_PIXELS 178956970ULL

typedef struct {
    sd_img_format format;
    uint32_t width, height;   /* as stored in the file */
    int orientation;          /* EXIF orientation 1..8 (1 when absent) */
    uint32_t disp_w, disp_h;  /* as displayed: swapped for orientations 5..8 */
} sd_imginfo;

const char *sd_img_format_name(sd_img_format f);
/* Why a format sdtk recognises is refused by every tool (BMP: libvips reads
 * it only through ImageMagick, which sdtk blocks), with what to do; NULL for
 * the formats it reads. */
const char *sd_img_refusal(sd_img_format f);
sd_status sd_imghdr_check_dims(uint64_t w, uint64_t h, sd_error *err);
sd_status sd_imghdr_parse(const unsigned char *p, size_t n, sd_imginfo *out, sd_error *err);
sd_status sd_imghdr_read_fd(int fd, uint64_t offset, uint64_t size, sd_imginfo *out, sd_error *err);
sd_status sd_imghdr_read_file(const char *path, sd_imginfo *out, sd_error *err);

#endif
