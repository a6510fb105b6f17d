/* Content hashes (XXH3, from libxxhash) used for record keys, caption
 * de-duplication, deterministic shuffles and splits. */
#ifndef SDTK_HASH_H
#define SDTK_HASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t sd_hash64(const void *data, size_t len, uint64_t seed);
uint64_t sd_mix64(uint64_t x);
/* One step of the splitmix64 generator: the next value of the stream whose
 * state is *state (advanced). The same stream on every machine. */
uint64_t sd_splitmix64(uint64_t *state);
double sd_hash_unit(uint64_t h);

#endif
