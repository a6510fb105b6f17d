/* The CLIP BPE tokenizer (SD1/SD2/SDXL text encoders), matching transformers'
 * CLIPTokenizer with ftfy installed: vocab.json + merges.txt from a diffusers
 * tokenizer/ or tokenizer_2/ folder, text cleanup, the pre-split pattern with
 * Unicode classes, byte-level BPE with </w>, BOS/EOS, padding, truncation and
 * kohya's 75-token chunking. See docs/TOKENIZER.md. */
#ifndef SDTK_CLIP_TOK_H
#define SDTK_CLIP_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

enum { SD_CLIP_CTX = 77 }; /* BOS + 75 tokens + EOS */

/* Loaded once, then read by any number of threads. */
typedef struct sd_clip_tok sd_clip_tok;
/* One per thread: scratch buffers and a per-word BPE cache. */
typedef struct sd_clip_work sd_clip_work;

typedef struct {
    int32_t *ids;
    size_t n, cap;
    size_t replaced; /* invalid UTF-8 sequences replaced by U+FFFD in the last encode */
} sd_clip_ids;

sd_status sd_clip_tok_load(const char *dir, sd_clip_tok **out, sd_error *err);
sd_status sd_clip_tok_load_model(const char *model_dir, int which, sd_clip_tok **out, sd_error *err);
void sd_clip_tok_free(sd_clip_tok *t);
int32_t sd_clip_tok_bos(const sd_clip_tok *t);
int32_t sd_clip_tok_eos(const sd_clip_tok *t);
int32_t sd_clip_tok_pad(const sd_clip_tok *t);
/* A 64-bit identity of what decides the ids (vocabulary, merges, padding). */
uint64_t sd_clip_tok_identity(const sd_clip_tok *t);
sd_status sd_clip_tok_set_pad_token(sd_clip_tok *t, const char *token, sd_error *err);
void sd_clip_tok_set_pad_id(sd_clip_tok *t, int32_t id);
int32_t sd_clip_tok_id(const sd_clip_tok *t, const char *token);

sd_clip_work *sd_clip_work_new(void);
void sd_clip_work_free(sd_clip_work *w);
void sd_clip_ids_free(sd_clip_ids *ids);
sd_status sd_clip_encode(const sd_clip_tok *t, sd_clip_work *w, const char *text, size_t len, sd_clip_ids *out,
                         sd_error *err);

void sd_clip_pad_ids(const int32_t *ids, size_t n, int32_t pad, size_t max_len, int32_t *out);
size_t sd_clip_kohya_chunks(const int32_t *ids, size_t n, int32_t eos, int32_t pad, int max_tokens, int32_t *out);

#endif
