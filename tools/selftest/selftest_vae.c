/* sd-selftest: the golden VAE encoded and decoded on a device against
 * diffusers' values (and the CPU), and the SD VAE architecture the probe
 * and --plan build. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "progress.h"
#include "safetensors.h"
#include "selftest.h"
#include "vae_decode.h"

/* The golden VAE's tolerance per mode: its mean and std against
 * diffusers', each normwise (selftest_tensor_error). Measured on the H100, the
 * largest absolute error over both (largest |value|: mean 2.42, std
 * 1.96): strict 2.0e-6 (runs 11, 14, 23, 25), TF32 7.3e-5 (runs 11, 14,
 * 25), bf16 3.2e-2 (runs 19, 20, 23), fp16 3.5e-3 (runs 17, 22), so at
 * most 1.0e-6, 3.7e-5, 1.6e-2, 1.8e-3 normwise; the tolerances are 6 to
 * 10 times that. The CPU itself is within 8e-7 of diffusers. */
static const double vae_tols[SELFTEST_NMODES] = {1e-5, 3e-4, 1e-1, 1.5e-2};

/* The golden VAE (diffusers folder + expected.safetensors from
 * tests/golden/make_vae_golden.py) encoded on t, judged with mode's
 * tolerance; 1 pass, 0 fail, -1 error. Also compared with the CPU. */
int selftest_check_vae(const target *t, const char *dir, int mode)
{
    char path[4096];
    sd_error err = {0};
    sd_vae v;
    snprintf(path, sizeof path, "%s/vae", dir);
    if (sd_vae_load(&v, path, NULL, &err)) {
        fprintf(stderr, "sd-selftest: golden VAE: %s\n", err.msg);
        return -1;
    }
    sd_safetensors *st = NULL;
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    const sd_st_tensor *x = NULL, *em = NULL, *es = NULL;
    if (sd_st_open(&st, path, &err) == SD_OK) {
        x = sd_st_find(st, "x");
        em = sd_st_find(st, "mean");
        es = sd_st_find(st, "std");
    }
    if (!x || !em || !es || x->ndim != 4 || em->nbytes != es->nbytes) {
        fprintf(stderr, "sd-selftest: %s: %s\n", path, st ? "no x/mean/std tensors" : err.msg);
        if (st) sd_st_close(st);
        sd_vae_free(&v);
        return -1;
    }
    int n = (int)x->shape[0], h = (int)x->shape[2], w = (int)x->shape[3];
    size_t nl = em->nbytes / sizeof(float), ws = sd_vae_workspace_floats(&v, n, h, w);
    float *m = malloc(nl * sizeof(float)), *s = malloc(nl * sizeof(float));
    float *cm = malloc(nl * sizeof(float)), *cs = malloc(nl * sizeof(float)), *cws = malloc(ws * sizeof(float));
    int rc = -1;
    sd_vae_runner r = {0};
    if (!m || !s || !cm || !cs || !cws) {
        fprintf(stderr, "sd-selftest: golden VAE: out of memory\n");
    } else {
        /* the runner: what a tool uses to encode host images on a backend */
        double t0 = sd_now();
        sd_status r1 = sd_vae_runner_init(&r, &v, t->be, t->ex, &err);
        if (!r1) r1 = sd_vae_runner_encode(&r, &v, n, h, w, x->data, m, s, &err);
        double dt = sd_now() - t0;
        sd_status r2 = r1 ? r1 : sd_vae_encode(&v, sd_backend_cpu(), NULL, n, h, w, x->data, cm, cs, cws, &err);
        if (r1 || r2) {
            fprintf(stderr, "sd-selftest: golden VAE encode: %s\n", err.msg);
        } else {
            double gm = selftest_tensor_error(m, em->data, nl), gs = selftest_tensor_error(s, es->data, nl);
            double cpu = fmax(selftest_tensor_error(m, cm, nl), selftest_tensor_error(s, cs, nl)), e = fmax(gm, gs);
            rc = e <= vae_tols[mode];
            printf("golden VAE (%s, %dx3x%dx%d, %.3f s): normwise error vs diffusers mean %.2e, std %.2e (tol %.0e), "
                   "vs CPU %.2e  %s\n",
                   dir, n, h, w, dt, gm, gs, vae_tols[mode], cpu, rc ? "pass" : "FAIL");
        }
    }
    sd_vae_runner_free(&r);
    free(m);
    free(s);
    free(cm);
    free(cs);
    free(cws);
    sd_st_close(st);
    sd_vae_free(&v);
    return rc;
}

