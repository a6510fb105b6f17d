/* Embedded ICC profiles in the image pipeline: sd_icc_is_srgb takes sRGB
 * profiles (lcms' own, and one with a 1024-entry tabulated sRGB curve as
 * the common IEC61966-2.1 file has) as the identity and nothing else (Adobe
 * RGB, Display P3, a 2.2 gamma, grey, garbage, truncated); end to end, a
 * PNG tagged Adobe RGB is still moved to sRGB (its pixels as lcms maps
 * them, to within the rounding of libvips' path through Lab), and the same
 * PNG tagged sRGB loads with its pixels untouched; an RGBA PNG tagged
 * Adobe RGB is mapped before it is flattened onto white, and a JPEG tagged
 * Adobe RGB is mapped too; a profile with only a perceptual table (no
 * relative colorimetric one, as Pillow's icc_profile_big.jpg has, which
 * libvips 8.14 would leave untransformed) is applied at that intent, in a
 * PNG, a JPEG and on the libvips path (an upscale). */
#include <lcms2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <vips/vips.h>

#include "check.h"
#include "image.h"
#include "image_int.h"

static const cmsCIExyY d65 = {0.3127, 0.3290, 1.0};

/* An RGB matrix-shaper profile with primaries (x, y) and one curve. */
static cmsHPROFILE rgb_profile(const double xy[6], cmsToneCurve *curve)
{
    cmsCIExyYTRIPLE prim = {{xy[0], xy[1], 1.0}, {xy[2], xy[3], 1.0}, {xy[4], xy[5], 1.0}};
    cmsToneCurve *c3[3] = {curve, curve, curve};
    cmsHPROFILE p = cmsCreateRGBProfile(&d65, &prim, c3);
    cmsFreeToneCurve(curve);
    return p;
}

/* The profile's bytes (malloc'd), as a file would hold them. */
static unsigned char *profile_bytes(cmsHPROFILE p, cmsUInt32Number *n)
{
    *n = 0;
    if (!p || !cmsSaveProfileToMem(p, NULL, n)) return NULL;
    unsigned char *b = malloc(*n);
    if (b && !cmsSaveProfileToMem(p, b, n)) {
        free(b);
        b = NULL;
    }
    return b;
}

/* The sRGB transfer function, tabulated as the IEC61966-2.1 file does. */
static cmsToneCurve *srgb_table(void)
{
    cmsUInt16Number t[1024];
    for (int i = 0; i < 1024; i++) {
        double x = i / 1023.0, y = x <= 0.04045 ? x / 12.92 : pow((x + 0.055) / 1.055, 2.4);
        t[i] = (cmsUInt16Number)lround(y * 65535.0);
    }
    return cmsBuildTabulatedToneCurve16(NULL, 1024, t);
}

/* The sRGB curve as a parametric curve (IEC 61966-2.1). */
static cmsToneCurve *srgb_curve(void)
{
    const cmsFloat64Number p[5] = {2.4, 1 / 1.055, 0.055 / 1.055, 1 / 12.92, 0.04045};
    return cmsBuildParametricToneCurve(NULL, 4, p);
}

static const double srgb_xy[6] = {0.64, 0.33, 0.30, 0.60, 0.15, 0.06};
static const double adobe_xy[6] = {0.64, 0.33, 0.21, 0.71, 0.15, 0.06};
static const double p3_xy[6] = {0.680, 0.320, 0.265, 0.690, 0.150, 0.060};

/* Verdict of sd_icc_is_srgb on a profile built here (closed after). */
static int verdict(cmsHPROFILE p)
{
    cmsUInt32Number n;
    unsigned char *b = profile_bytes(p, &n);
    int v = b ? sd_icc_is_srgb(b, n) : -1;
    free(b);
    if (p) cmsCloseProfile(p);
    return v;
}

