/* sd-latents --text: the text-embedding cache (latents_text.c). */
#ifndef SDTK_LATENTS_TEXT_H
#define SDTK_LATENTS_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "buf.h"
#include "clip_text.h"
#include "clip_tok.h"
#include "err.h"
#include "shard.h"

typedef enum { TEXT_SD1 = 1, TEXT_SD2 = 2, TEXT_SDXL = 3 } text_variant;

typedef struct {
    text_variant variant;
    int n; /* encoders: 1, or 2 for SDXL */
    sd_clip_text enc[2];
    int loaded[2];
    sd_clip_tok *tok[2];
    sd_clip_text_out out[2];
    sd_clip_work *work;
    sd_clip_ids ids;
    int dtype, clip_skip;
    int max_tokens, nchunk, rows; /* --max-tokens (75/150/225), its 77-token chunks, joined rows (77/152/227) */
    char ident[168]; /* encoder identity hashed into every text key */
    sd_clip_text_runner run[2]; /* each encoder on its device (text_device) */
    float *hidden, *pooled;      /* host copies of the outputs, chunks joined */
    size_t hidden_cap, pooled_cap;
    float *raw, *rawpool; /* the encoder's outputs per chunk, before the join */
    size_t raw_cap, rawpool_cap;
    unsigned char *conv;
    size_t conv_cap;
    /* statistics */
    uint64_t total, encoded, reused, invalid_utf8;
    uint64_t cut; /* captions encoded with more tokens than --max-tokens keeps (the rest dropped) */
    size_t record_bytes;
    double seconds;
} text_cache;

/* wdtype: SD_DT_F16 / SD_DT_BF16 holds the encoders' layer matrices in 16
 * bits (CPU only); anything else keeps fp32. max_tokens: 75, 150 or 225
 * (sd-scripts' --max_token_length; 75 is the plain 77-token encoding). */
sd_status text_open(text_cache *t, const char *model, const char *tok_dir, int clip_skip, int max_tokens, int dtype,
                    int wdtype, const char *numerics, sd_error *err);
sd_status text_device(text_cache *t, const sd_backend *be, void *exec, sd_error *err);
void text_close(text_cache *t);
void text_key(const text_cache *t, const char *caption, size_t len, uint8_t key[16]);
/* Put the text record of caption under key unless the shard holds it. */
sd_status text_put(text_cache *t, sd_shard *s, const char *caption, size_t len, const uint8_t key[16], sd_buf *rec,
                   sd_error *err);
/* The same for a list (a batch's captions): the missing ones are encoded
 * together, several per pass through the model on the CPU; the same
 * records and counts as text_put on each in turn. */
sd_status text_put_many(text_cache *t, sd_shard *s, size_t count, const char *const *captions, const size_t *lens,
                        const uint8_t *const *keys, sd_buf *rec, sd_error *err);

/* Whether the shard's empty caption's embedding (meta empty_text and its
 * record) must be written again: *lost 0 no, 1 the meta names another key
 * or none, 2 the meta names it but the record is gone. */
sd_status text_empty_lost(sd_shard *shard, const uint8_t empty_key[16], int *lost, sd_error *err);

#endif
