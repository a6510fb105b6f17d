#include "hash.h"

#include <xxhash.h>

/* 64-bit XXH3 with a seed, the workhorse for keys and deterministic choices. */
uint64_t sd_hash64(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

/* splitmix64 finaliser: a cheap stateless PRNG step for seeded shuffles. */
uint64_t sd_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* splitmix64 as a stream, for the few seeded generators that need one
 * (the UNet's random init, the trainer's RNG seeding, --sample's noise):
 * the state advances by the golden-ratio step and sd_mix64 mixes it. */
uint64_t sd_splitmix64(uint64_t *state)
{
    uint64_t x = *state;
    *state += 0x9e3779b97f4a7c15ull;
    return sd_mix64(x);
}

/* Map a hash to [0,1) using its top 53 bits, for fraction tests. */
double sd_hash_unit(uint64_t h)
{
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}
