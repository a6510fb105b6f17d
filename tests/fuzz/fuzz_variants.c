/* Fuzz target for sd-meta's caption variants (formats/variants.c): the
 * input's first byte sets the options (K, shuffle, keep_tokens, dropout),
 * the rest is a caption whose lines are the base captions: any bytes
 * (wildcards nested, unclosed or empty, lone braces, commas only) must
 * give at most K distinct non-empty variants, the same ones twice. */
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "buf.h"
#include "fuzz.h"
#include "variants.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    sd_variant_opts o = {1 + data[0] % 16, data[0] & 16, (data[0] >> 5) & 3, (data[0] & 128) ? 0.3 : 0, 7};
    char *text = malloc(size);
    if (!text) abort();
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    const char *bases[64];
    int nb = 0;
    for (char *p = text; nb < 64;) {
        bases[nb++] = p;
        char *nl = strchr(p, '\n');
        if (!nl) break;
        *nl = 0;
        p = nl + 1;
    }
    sd_arena a;
    sd_arena_init(&a, 1 << 16);
    sd_buf sc[2];
    sd_buf_init(&sc[0]);
    sd_buf_init(&sc[1]);
    const char *out[SD_VARIANTS_MAX], *again[SD_VARIANTS_MAX];
    int unclosed = 0, unclosed2 = 0;
    int n = sd_caption_variants(&o, "key", bases, nb, &a, sc, out, &unclosed);
    int m = sd_caption_variants(&o, "key", bases, nb, &a, sc, again, &unclosed2);
    if (n < 0 || n > o.k || n != m || unclosed != unclosed2) abort();
    for (int i = 0; i < n; i++) {
        if (!out[i][0] || strcmp(out[i], again[i]) != 0) abort();
        for (int j = 0; j < i; j++)
            if (!strcmp(out[i], out[j])) abort();
    }
    /* a wildcard needs a '{' and a '|' (the scan itself runs under the sanitizers) */
    for (int i = 0; i < nb; i++)
        if (sd_caption_has_wildcard(bases[i]) && (!strchr(bases[i], '{') || !strchr(bases[i], '|'))) abort();
    sd_buf_free(&sc[0]);
    sd_buf_free(&sc[1]);
    sd_arena_free(&a);
    free(text);
    return 0;
}
