/* xoshiro256** with splitmix64 seeding, and the draws the trainer needs. */
#include "rng.h"

#include <math.h>

#include "hash.h"

/* Seeding through splitmix64, which spreads a seed over the state words:
 * the state must not be all zeros, which splitmix64 never gives for all
 * four words. */
void sd_rng_seed(sd_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = sd_splitmix64(&seed);
}

/* Rotate left, for the generator's scrambler. */
static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* The next 64 random bits (xoshiro256**). */
uint64_t sd_rng_next(sd_rng *r)
{
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* 53 random bits as a double in [0, 1). */
double sd_rng_uniform(sd_rng *r)
{
    return (double)(sd_rng_next(r) >> 11) * 0x1p-53;
}

/* Rejection sampling on the top of the 64-bit range keeps it unbiased. */
uint64_t sd_rng_below(sd_rng *r, uint64_t n)
{
    if (n <= 1) return 0;
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    for (;;) {
        uint64_t x = sd_rng_next(r);
        if (x < limit) return x % n;
    }
}

/* Box-Muller: two uniforms give two normals; 1 - u keeps the log finite. */
void sd_rng_normal(sd_rng *r, float *out, size_t n)
{
    for (size_t i = 0; i < n; i += 2) {
        double u1 = 1.0 - sd_rng_uniform(r), u2 = sd_rng_uniform(r);
        double rad = sqrt(-2.0 * log(u1)), th = 2.0 * 3.14159265358979323846 * u2;
        out[i] = (float)(rad * cos(th));
        if (i + 1 < n) out[i + 1] = (float)(rad * sin(th));
    }
}