/* The golden VAE's decoder (decode(z / scaling_factor), the "decoded"
 * tensor of expected.safetensors) run on t through the host runner,
 * judged with the encoder's tolerance for mode (not yet measured on a
 * device: the decoder is deeper, so a TF32 or 16-bit failure here wants a
 * look before a wider tolerance); 1 pass, 0 fail, -1 error. */
int selftest_check_vae_decode(const target *t, const char *dir, int mode)
{
    char path[4096];
    sd_error err = {0};
    sd_vae_decoder d;
    snprintf(path, sizeof path, "%s/vae", dir);
    if (sd_vae_decoder_load(&d, path, NULL, &err)) {
        fprintf(stderr, "sd-selftest: golden VAE decoder: %s\n", err.msg);
        return -1;
    }
    sd_safetensors *st = NULL;
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    const sd_st_tensor *z = NULL, *want = NULL;
    if (sd_st_open(&st, path, &err) == SD_OK) {
        z = sd_st_find(st, "z");
        want = sd_st_find(st, "decoded");
    }
    if (!z || !want || z->ndim != 4) {
        fprintf(stderr, "sd-selftest: %s: %s\n", path, st ? "no z/decoded tensors" : err.msg);
        sd_st_close(st);
        sd_vae_decoder_free(&d);
        return -1;
    }
    int n = (int)z->shape[0], lh = (int)z->shape[2], lw = (int)z->shape[3];
    size_t np = want->nbytes / sizeof(float);
    float *img = malloc(np * sizeof(float)), *cpu = malloc(np * sizeof(float));
    float *ws = malloc(sd_vae_decode_workspace_floats(&d, lh, lw) * sizeof(float));
    int rc = -1;
    sd_vae_decode_runner r = {0};
    if (!img || !cpu || !ws) {
        fprintf(stderr, "sd-selftest: golden VAE decoder: out of memory\n");
    } else {
        double t0 = sd_now();
        sd_status r1 = sd_vae_decode_runner_init(&r, &d, t->be, t->ex, &err);
        if (!r1) r1 = sd_vae_decode_runner_decode(&r, &d, n, lh, lw, z->data, img, &err);
        double dt = sd_now() - t0;
        sd_status r2 = r1 ? r1 : sd_vae_decode(&d, sd_backend_cpu(), NULL, n, lh, lw, z->data, cpu, ws, &err);
        if (r1 || r2) {
            fprintf(stderr, "sd-selftest: golden VAE decode: %s\n", err.msg);
        } else {
            double e = selftest_tensor_error(img, want->data, np), c = selftest_tensor_error(img, cpu, np);
            rc = e <= vae_tols[mode];
            printf("golden VAE decoder (%s, %dx4x%dx%d, %.3f s): normwise error vs diffusers %.2e (tol %.0e), vs CPU "
                   "%.2e  %s\n",
                   dir, n, lh, lw, dt, e, vae_tols[mode], c, rc ? "pass" : "FAIL");
        }
    }
    sd_vae_decode_runner_free(&r);
    free(img);
    free(cpu);
    free(ws);
    sd_st_close(st);
    sd_vae_decoder_free(&d);
    return rc;
}

/* The SD 1.x/2.x/SDXL VAE encoder architecture (they share it). */
sd_vae_config selftest_vae_arch(void)
{
    sd_vae_config c;
    memset(&c, 0, sizeof c);
    c.in_channels = 3;
    c.latent_channels = 4;
    c.nblocks = 4;
    c.block_out[0] = 128;
    c.block_out[1] = 256;
    c.block_out[2] = 512;
    c.block_out[3] = 512;
    c.layers_per_block = 2;
    c.groups = 32;
    c.use_quant_conv = 1;
    c.mid_attention = 1;
    c.eps = 1e-6f;
    c.scaling_factor = 0.18215;
    return c;
}
