/* The one entry point every fuzz target defines: libFuzzer calls it with
 * mutated inputs, and fuzz_main.c replays saved inputs through it so the
 * corpus and crash reproducers also run in the ordinary test suite. */
#ifndef SDTK_FUZZ_H
#define SDTK_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
