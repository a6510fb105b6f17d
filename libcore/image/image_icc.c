/* Whether an embedded ICC profile is sRGB in all but its bytes. Most
 * tagged photos carry one of the many sRGB profiles (IEC61966-2.1 from HP
 * or the ICC, libpng's or GIMP's "sRGB built-in", camera makers' copies);
 * moving such a photo "to sRGB" is the identity up to the profiles' own
 * rounding, yet libvips' icc_transform builds two lcms transforms through
 * Lab for each image and rounds every pixel: about 27 ms per 1024^2 photo
 * here. So the pipeline asks lcms once per image (about a millisecond) how
 * the profile maps a grid of colours to lcms' own sRGB, clamped to the
 * gamut as 8-bit output is, and skips the transform when it is the
 * identity to within that rounding: no colour moves by 2 levels or more
 * and the average by less than a tenth of a level. The sRGB files of the
 * wallpaper corpus move at most 0.1 to 1.4 levels (the largest at pure
 * green, where their colorants differ from lcms' in the last digits),
 * 0.004 to 0.04 on average; Adobe RGB or Display P3 move tens of levels. */
#include <lcms2.h>
#include <math.h>
#include <stdlib.h>

#include "image_int.h"

enum { GRID = 17 }; /* levels per channel: 0, 1/16, ..., 1 */

/* 1 when the profile is an RGB profile that maps the colours of a 17^3
 * grid (relative colorimetric, as the pipeline's transform) to themselves
 * in lcms' built-in sRGB, to within 2 levels each and a tenth of a level
 * on average; 0 otherwise, also when lcms cannot read it (the caller then
 * transforms as before). */
int sd_icc_is_srgb(const unsigned char *icc, size_t n)
{
    if (!icc || n < 132 || n > 0xffffffffu) return 0; /* 128-byte header + tag count */
    cmsHPROFILE src = cmsOpenProfileFromMem(icc, (cmsUInt32Number)n);
    if (!src) return 0;
    int same = 0;
    cmsHPROFILE srgb = cmsGetColorSpace(src) == cmsSigRgbData ? cmsCreate_sRGBProfile() : NULL;
    cmsHTRANSFORM t = srgb ? cmsCreateTransform(src, TYPE_RGB_FLT, srgb, TYPE_RGB_FLT, INTENT_RELATIVE_COLORIMETRIC,
                                                cmsFLAGS_NOCACHE)
                           : NULL;
    size_t cells = (size_t)GRID * GRID * GRID;
    float *in = t ? malloc(cells * 3 * sizeof(float)) : NULL, *out = in ? malloc(cells * 3 * sizeof(float)) : NULL;
    if (out) {
        for (size_t i = 0; i < cells; i++) {
            in[3 * i] = (float)(i / (GRID * GRID)) / (GRID - 1);
            in[3 * i + 1] = (float)(i / GRID % GRID) / (GRID - 1);
            in[3 * i + 2] = (float)(i % GRID) / (GRID - 1);
        }
        cmsDoTransform(t, in, out, (cmsUInt32Number)cells);
        double sum = 0;
        same = 1;
        for (size_t i = 0; i < cells * 3 && same; i++) {
            double o = out[i] < 0.0f ? 0.0 : out[i] > 1.0f ? 1.0 : (double)out[i]; /* 8-bit output clamps */
            double d = fabs(o - (double)in[i]) * 255.0;
            same = d < 2.0; /* NaN: not the same */
            sum += d;
        }
        same = same && sum / (double)(cells * 3) < 0.1;
    }
    free(in);
    free(out);
    if (t) cmsDeleteTransform(t);
    if (srgb) cmsCloseProfile(srgb);
    cmsCloseProfile(src);
    return same;
}
