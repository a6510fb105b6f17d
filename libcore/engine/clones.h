/* SD_CLONES: build a loop function twice, for AVX2 and for any x86-64, and
 * let the loader pick one per machine (GCC's target_clones; nothing
 * elsewhere). The build is ISO C11, so floating-point contraction stays off
 * in both clones and they give the same bits: only the vector width
 * differs, never the order of operations written in the source. */
#ifndef SDTK_CLONES_H
#define SDTK_CLONES_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SD_CLONES
#endif

#endif
