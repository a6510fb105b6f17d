/* Caption variants (sd-meta --caption-variants K): up to K distinct
 * captions per record, made by the rules sd-scripts applies at every step
 * (process_caption): one line of a multi-line caption, wildcards {a|b|c},
 * the tokens after keep_tokens shuffled, each of them dropped at a rate.
 * Deterministic per record key and seed; the first is the canonical
 * caption (first line, each wildcard's first choice, tokens in order). */
#ifndef SDTK_VARIANTS_H
#define SDTK_VARIANTS_H

#include <stdint.h>

#include "arena.h"
#include "buf.h"

enum { SD_VARIANTS_MAX = 64 };

typedef struct {
    int k;              /* 1..SD_VARIANTS_MAX captions per record (1: no variants) */
    int shuffle;        /* shuffle the tokens after keep_tokens */
    int keep_tokens;    /* leading comma-separated tokens kept in place, never dropped */
    double tag_dropout; /* each other token dropped with this probability */
    uint64_t seed;
} sd_variant_opts;

/* Up to o->k distinct non-empty captions from the record's nb base
 * captions (its lines, rules applied) into out[] (arena strings); returns
 * how many (at least 1 when bases[0] is not empty), -1 when out of memory.
 * *unclosed is set when a base holds a '{' without its '}' (kept as a
 * literal, as sd-scripts' pattern leaves it). scratch: two buffers. */
int sd_caption_variants(const sd_variant_opts *o, const char *key, const char *const *bases, int nb, sd_arena *a,
                        sd_buf scratch[2], const char **out, int *unclosed);
/* Whether s holds a wildcard of choices, {a|b}, as sd_caption_variants
 * reads one ({{ and }} are literal braces, not wildcards). */
int sd_caption_has_wildcard(const char *s);

#endif
