/* The trainer's random numbers: one xoshiro256** stream whose whole state
 * (four words) goes into every checkpoint, so a resumed run draws exactly
 * the numbers an uninterrupted one would. Timesteps, noise, latent samples,
 * flips and conditioning dropout all come from it, in a fixed order. */
#ifndef SDTK_TRAIN_RNG_H
#define SDTK_TRAIN_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} sd_rng;

/* Seed the four words from one number (splitmix64, as xoshiro advises). */
void sd_rng_seed(sd_rng *r, uint64_t seed);
uint64_t sd_rng_next(sd_rng *r);
/* Uniform double in [0, 1) from the top 53 bits. */
double sd_rng_uniform(sd_rng *r);
/* Uniform integer in [0, n) without modulo bias. */
uint64_t sd_rng_below(sd_rng *r, uint64_t n);
/* n standard normal floats (Box-Muller on pairs of uniforms; an odd n
 * drops the last spare), so the stream position depends only on n. */
void sd_rng_normal(sd_rng *r, float *out, size_t n);

#endif