static void test_verdicts(void)
{
    CHECK(verdict(cmsCreate_sRGBProfile()) == 1);
    CHECK(verdict(rgb_profile(srgb_xy, srgb_table())) == 1);
    CHECK(verdict(rgb_profile(srgb_xy, srgb_curve())) == 1);
    CHECK(verdict(rgb_profile(adobe_xy, cmsBuildGamma(NULL, 563.0 / 256.0))) == 0);
    CHECK(verdict(rgb_profile(p3_xy, srgb_curve())) == 0);
    CHECK(verdict(rgb_profile(srgb_xy, cmsBuildGamma(NULL, 2.2))) == 0); /* sRGB primaries, another curve */
    cmsToneCurve *g = cmsBuildGamma(NULL, 2.2);
    CHECK(verdict(cmsCreateGrayProfile(cmsD50_xyY(), g)) == 0);
    cmsFreeToneCurve(g);
    unsigned char junk[600];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 37 + 11);
    CHECK(sd_icc_is_srgb(junk, sizeof junk) == 0);
    CHECK(sd_icc_is_srgb(NULL, 0) == 0);
    cmsUInt32Number n;
    cmsHPROFILE s = cmsCreate_sRGBProfile();
    unsigned char *b = profile_bytes(s, &n);
    cmsCloseProfile(s);
    if (CHECK(b != NULL)) {
        CHECK(sd_icc_is_srgb(b, n / 2) == 0); /* truncated */
        free(b);
    }
}

/* A w x h PNG (bands 3: RGB, 4: RGBA) or JPEG (by path's extension) of px
 * tagged with the profile p (closed after). */
static int write_tagged(const char *path, const unsigned char *px, int w, int h, int bands, cmsHPROFILE p)
{
    cmsUInt32Number n;
    unsigned char *icc = profile_bytes(p, &n);
    cmsCloseProfile(p);
    VipsImage *im = vips_image_new_from_memory(px, (size_t)w * h * bands, w, h, bands, VIPS_FORMAT_UCHAR);
    int rc = icc && im ? 0 : -1;
    if (!rc) {
        im->Type = VIPS_INTERPRETATION_sRGB;
        vips_image_set_blob_copy(im, VIPS_META_ICC_NAME, icc, n);
        rc = strstr(path, ".jpg") ? vips_jpegsave(im, path, "Q", 95, NULL) : vips_pngsave(im, path, NULL);
    }
    if (im) g_object_unref(im);
    free(icc);
    return rc;
}

/* A w x h RGB PNG of px tagged with the profile p (closed after). */
static int write_png(const char *path, const unsigned char *px, int w, int h, cmsHPROFILE p)
{
    return write_tagged(path, px, w, h, 3, p);
}

/* lcms' own relative-colorimetric map of n RGB8 pixels from Adobe RGB to sRGB. */
static void adobe_to_srgb(const unsigned char *in, unsigned char *out, int n)
{
    cmsHPROFILE a = rgb_profile(adobe_xy, cmsBuildGamma(NULL, 563.0 / 256.0)), s = cmsCreate_sRGBProfile();
    cmsHTRANSFORM t = cmsCreateTransform(a, TYPE_RGB_8, s, TYPE_RGB_8, INTENT_RELATIVE_COLORIMETRIC, 0);
    cmsDoTransform(t, in, out, (cmsUInt32Number)n);
    cmsDeleteTransform(t);
    cmsCloseProfile(a);
    cmsCloseProfile(s);
}

/* The largest difference between got and want over n values. */
static int worst_diff(const unsigned char *got, const unsigned char *want, int n)
{
    int worst = 0;
    for (int i = 0; i < n; i++) {
        int d = abs((int)got[i] - (int)want[i]);
        worst = d > worst ? d : worst;
    }
    return worst;
}

static int load(const char *path, int w, int h, unsigned char *out);

/* RGBA under Adobe RGB: the colours go to sRGB first, then onto white (as
 * libvips and PIL do), also where alpha is partial; and a JPEG tagged
 * Adobe RGB (the direct JPEG decoder's profile, applied after it) comes
 * out as lcms maps its decoded pixels. */
