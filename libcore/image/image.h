/* The image pipeline: decode any format libvips reads (JPEG, PNG and WebP
 * through direct decoders when they suit the file), from a file or a tar
 * member read in place, EXIF auto-rotate, colour to 8-bit sRGB (ICC, CMYK,
 * grey and 16-bit included), transparency flattened onto white, resize to a
 * record's `resize` size (an area average, kohya's INTER_AREA, when both
 * sides shrink, after shrink-on-load where the format allows it; PIL's
 * LANCZOS, byte for byte, when a side grows), cut the record's `crop` box, optional horizontal flip,
 * and hand back uint8 HWC pixels or float CHW in [-1, 1].
 *
 * Threading: sd_image_init() once, single-threaded, before any load (it sets
 * up libvips process-wide: one libvips thread per image, no operation cache,
 * untrusted loaders blocked); then any number of threads may each load their
 * own images concurrently. Each thread keeps its decode buffers from image to
 * image: a thread other than main() that loaded images calls
 * sd_image_thread_done() before it exits; sd_image_shutdown() at the end. */
#ifndef SDTK_IMAGE_H
#define SDTK_IMAGE_H

#include <stdint.h>

#include "err.h"

/* Decompression-bomb limit: images whose header claims more pixels than this
 * are refused before any decoding (PIL's error threshold, 2 * 89478485, about
 * 13377 x 13377). A plan may set a lower limit (the header reader caps
 * JPEG, PNG, WebP, GIF and BMP at this one whatever the plan says). */
#define SD_IMAGE_MAX_PIXELS 178956970ULL
/* Largest encoded image read into memory (1 GiB). */
#define SD_IMAGE_MAX_BYTES (1ULL << 30)
/* sd_image_src.size meaning "to the end of the file". */
#define SD_IMAGE_WHOLE_FILE UINT64_MAX

/* Where the encoded bytes are: a whole file (offset 0, size
 * SD_IMAGE_WHOLE_FILE) or a byte range of a tar shard (record `offset`,
 * `size`; `member` names it in error messages). */
typedef struct {
    const char *path;
    const char *member;
    uint64_t offset;
    uint64_t size;
} sd_image_src;

/* What to make of it, from a bucketed record: `resize` [w, h], `crop`
 * [l, t, r, b] inside the resized image, and whether to flip left-right. */
typedef struct {
    int resize_w, resize_h;
    int crop_l, crop_t, crop_r, crop_b;
    int flip;
    uint64_t max_pixels; /* 0: SD_IMAGE_MAX_PIXELS */
    int keep_aspect;     /* refuse a resize to another aspect ratio than the image's (records: SD_EINVAL) */
} sd_image_plan;

/* For a src with a member: whether the bytes at its offset are still that
 * member (a tar rebuilt after sd-meta may hold another one there): the
 * 512-byte header right before the data must be a regular file's of `size`
 * bytes named `member` (ustar prefix/name, or the GNU ././@LongLink or pax
 * path= record before it for a long name). One small read (two for a long
 * name); SD_EFORMAT when it is another member or no header, SD_ENOTFOUND
 * or SD_EIO when the file cannot be read; SD_OK without a member. */
sd_status sd_image_check_member(const sd_image_src *src, sd_error *err);

sd_status sd_image_init(sd_error *err);
void sd_image_thread_done(void);
void sd_image_shutdown(void);

sd_status sd_image_plan_check(const sd_image_plan *plan, sd_error *err);
/* Output size of a plan: crop width and height. */
static inline int sd_image_out_w(const sd_image_plan *p) { return p->crop_r - p->crop_l; }
static inline int sd_image_out_h(const sd_image_plan *p) { return p->crop_b - p->crop_t; }

/* out: out_w * out_h * 3 bytes, rows top to bottom, RGB interleaved. */
sd_status sd_image_load_rgb8(const sd_image_src *src, const sd_image_plan *plan, unsigned char *out, sd_error *err);
/* out: 3 * out_w * out_h floats, planes R, G, B, each x / 127.5 - 1. */
sd_status sd_image_load_chw(const sd_image_src *src, const sd_image_plan *plan, float *out, sd_error *err);
void sd_image_rgb8_to_chw(const unsigned char *hwc, int w, int h, float *chw);

/* One band of an image through the plan's resize and crop (never flipped),
 * for loss masks (image_band.c): SD_BAND_ALPHA is the alpha channel (kohya's
 * alpha_mask), SD_BAND_FIRST the first band (a mask image: grey, or red).
 * The image is decoded at its full size, turned upright (EXIF), 16-bit
 * samples taken as their high byte; the band is resized as the picture's
 * direct decoders resize (the area average when both sides shrink, PIL's
 * LANCZOS when a side grows) and cut to the crop box: out_w * out_h bytes.
 * *found is 0 (out untouched) when the image has no such band (no alpha).
 * *w, *h (may be NULL) get the image's upright size. */
enum { SD_BAND_ALPHA = 0, SD_BAND_FIRST = 1 };
sd_status sd_image_load_band(const sd_image_src *src, const sd_image_plan *plan, int which, unsigned char *out,
                             int *found, int *w, int *h, sd_error *err);

#endif
