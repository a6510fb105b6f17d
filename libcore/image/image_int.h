/* Inside sdimage only: the direct decoders for the common formats (JPEG,
 * PNG, WebP), the area resizer they feed, and the Lanczos one for
 * enlargements. image.c tries them first and
 * falls back to libvips for everything they decline. */
#ifndef SDTK_IMAGE_INT_H
#define SDTK_IMAGE_INT_H

#include <stddef.h>

#include "image.h"
#include "imghdr.h"

/* Area resizer (OpenCV INTER_AREA's weights: each output pixel is the mean
 * of the source area it covers, partly covered pixels weighted by the part).
 * Source rows are pushed top to bottom, all of them; only the plan's crop box
 * is computed, written as RGB8 rows into `out` (cw * ch * 3 bytes), mirrored
 * when the plan says flip. Both sides must shrink or stay (sw >= resize_w,
 * sh >= resize_h). Rows passed in must be followed by 16 readable bytes. */
typedef struct sd_area sd_area;
/* `channels` bytes per source pixel: 1 grey, 2 grey + alpha, 3 RGB, 4 RGBA;
 * alpha is flattened onto white. */
sd_area *sd_area_new(int sw, int sh, int channels, const sd_image_plan *plan, unsigned char *out);
/* The next source row (sw pixels). Returns 1 once the last row the crop box
 * needs has been pushed (later rows may be skipped). */
int sd_area_push(sd_area *a, const unsigned char *row);
void sd_area_free(sd_area *a);

/* PIL's Image.resize(size, Image.LANCZOS) on 8-bit RGB, as kohya resizes
 * when a side grows: pixel centres, lanczos3 (widened on an axis that
 * shrinks), Pillow's fixed-point rounding and 8-bit clip between the
 * horizontal and the vertical pass, so the same bytes. `src`: sw x sh RGB8
 * rows `stride` bytes apart; only the plan's crop box is computed, written
 * as RGB8 rows into `out` (cw * ch * 3 bytes), mirrored when the plan says
 * flip. Any sizes (it is exact for shrinks too, but the pipeline shrinks
 * with the area resizer). Returns 0, or -1 when out of memory. */
int sd_lanczos_rgb8(const unsigned char *src, int sw, int sh, size_t stride, const sd_image_plan *plan, unsigned char *out);

/* image.c's reading for image_band.c: the bytes of src in the thread's file
 * buffer, checked against the plan's pixel limit; and a libvips failure as
 * a status with libvips' words. */
sd_status sd_image_read_checked(const sd_image_src *src, const sd_image_plan *plan, const char *name,
                                unsigned char **buf, size_t *len, sd_error *err);
sd_status sd_image_vips_fail(sd_error *err, sd_status code, const char *name, const char *what);

/* Whether the image loops run their AVX2 versions (the CPU has AVX2 and
 * no test turned them off); both versions give the same bytes. */
int sd_image_avx2(void);
/* Tests only, before any load: 1 keeps every image on the portable (SSE2
 * or plain C) loops, to compare them with the AVX2 ones. */
void sd_image_portable_only(int on);

/* What a direct decoder did with an image. */
typedef enum {
    SD_FAST_DONE = 0, /* `out` holds the plan's crop, RGB8 */
    SD_FAST_DECLINE,  /* not for this path (format, feature, upscale, any decoder complaint): use libvips */
    SD_FAST_CORRUPT   /* damaged compressed data (a JPEG's entropy-coded segments): refused, not handed on */
} sd_fast;

/* The decoders: `info` is the header already parsed by imghdr. On DONE,
 * *icc may hold the file's ICC profile (malloc'ed, the caller applies and
 * frees it) for an RGB image; on CORRUPT (JPEG only) `why` holds the
 * decoder's message, SD_FAST_WHY_MAX bytes at most. */
enum { SD_FAST_WHY_MAX = 200 };
sd_fast sd_fast_jpeg(const unsigned char *buf, size_t len, const sd_imginfo *info, const sd_image_plan *plan,
                     unsigned char *out, unsigned char **icc, size_t *icc_len, char *why);
sd_fast sd_fast_png(const unsigned char *buf, size_t len, const sd_imginfo *info, const sd_image_plan *plan,
                    unsigned char *out, unsigned char **icc, size_t *icc_len);
sd_fast sd_fast_webp(const unsigned char *buf, size_t len, const sd_imginfo *info, const sd_image_plan *plan,
                     unsigned char *out, unsigned char **icc, size_t *icc_len);

/* Damaged scan data in a JPEG the direct decoder declined: CORRUPT with
 * libjpeg's message in `why`, else DECLINE (go on to libvips). */
sd_fast sd_jpeg_scan_check(const unsigned char *buf, size_t len, char *why);

/* The JPEG DCT scale denominator sd_fast_jpeg decodes a w x h image at for
 * this plan: the largest of 8, 4, 2, 1 whose output still covers the resize
 * size on both sides. */
int sd_jpeg_denom(unsigned w, unsigned h, const sd_image_plan *plan);

/* 1 when an embedded ICC profile maps colours to sRGB as the identity, to
 * within the profiles' rounding (image_icc.c): the transform is skipped. */
int sd_icc_is_srgb(const unsigned char *icc, size_t n);

/* The rendering intent (lcms' and VipsIntent's numbering) to take an
 * embedded profile's colours to sRGB with: relative colorimetric where the
 * profile supports it as input, else the one it has (image_icc.c); -1 when
 * lcms cannot read it. */
int sd_icc_intent(const unsigned char *icc, size_t n);

/* A CMYK image (libvips' CMYK interpretation, 8 or 16 bits) as 3-band
 * 8-bit sRGB: through its embedded profile, else naively as PIL does, black
 * to black (image_icc.c). Takes over `in`; NULL on failure, libvips' error
 * set. */
struct _VipsImage *sd_cmyk_to_srgb(struct _VipsImage *in);

/* Per-thread reusable buffers (image_dec.c): the encoded file, the inflated
 * PNG, the HWC pixels behind sd_image_load_chw. A slot's buffer stays valid
 * until the next sd_scratch call for that slot on the same thread. */
enum { SD_SCRATCH_FILE, SD_SCRATCH_INFLATE, SD_SCRATCH_HWC, SD_SCRATCH_SLOTS };
unsigned char *sd_scratch(int slot, size_t n);
/* After an image: give back buffers over their slot's limit. */
void sd_scratch_trim(void);
/* Frees the calling thread's buffers (sd_image_thread_done and
 * sd_image_shutdown call it). */
void sd_fast_thread_done(void);

#endif