static void test_alpha_and_jpeg(const char *base)
{
    enum { W = 40, H = 24 };
    unsigned char rgba[W * H * 4], rgb[W * H * 3], mapped[W * H * 3], want[W * H * 3], got[W * H * 3];
    for (int i = 0; i < W * H; i++) {
        rgb[3 * i] = rgba[4 * i] = (unsigned char)(i * 7);
        rgb[3 * i + 1] = rgba[4 * i + 1] = (unsigned char)(220 - i % 50);
        rgb[3 * i + 2] = rgba[4 * i + 2] = (unsigned char)(i * 13 + 40);
        rgba[4 * i + 3] = (unsigned char)(i % 3 == 0 ? 255 : i % 3 == 1 ? 123 : 40);
    }
    char png[80], jpg[80];
    snprintf(png, sizeof png, "%s-a.png", base);
    snprintf(jpg, sizeof jpg, "%s.jpg", base);
    adobe_to_srgb(rgb, mapped, W * H);
    for (int i = 0; i < W * H; i++)
        for (int c = 0; c < 3; c++) {
            double a = rgba[4 * i + 3] / 255.0;
            want[3 * i + c] = (unsigned char)lround(mapped[3 * i + c] * a + 255.0 * (1 - a));
        }
    if (CHECK(write_tagged(png, rgba, W, H, 4, rgb_profile(adobe_xy, cmsBuildGamma(NULL, 563.0 / 256.0))) == 0) &&
        CHECK(load(png, W, H, got) == 0)) {
        int worst = worst_diff(got, want, W * H * 3);
        printf("Adobe RGB RGBA PNG: largest difference to lcms, then onto white: %d levels\n", worst);
        CHECK(worst <= 2);
    }
    if (CHECK(write_tagged(jpg, rgb, W, H, 3, rgb_profile(adobe_xy, cmsBuildGamma(NULL, 563.0 / 256.0))) == 0)) {
        VipsImage *im = vips_image_new_from_file(jpg, NULL); /* the decoded pixels, profile not applied */
        size_t n = 0;
        void *raw = im ? vips_image_write_to_memory(im, &n) : NULL;
        if (CHECK(raw && n == sizeof rgb) && CHECK(load(jpg, W, H, got) == 0)) {
            adobe_to_srgb(raw, want, W * H);
            int worst = worst_diff(got, want, W * H * 3), moved = 0;
            for (int i = 0; i < W * H * 3; i++) moved += got[i] != ((unsigned char *)raw)[i];
            printf("Adobe RGB JPEG: largest difference to lcms on its decoded pixels %d levels, %d values moved\n",
                   worst, moved);
            CHECK(worst <= 2 && moved > W * H);
        }
        g_free(raw);
        if (im) g_object_unref(im);
    }
    unlink(png);
    unlink(jpg);
}

/* The colour table of perceptual_only: Adobe RGB's 2.2 gamma and D50
 * colorant matrix, its XYZ halved as lcms encodes XYZ in a table's output
 * (1.0 stands for 1 + 32767/32768). */
static cmsInt32Number adobe_sampler(const cmsUInt16Number in[], cmsUInt16Number out[], void *unused)
{
    (void)unused;
    static const double m[9] = {0.6097559, 0.2052401, 0.1492240, 0.3111242, 0.6256560,
                                0.0632197, 0.0194811, 0.0608902, 0.7448387};
    double lin[3];
    for (int c = 0; c < 3; c++) lin[c] = pow(in[c] / 65535.0, 2.2);
    for (int r = 0; r < 3; r++) {
        double v = (m[3 * r] * lin[0] + m[3 * r + 1] * lin[1] + m[3 * r + 2] * lin[2]) / (1.0 + 32767.0 / 32768.0);
        out[r] = (cmsUInt16Number)lround(v * 65535.0);
    }
    return 1;
}

/* An RGB display profile (v2) whose only table is AToB0 (perceptual): no
 * colorants, so relative colorimetric is not supported as input, as in
 * Pillow's icc_profile_big.jpg. The table: identity curves, a 17^3 grid of
 * adobe_sampler, identity curves (what a lut16Type holds). */
static cmsHPROFILE perceptual_only(void)
{
    cmsHPROFILE p = cmsCreateProfilePlaceholder(NULL);
    cmsSetProfileVersion(p, 2.1);
    cmsSetDeviceClass(p, cmsSigDisplayClass);
    cmsSetColorSpace(p, cmsSigRgbData);
    cmsSetPCS(p, cmsSigXYZData);
    cmsSetHeaderRenderingIntent(p, INTENT_PERCEPTUAL);
    cmsToneCurve *one = cmsBuildGamma(NULL, 1.0);
    cmsToneCurve *id3[3] = {one, one, one};
    cmsPipeline *lut = cmsPipelineAlloc(NULL, 3, 3);
    cmsStage *clut = cmsStageAllocCLut16bit(NULL, 17, 3, 3, NULL);
    cmsStageSampleCLut16bit(clut, adobe_sampler, NULL, 0);
    cmsPipelineInsertStage(lut, cmsAT_END, cmsStageAllocToneCurves(NULL, 3, id3));
    cmsPipelineInsertStage(lut, cmsAT_END, clut);
    cmsPipelineInsertStage(lut, cmsAT_END, cmsStageAllocToneCurves(NULL, 3, id3));
    cmsWriteTag(p, cmsSigAToB0Tag, lut);
    cmsWriteTag(p, cmsSigMediaWhitePointTag, cmsD50_XYZ());
    cmsPipelineFree(lut);
    cmsFreeToneCurve(one);
    return p;
}

