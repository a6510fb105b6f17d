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
#include <vips/vips.h>

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

/* libvips 8.14 given an intent the input profile lacks warns and hands the
 * pixels back untransformed (a profile with only a perceptual table, as
 * some scanners and printers write: Pillow's icc_profile_big.jpg), where
 * lcms itself, as PIL calls it, falls back to the perceptual table. So the
 * pipeline asks first: relative colorimetric when the profile can be used
 * as input with it, else the intent its header names, else the first it has
 * of perceptual, saturation and absolute colorimetric; -1 when lcms cannot
 * read the profile or it supports none. lcms' intent numbers are libvips'
 * VipsIntent values. */
int sd_icc_intent(const unsigned char *icc, size_t n)
{
    if (!icc || n < 132 || n > 0xffffffffu) return -1;
    cmsHPROFILE p = cmsOpenProfileFromMem(icc, (cmsUInt32Number)n);
    if (!p) return -1;
    int order[5] = {INTENT_RELATIVE_COLORIMETRIC, (int)cmsGetHeaderRenderingIntent(p), INTENT_PERCEPTUAL,
                    INTENT_SATURATION, INTENT_ABSOLUTE_COLORIMETRIC};
    int intent = -1;
    for (int i = 0; i < 5 && intent < 0; i++)
        if (order[i] >= 0 && order[i] <= INTENT_ABSOLUTE_COLORIMETRIC &&
            cmsIsIntentSupported(p, (cmsUInt32Number)order[i], LCMS_USED_AS_INPUT))
            intent = order[i];
    cmsCloseProfile(p);
    return intent;
}

/* PIL's naive CMYK to RGB: R = (white - C)(white - K) / white^2 at 8 bits,
 * G and B alike, rounded; white is the format's full scale. */
static int cmyk_naive(VipsImage *in, VipsImage **out)
{
    double white = in->BandFmt == VIPS_FORMAT_USHORT ? 65535.0 : 255.0;
    VipsImage *t[6] = {NULL};
    int rc = vips_extract_band(in, &t[0], 0, "n", 4, NULL) || vips_linear1(t[0], &t[1], -1.0, white, NULL) ||
             vips_extract_band(t[1], &t[2], 0, "n", 3, NULL) || vips_extract_band(t[1], &t[3], 3, NULL) ||
             vips_multiply(t[2], t[3], &t[4], NULL) ||
             vips_linear1(t[4], &t[5], 255.0 / (white * white), 0.5, NULL) || /* + 0.5: the cast truncates */
             vips_cast_uchar(t[5], out, NULL);
    for (int i = 0; i < 6; i++)
        if (t[i]) g_object_unref(t[i]);
    return rc;
}

/* A CMYK image to 3-band 8-bit sRGB. With an embedded profile lcms moves
 * it, at the intent the profile has (sd_icc_intent). Without one (or with
 * one libvips cannot use) the colours have no defined meaning, and libvips'
 * own fallback, a press profile taken relative colorimetric without black
 * point compensation, lifts black to about (30,33,43); PIL, whose
 * convert("RGB") kohya's loaders call, maps it naively, R = (1 - C)(1 - K)
 * and so on, black to black: so does this (PIL's integer rounding too).
 * libvips has already undone Adobe's inverted CMYK, as PIL has. Takes over
 * `in`; NULL on failure with libvips' error set. */
VipsImage *sd_cmyk_to_srgb(VipsImage *in)
{
    VipsImage *out = NULL, *t = NULL;
    const void *icc = NULL;
    size_t n = 0;
    int intent = vips_image_get_typeof(in, VIPS_META_ICC_NAME) && !vips_image_get_blob(in, VIPS_META_ICC_NAME, &icc, &n)
                     ? sd_icc_intent(icc, n)
                     : -1;
    if (intent >= 0 && vips_icc_transform(in, &out, "srgb", "embedded", TRUE, "intent", intent, NULL) == 0) {
        g_object_unref(in);
        return out;
    }
    vips_error_clear(); /* a profile libvips refused: the naive map, as PIL */
    if ((in->BandFmt != VIPS_FORMAT_UCHAR && in->BandFmt != VIPS_FORMAT_USHORT) || in->Bands < 4) {
        vips_error("sdtk", "CMYK image with %d bands of format %s", in->Bands,
                   vips_enum_nick(VIPS_TYPE_BAND_FORMAT, in->BandFmt));
        g_object_unref(in);
        return NULL;
    }
    int rc = cmyk_naive(in, &t) || vips_copy(t, &out, "interpretation", VIPS_INTERPRETATION_sRGB, NULL);
    if (t) g_object_unref(t);
    g_object_unref(in);
    return rc ? NULL : out;
}
