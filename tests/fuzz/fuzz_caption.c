/* Fuzz target for captions through the CLIP tokenizer (clip_clean, the
 * pre-split pattern, byte-level BPE): captions come from any booru dump or
 * caption file, so any bytes must tokenize. The input is one caption; the
 * tokenizer is the real CLIP vocabulary, read from the directory in
 * SDTK_FUZZ_CLIP_DIR (vocab.json + merges.txt; tests/fuzz/fuzz_caption.sh
 * unpacks tests/golden/tokenizer there). Checked: encoding succeeds, starts
 * with BOS and ends with EOS, every id is in the vocabulary, a second
 * encoding (the BPE cache now warm) gives the same ids, and padding and
 * kohya's 75/150/225-token chunking keep BOS first and stay in range. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clip_tok.h"
#include "fuzz.h"

/* The tokenizer and a work area, loaded on the first input. */
static sd_clip_tok *tok;
static sd_clip_work *work;
static int32_t vocab_n;

/* Load the tokenizer once; abort when the directory is missing, so a
 * misconfigured run cannot pass by testing nothing. */
static void setup(void)
{
    const char *dir = getenv("SDTK_FUZZ_CLIP_DIR");
    sd_error err = {0};
    if (!dir || sd_clip_tok_load(dir, &tok, &err) != SD_OK) {
        fprintf(stderr, "fuzz_caption: set SDTK_FUZZ_CLIP_DIR to a folder with vocab.json and merges.txt (%s)\n",
                dir ? err.msg : "unset");
        abort();
    }
    work = sd_clip_work_new();
    if (!work) abort();
    int32_t a = sd_clip_tok_bos(tok), b = sd_clip_tok_eos(tok);
    vocab_n = (a > b ? a : b) + 1; /* CLIP's specials are its last two ids */
}

/* Every id in [0, vocab_n). */
static void check_range(const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab_n) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!tok) setup();
    sd_clip_ids a = {0}, b = {0};
    sd_error err = {0};
    if (sd_clip_encode(tok, work, (const char *)data, size, &a, &err) != SD_OK) abort();
    if (a.n < 2 || a.ids[0] != sd_clip_tok_bos(tok) || a.ids[a.n - 1] != sd_clip_tok_eos(tok)) abort();
    check_range(a.ids, a.n);
    if (sd_clip_encode(tok, work, (const char *)data, size, &b, &err) != SD_OK) abort();
    if (b.n != a.n || memcmp(a.ids, b.ids, a.n * sizeof *a.ids) != 0) abort();
    int32_t pad[SD_CLIP_CTX], chunks[3 * SD_CLIP_CTX];
    sd_clip_pad_ids(a.ids, a.n, sd_clip_tok_pad(tok), SD_CLIP_CTX, pad);
    if (pad[0] != sd_clip_tok_bos(tok)) abort();
    check_range(pad, SD_CLIP_CTX);
    for (int m = 75; m <= 225; m += 75) {
        size_t k = sd_clip_kohya_chunks(a.ids, a.n, sd_clip_tok_eos(tok), sd_clip_tok_pad(tok), m, chunks);
        if (k != (size_t)m / 75) abort();
        for (size_t c = 0; c < k; c++)
            if (chunks[c * SD_CLIP_CTX] != sd_clip_tok_bos(tok)) abort();
        check_range(chunks, k * SD_CLIP_CTX);
    }
    sd_clip_ids_free(&a);
    sd_clip_ids_free(&b);
    return 0;
}