static int load_at(const char *path, int rw, int rh, unsigned char *out);

/* The perceptual-only profile: sd_icc_intent picks perceptual, and a PNG
 * and a JPEG tagged with it (the direct decoders), and the PNG upscaled
 * (libvips' path), come out as lcms maps their pixels at that intent. */
static void test_perceptual_only(const char *base)
{
    enum { W = 40, H = 24 };
    unsigned char px[W * H * 3], want[W * H * 3], got[W * H * 3], big[4 * W * H * 3], big_want[4 * W * H * 3];
    for (int i = 0; i < W * H; i++) {
        px[3 * i] = (unsigned char)(i * 7);
        px[3 * i + 1] = (unsigned char)(200 - i % 90);
        px[3 * i + 2] = (unsigned char)(i * 13 + 40);
    }
    cmsHPROFILE p = perceptual_only();
    CHECK(!cmsIsIntentSupported(p, INTENT_RELATIVE_COLORIMETRIC, LCMS_USED_AS_INPUT)); /* the case itself */
    cmsUInt32Number n;
    unsigned char *icc = profile_bytes(p, &n);
    CHECK(icc && sd_icc_intent(icc, n) == INTENT_PERCEPTUAL);
    CHECK(icc && !sd_icc_is_srgb(icc, n));
    free(icc);
    cmsHPROFILE s = cmsCreate_sRGBProfile();
    cmsHTRANSFORM t = cmsCreateTransform(p, TYPE_RGB_8, s, TYPE_RGB_8, INTENT_PERCEPTUAL, 0);
    cmsCloseProfile(p);
    cmsCloseProfile(s);
    if (!CHECK(t != NULL)) return;
    char png[80], jpg[80];
    snprintf(png, sizeof png, "%s-p.png", base);
    snprintf(jpg, sizeof jpg, "%s-p.jpg", base);
    cmsDoTransform(t, px, want, W * H);
    if (CHECK(write_png(png, px, W, H, perceptual_only()) == 0) && CHECK(load(png, W, H, got) == 0)) {
        int worst = worst_diff(got, want, W * H * 3), moved = 0;
        for (int i = 0; i < W * H * 3; i++) moved += got[i] != px[i];
        printf("perceptual-only PNG: largest difference to lcms %d levels, %d values moved\n", worst, moved);
        CHECK(worst <= 2 && moved > W * H);
    }
    /* the upscale (libvips' path): each source pixel doubled on each side, so
     * the profile's map of the nearest source pixel, to within the resampling */
    if (CHECK(load_at(png, 2 * W, 2 * H, big) == 0)) {
        double sum = 0;
        for (int y = 0; y < 2 * H; y++)
            for (int x = 0; x < 2 * W; x++)
                for (int c = 0; c < 3; c++) {
                    big_want[(y * 2 * W + x) * 3 + c] = want[((y / 2) * W + x / 2) * 3 + c];
                    sum += fabs((double)big[(y * 2 * W + x) * 3 + c] - (double)px[((y / 2) * W + x / 2) * 3 + c]) -
                           fabs((double)big[(y * 2 * W + x) * 3 + c] - (double)big_want[(y * 2 * W + x) * 3 + c]);
                }
        printf("perceptual-only PNG upscaled: closer to the mapped pixels than to the raw ones by %.1f levels on "
               "average\n", sum / (4.0 * W * H * 3));
        CHECK(sum / (4.0 * W * H * 3) > 3.0);
    }
    if (CHECK(write_tagged(jpg, px, W, H, 3, perceptual_only()) == 0)) {
        VipsImage *im = vips_image_new_from_file(jpg, NULL); /* the decoded pixels, profile not applied */
        size_t nb = 0;
        void *raw = im ? vips_image_write_to_memory(im, &nb) : NULL;
        if (CHECK(raw && nb == sizeof px) && CHECK(load(jpg, W, H, got) == 0)) {
            cmsDoTransform(t, raw, want, W * H);
            int worst = worst_diff(got, want, W * H * 3);
            printf("perceptual-only JPEG: largest difference to lcms on its decoded pixels %d levels\n", worst);
            CHECK(worst <= 2);
        }
        g_free(raw);
        if (im) g_object_unref(im);
    }
    cmsDeleteTransform(t);
    unlink(png);
    unlink(jpg);
}

