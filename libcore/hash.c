#include "hash.h"

#include <xxhash.h>

/* 64-bit XXH3 with a seed, the workhorse for keys and deterministic choices. */
uint64_t sd_hash64(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

/* 128-bit XXH3 as 32 lowercase hex digits, for content keys that must not collide. */
void sd_hash128_hex(const void *data, size_t len, char out[33])
{
    XXH128_hash_t h = XXH3_128bits(data, len);
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        uint64_t w = i < 8 ? h.high64 : h.low64;
        int sh = (7 - (i & 7)) * 8;
        unsigned b = (unsigned)(w >> sh) & 0xffu;
        out[2 * i] = hx[b >> 4];
        out[2 * i + 1] = hx[b & 15];
    }
    out[32] = 0;
}

/* A 64-bit hash as 16 hex digits. */
void sd_hash64_hex(uint64_t h, char out[17])
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--) {
        out[i] = hx[h & 15];
        h >>= 4;
    }
    out[16] = 0;
}

/* splitmix64 finaliser: a cheap stateless PRNG step for seeded shuffles. */
uint64_t sd_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Map a hash to [0,1) using its top 53 bits, for fraction tests. */
double sd_hash_unit(uint64_t h)
{
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}
