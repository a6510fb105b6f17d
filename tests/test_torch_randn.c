/* torch's CPU randn stream against torch (tests/golden/randn, made by
 * tests/golden/make_randn_golden.py): four seeds (one above 2^32), each a
 * sequence of draws below and above 16 values and not multiples of 16 from
 * one generator, and an SD-shaped latent draw: bit-identical to torch on
 * x86 (the file was made on an AVX-512 CPU, where torch runs its AVX2
 * kernel). Then the sampler's noise callback continues the stream. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "safetensors.h"
#include "torch_randn.h"

#ifndef GOLDEN_DIR
#define GOLDEN_DIR "tests/golden/randn"
#endif

static const size_t sizes[] = {3, 1, 16, 17, 5, 40, 256, 1000, 2};

/* Compare got[n] with the golden values; print and check. */
static void compare(const char *label, const float *got, const float *want, size_t n)
{
    size_t same = 0;
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        same += memcmp(&got[i], &want[i], sizeof(float)) == 0;
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= e)) e = d;
    }
    printf("%-18s %zu values, %zu bit-identical, max diff %.2e\n", label, n, same, e);
    CHECK(same == n && e == 0);
}

/* One seed's sequence of draws from one generator. */
static void check_seed(const sd_safetensors *st, uint64_t seed)
{
    char key[64];
    snprintf(key, sizeof key, "seed%llu", (unsigned long long)seed);
    const sd_st_tensor *t = sd_st_find(st, key);
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) total += sizes[i];
    if (!CHECK(t && t->nbytes == total * sizeof(float))) return;
    float *got = malloc(total * sizeof(float));
    if (!CHECK(got)) return;
    sd_torch_gen g;
    sd_torch_gen_seed(&g, seed);
    size_t at = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        sd_torch_randn(&g, got + at, sizes[i]);
        at += sizes[i];
    }
    compare(key, got, t->data, total);
    free(got);
}

int main(void)
{
    sd_safetensors *st = NULL;
    sd_error err = {0};
    if (!CHECK(sd_st_open(&st, GOLDEN_DIR "/expected.safetensors", &err) == SD_OK)) {
        fprintf(stderr, "%s\n", err.msg);
        return check_done("test_torch_randn");
    }
    check_seed(st, 0);
    check_seed(st, 42);
    check_seed(st, (1ull << 32) + 7);
    check_seed(st, 123456789);
    const sd_st_tensor *lat = sd_st_find(st, "sd_latents");
    if (CHECK(lat)) {
        size_t n = lat->nbytes / 4;
        float *got = malloc(n * sizeof(float)), *more = malloc(n * sizeof(float));
        sd_torch_gen g, h;
        sd_torch_gen_seed(&g, 1234);
        if (CHECK(got && more)) {
            sd_torch_randn(&g, got, n);
            compare("sd_latents", got, lat->data, n);
            /* the noise callback is the same stream continued */
            sd_torch_gen_seed(&h, 1234);
            sd_torch_randn(&h, more, n);
            CHECK(sd_torch_randn_noise(&g, got, 100, &err) == SD_OK);
            sd_torch_randn(&h, more, 100);
            CHECK(memcmp(got, more, 100 * sizeof(float)) == 0);
        }
        free(got);
        free(more);
    }
    sd_st_close(st);
    return check_done("test_torch_randn");
}