/* Loads path at its own size (no resize, no crop). */
static int load(const char *path, int w, int h, unsigned char *out)
{
    sd_image_src src = {.path = path, .size = SD_IMAGE_WHOLE_FILE};
    sd_image_plan plan = {.resize_w = w, .resize_h = h, .crop_r = w, .crop_b = h};
    sd_error err = {0};
    sd_status st = sd_image_load_rgb8(&src, &plan, out, &err);
    if (st) fprintf(stderr, "  %s\n", err.msg);
    return st;
}

/* Loads path resized to rw x rh (no crop). */
static int load_at(const char *path, int rw, int rh, unsigned char *out)
{
    sd_image_src src = {.path = path, .size = SD_IMAGE_WHOLE_FILE};
    sd_image_plan plan = {.resize_w = rw, .resize_h = rh, .crop_r = rw, .crop_b = rh};
    sd_error err = {0};
    sd_status st = sd_image_load_rgb8(&src, &plan, out, &err);
    if (st) fprintf(stderr, "  %s\n", err.msg);
    return st;
}

static void test_end_to_end(void)
{
    enum { W = 40, H = 24 };
    unsigned char px[W * H * 3], got[W * H * 3], want[W * H * 3];
    for (int i = 0; i < W * H; i++) {
        px[3 * i] = (unsigned char)(i * 7);
        px[3 * i + 1] = (unsigned char)(255 - i * 3);
        px[3 * i + 2] = (unsigned char)(i * 13 + 40);
    }
    char path[] = "/tmp/sdtk-icc-XXXXXX";
    int fd = mkstemp(path);
    if (!CHECK(fd >= 0)) return;
    close(fd);
    char png[64];
    snprintf(png, sizeof png, "%s.png", path);
    /* Adobe RGB: moved to sRGB as lcms maps it */
    if (CHECK(write_png(png, px, W, H, rgb_profile(adobe_xy, cmsBuildGamma(NULL, 563.0 / 256.0))) == 0) &&
        CHECK(load(png, W, H, got) == 0)) {
        cmsHPROFILE a = rgb_profile(adobe_xy, cmsBuildGamma(NULL, 563.0 / 256.0)), s = cmsCreate_sRGBProfile();
        cmsHTRANSFORM t = cmsCreateTransform(a, TYPE_RGB_8, s, TYPE_RGB_8, INTENT_RELATIVE_COLORIMETRIC, 0);
        cmsDoTransform(t, px, want, W * H);
        cmsDeleteTransform(t);
        cmsCloseProfile(a);
        cmsCloseProfile(s);
        int worst = 0, moved = 0;
        for (int i = 0; i < W * H * 3; i++) {
            int d = abs((int)got[i] - (int)want[i]);
            worst = d > worst ? d : worst;
            moved += got[i] != px[i];
        }
        printf("Adobe RGB PNG: largest difference to lcms' own transform %d levels, %d of %d values moved\n", worst,
               moved, W * H * 3);
        CHECK(worst <= 2 && moved > W * H);
    }
    /* sRGB: untouched */
    if (CHECK(write_png(png, px, W, H, rgb_profile(srgb_xy, srgb_table())) == 0) && CHECK(load(png, W, H, got) == 0))
        CHECK(memcmp(got, px, sizeof px) == 0);
    unlink(png);
    test_alpha_and_jpeg(path);
    test_perceptual_only(path);
    unlink(path);
}

int main(void)
{
    sd_error err = {0};
    if (sd_image_init(&err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_verdicts();
    test_end_to_end();
    sd_image_shutdown();
    return check_done("test_icc");
}
