/* The VAE decoder against diffusers (tests/golden/vae/sd, made by
 * tests/golden/make_vae_golden.py): vae.decode(z / scaling_factor) of the
 * SD-shaped tiny AutoencoderKL, loaded from its diffusers folder (decoder
 * in fp16 beside an fp32 encoder, config.json) and from its single-file ldm
 * checkpoint (config inferred from the decoder's shapes), within 1e-4;
 * the 8-bit images within one level; bit-identical for 1 and 3 threads,
 * alone or in a batch and through the host runner; diffusers' 8-bit
 * conversion; clear errors for a file
 * without a decoder and bad latent sizes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "safetensors.h"
#include "vae_decode.h"

#ifndef GOLDEN_DIR
#define GOLDEN_DIR "tests/golden/vae"
#endif

/* Largest absolute difference between a and the golden fp32 tensor b. */
static double max_err(const float *a, const sd_st_tensor *b)
{
    const float *e = b->data;
    size_t n = b->nbytes / 4;
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)e[i]);
        if (!(d <= m)) m = d; /* NaN propagates as a failure */
    }
    return m;
}

/* Decode n latents of z with d on `threads` threads into img. */
static int decode(const sd_vae_decoder *d, int threads, int n, int lh, int lw, const float *z, float *img)
{
    sd_error err = {0};
    sd_pool *pool = threads > 1 ? sd_pool_create(threads) : NULL;
    float *ws = malloc(sd_vae_decode_workspace_floats(d, lh, lw) * sizeof(float));
    int ok = ws && sd_vae_decode(d, sd_backend_cpu(), pool, n, lh, lw, z, img, ws, &err) == SD_OK;
    if (!ok) fprintf(stderr, "decode: %s\n", err.msg);
    free(ws);
    if (pool) sd_pool_destroy(pool);
    return ok;
}

/* Load `path`, check its config and its decode of the golden latents;
 * with `more`, determinism and the runner too. */
static void check_model(const char *label, const char *path, const sd_vae_opts *opts, const sd_st_tensor *z,
                        const sd_st_tensor *want, int more)
{
    sd_vae_decoder d;
    sd_error err = {0};
    if (!CHECK(sd_vae_decoder_load(&d, path, opts, &err) == SD_OK)) {
        fprintf(stderr, "%s: %s\n", label, err.msg);
        return;
    }
    const sd_vae_config *c = &d.cfg;
    CHECK(c->nblocks == 4 && c->block_out[0] == 8 && c->block_out[3] == 32 && c->layers_per_block == 2);
    CHECK(c->latent_channels == 4 && c->out_channels == 3 && c->use_post_quant_conv && c->mid_attention);
    CHECK(fabs(c->scaling_factor - 0.18215) < 1e-12);
    int n = (int)z->shape[0], lh = (int)z->shape[2], lw = (int)z->shape[3], h, w;
    sd_vae_decoded_size(c, lh, lw, &h, &w);
    CHECK(h == (int)want->shape[2] && w == (int)want->shape[3]);
    size_t px = (size_t)3 * (size_t)h * (size_t)w, np = (size_t)n * px;
    size_t lat = (size_t)4 * (size_t)lh * (size_t)lw;
    float *img = calloc(np, sizeof(float)), *img2 = calloc(np, sizeof(float));
    if (CHECK(img && img2) && CHECK(decode(&d, 1, n, lh, lw, z->data, img))) {
        double e = max_err(img, want);
        printf("%-24s layout %-28s max err %.2e\n", label, d.layout, e);
        CHECK(e <= 1e-4);
        /* the 8-bit pictures: within one level everywhere */
        uint8_t *a8 = malloc(np), *b8 = malloc(np);
        if (CHECK(a8 && b8)) {
            sd_vae_image_to_rgb8(n, h, w, img, a8);
            sd_vae_image_to_rgb8(n, h, w, want->data, b8);
            size_t off = 0;
            for (size_t i = 0; i < np; i++) off += abs((int)a8[i] - (int)b8[i]) > 1;
            CHECK(off == 0);
        }
        free(a8);
        free(b8);
        if (more) {
            CHECK(decode(&d, 3, n, lh, lw, z->data, img2));
            CHECK(memcmp(img, img2, np * sizeof(float)) == 0);
            /* the second image alone gives the bytes it gave in the batch */
            CHECK(decode(&d, 2, 1, lh, lw, (const float *)z->data + lat, img2));
            CHECK(memcmp(img + px, img2, px * sizeof(float)) == 0);
            sd_vae_decode_runner r;
            if (CHECK(sd_vae_decode_runner_init(&r, &d, sd_backend_cpu(), NULL, &err) == SD_OK)) {
                memset(img2, 0, np * sizeof(float));
                CHECK(sd_vae_decode_runner_decode(&r, &d, n, lh, lw, z->data, img2, &err) == SD_OK);
                CHECK(memcmp(img, img2, np * sizeof(float)) == 0);
                CHECK(sd_vae_decode_runner_decode(&r, &d, n, 0, lw, z->data, img2, &err) == SD_EINVAL);
                CHECK(strstr(err.msg, "latent size") != NULL);
                sd_vae_decode_runner_free(&r);
                sd_vae_decode_runner_free(&r); /* twice is harmless */
            }
        }
    }
    free(img);
    free(img2);
    sd_vae_decoder_free(&d);
}

