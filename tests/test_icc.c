/* Embedded ICC profiles in the image pipeline: sd_icc_is_srgb takes sRGB
 * profiles (lcms' own, and one with a 1024-entry tabulated sRGB curve as
 * the common IEC61966-2.1 file has) as the identity and nothing else (Adobe
 * RGB, Display P3, a 2.2 gamma, grey, garbage, truncated); end to end, a
 * PNG tagged Adobe RGB is still moved to sRGB (its pixels as lcms maps
 * them, to within the rounding of libvips' path through Lab), and the same
 * PNG tagged sRGB loads with its pixels untouched. */
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

/* A w x h RGB PNG of px tagged with the profile p (closed after). */
static int write_png(const char *path, const unsigned char *px, int w, int h, cmsHPROFILE p)
{
    cmsUInt32Number n;
    unsigned char *icc = profile_bytes(p, &n);
    cmsCloseProfile(p);
    VipsImage *im = vips_image_new_from_memory(px, (size_t)w * h * 3, w, h, 3, VIPS_FORMAT_UCHAR);
    int rc = icc && im ? 0 : -1;
    if (!rc) {
        vips_image_set_blob_copy(im, VIPS_META_ICC_NAME, icc, n);
        rc = vips_pngsave(im, path, NULL);
    }
    if (im) g_object_unref(im);
    free(icc);
    return rc;
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
