/* Fuzz target for tokenizer.json (libcore/models/clip_tok_load.c): what
 * transformers 5 saves as a CLIP tokenizer, read when a folder has no
 * vocab.json. The input is the file; it is written into a private temp
 * folder and loaded as a tokenizer folder. Checked: the load succeeds or
 * fails with an error, never anything else; a loaded tokenizer encodes a
 * caption into BOS ... EOS with ids the vocabulary holds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clip_tok.h"
#include "fuzz.h"

/* The temp folder, made on the first input and removed at exit. */
static char dir[64];
static char file[96];

/* Remove the file and the folder. */
static void cleanup(void)
{
    remove(file);
    remove(dir);
}

/* Make the folder once; abort when that fails, so a run cannot pass by
 * testing nothing. */
static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/sdtk_fuzz_tokjson_XXXXXX");
    if (!mkdtemp(dir)) abort();
    snprintf(file, sizeof file, "%s/tokenizer.json", dir);
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) setup();
    FILE *f = fopen(file, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size)) abort();
    fclose(f);
    sd_clip_tok *t = NULL;
    sd_error err = {0};
    sd_status st = sd_clip_tok_load(dir, &t, &err);
    if (st != SD_OK) {
        if (t || !err.msg[0]) abort();
        return 0;
    }
    int32_t bos = sd_clip_tok_bos(t), eos = sd_clip_tok_eos(t);
    if (!t || bos < 0 || eos < 0) abort();
    sd_clip_work *w = sd_clip_work_new();
    sd_clip_ids ids = {0};
    static const char caption[] = "a photo of a cat, &amp; \xe2\x80\x9c" "curly\xe2\x80\x9d!";
    if (!w || sd_clip_encode(t, w, caption, sizeof caption - 1, &ids, &err) != SD_OK) abort();
    if (ids.n < 2 || ids.ids[0] != bos || ids.ids[ids.n - 1] != eos) abort();
    for (size_t i = 0; i < ids.n; i++)
        if (ids.ids[i] < 0) abort();
    (void)sd_clip_tok_identity(t);
    sd_clip_ids_free(&ids);
    sd_clip_work_free(w);
    sd_clip_tok_free(t);
    return 0;
}