/* diffusers' postprocess: (x / 2 + 0.5) clamped, * 255, round half to
 * even; NaN as 0; planes interleaved. */
static void check_rgb8(void)
{
    /* one 1x3 image: R = {-1, 0, 1}, G = {2, -3, NaN}, B = {x: 0.5 level, 1.5 levels, 0.2} */
    float half = (float)(1.0 / 255.0) - 1.0f, three = (float)(3.0 / 255.0) - 1.0f;
    float img[9] = {-1.0f, 0.0f, 1.0f, 2.0f, -3.0f, NAN, half, three, 0.2f};
    uint8_t rgb[9];
    sd_vae_image_to_rgb8(1, 1, 3, img, rgb);
    float v = (0.2f / 2.0f + 0.5f) * 255.0f; /* 153.0 in fp32 */
    CHECK(rgb[0] == 0 && rgb[3] == 128 && rgb[6] == 255);
    CHECK(rgb[1] == 255 && rgb[4] == 0 && rgb[7] == 0);
    CHECK(rgb[2] == (uint8_t)nearbyintf((half / 2.0f + 0.5f) * 255.0f));
    CHECK(rgb[5] == (uint8_t)nearbyintf((three / 2.0f + 0.5f) * 255.0f));
    CHECK(rgb[8] == (uint8_t)nearbyintf(v) && rgb[8] == 153);
}

/* A file without a decoder, bad latent sizes. */
static void check_errors(void)
{
    sd_vae_decoder d;
    sd_error err = {0};
    CHECK(sd_vae_decoder_load(&d, GOLDEN_DIR "/sdxl/vae", NULL, &err) == SD_EFORMAT);
    CHECK(strstr(err.msg, "no VAE decoder") != NULL && strstr(err.msg, "diffusion_pytorch_model") != NULL);
    CHECK(sd_vae_decoder_load(&d, GOLDEN_DIR "/missing", NULL, &err) != SD_OK);
    if (!CHECK(sd_vae_decoder_load(&d, GOLDEN_DIR "/sd/vae", NULL, &err) == SD_OK)) return;
    float z[4] = {0}, img[3 * 64] = {0}, ws[1];
    CHECK(sd_vae_decode(&d, sd_backend_cpu(), NULL, 0, 1, 1, z, img, ws, &err) == SD_EINVAL);
    CHECK(sd_vae_decode(&d, sd_backend_cpu(), NULL, 1, 1, -2, z, img, ws, &err) == SD_EINVAL);
    CHECK(sd_vae_decode(&d, sd_backend_cpu(), NULL, 1, 9000, 1, z, img, ws, &err) == SD_EINVAL);
    CHECK(strstr(err.msg, "9000") != NULL);
    sd_vae_decoder_free(&d);
}

int main(void)
{
    sd_safetensors *st = NULL;
    sd_error err = {0};
    if (!CHECK(sd_st_open(&st, GOLDEN_DIR "/sd/expected.safetensors", &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return check_done("test_vae_decode");
    }
    const sd_st_tensor *z = sd_st_find(st, "z"), *want = sd_st_find(st, "decoded");
    if (CHECK(z && want && z->ndim == 4 && want->ndim == 4)) {
        sd_vae_opts groups = {.groups = 4}; /* not in the weights; the tiny VAE's */
        check_model("sd folder", GOLDEN_DIR "/sd", NULL, z, want, 1);
        check_model("sd single file (fp16)", GOLDEN_DIR "/sd/single.safetensors", &groups, z, want, 0);
    }
    sd_st_close(st);
    check_rgb8();
    check_errors();
    return check_done("test_vae_decode");
}
