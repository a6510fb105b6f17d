/* sd-selftest: the deterministic inputs of the op cases, the AdamW check and
 * the probe (the same values on every machine, so the same errors). */
#include <stdint.h>

#include "selftest.h"

/* Deterministic uniform values in [lo, hi) from a per-buffer seed. */
void selftest_fill(float *p, size_t n, uint64_t seed, float lo, float hi)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[i] = lo + (hi - lo) * (float)(s >> 40) / 16777216.0f;
    }
}

/* Token ids in [0, vocab) stored in a float-sized slot. */
void selftest_fill_ids(float *p, size_t n, uint64_t seed, int vocab)
{
    int32_t *ids = (int32_t *)(void *)p;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ids[i] = (int32_t)((s >> 33) % (uint64_t)vocab);
    }
}
