/* Inside the CLIP tokenizer: the loaded tables shared by clip_tok_load.c and
 * clip_tok.c. */
#ifndef SDTK_CLIP_TOK_INT_H
#define SDTK_CLIP_TOK_INT_H

#include <stdint.h>

#include "clip_tok.h"
#include "strmap.h"

enum { SD_CLIP_MAX_MERGES = 49152 - 256 - 2 }; /* transformers reads no more */

typedef struct {
    uint64_t key; /* left id << 32 | right id */
    int32_t rank; /* -1: empty slot */
    int32_t merged;
} sd_clip_pair;

struct sd_clip_tok {
    sd_strmap vocab; /* token text -> id (nval) */
    sd_clip_pair *pairs;
    size_t pair_mask;
    int32_t nmerges;
    int32_t byte_id[256], byte_eow_id[256];
    int32_t bos, eos, pad;
    char pad_text[64]; /* pad token the text is split on (from_pretrained), "" when it is EOS */
    uint64_t vocab_digest;  /* of the (token, id) entries, in any order (sd_clip_tok_identity) */
    uint64_t merges_digest; /* of the merges' id pairs in rank order */
};

int32_t sd_clip_tok_lookup(const sd_clip_tok *t, const char *s, size_t n);

/* Home slot of a pair key (a multiplicative hash; inline, BPE asks often). */
static inline size_t sd_clip_pair_slot(uint64_t key, size_t mask)
{
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & mask;
}

#endif
