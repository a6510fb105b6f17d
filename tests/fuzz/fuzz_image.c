/* Fuzz target for the image pipeline's own decoders (image_dec.c: JPEG via
 * libjpeg-turbo, PNG inflated by libdeflate and unfiltered by sdtk, WebP
 * via libwebp) and the area resizer: any bytes either are declined/fail or
 * fill exactly the crop box. The header is parsed by imghdr first, as the
 * pipeline does; images are capped at 1 Mpixel to keep iterations fast. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "image.h"
#include "image_int.h"
#include "imghdr.h"

/* Decode with a half-size plan and a full-size one (both downscale paths). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sd_imginfo info;
    sd_error err;
    if (sd_imghdr_parse(data, size, &info, &err) != SD_OK) return 0;
    if ((uint64_t)info.width * info.height > (1u << 20)) return 0;
    for (int half = 0; half < 2; half++) {
        int rw = half && info.width > 1 ? (int)info.width / 2 : (int)info.width;
        int rh = half && info.height > 1 ? (int)info.height / 2 : (int)info.height;
        sd_image_plan plan = {.resize_w = rw, .resize_h = rh, .crop_l = rw / 4, .crop_t = rh / 4, .crop_r = rw,
                              .crop_b = rh, .flip = half};
        size_t n = (size_t)sd_image_out_w(&plan) * (size_t)sd_image_out_h(&plan) * 3;
        unsigned char *out = malloc(n + 1);
        if (!out) return 0;
        unsigned char *icc = NULL;
        size_t icc_len = 0;
        sd_fast r = SD_FAST_DECLINE;
        char why[SD_FAST_WHY_MAX] = "";
        if (info.format == SD_IMG_JPEG) r = sd_fast_jpeg(data, size, &info, &plan, out, &icc, &icc_len, why);
        else if (info.format == SD_IMG_PNG) r = sd_fast_png(data, size, &info, &plan, out, &icc, &icc_len);
        else if (info.format == SD_IMG_WEBP) r = sd_fast_webp(data, size, &info, &plan, out, &icc, &icc_len);
        unsigned sum = 0;
        if (r == SD_FAST_DONE)
            for (size_t i = 0; i < n; i++) sum += out[i]; /* every output byte written (MSan/valgrind) */
        if (icc && icc_len == 0) abort();
        if (r == SD_FAST_CORRUPT && !why[0]) abort(); /* refused with libjpeg's reason */
        free(icc);
        free(out);
        sd_fast_thread_done();
        if (sum == 0xFFFFFFFFu) abort(); /* keeps the loop from being optimised out */
    }
    return 0;
}
