/* CLIP tokenizer throughput on one core: bench_tokenizer DIR CAPTIONS.txt
 * REPEAT (DIR holds vocab.json + merges.txt; one caption per line). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "clip_tok.h"
#include "progress.h"
#include "slurp.h"

int main(int argc, char **argv)
{
    if (argc < 4) return fprintf(stderr, "usage: bench_tokenizer DIR CAPTIONS REPEAT\n"), 2;
    sd_clip_tok *t;
    sd_error err;
    sd_buf text;
    sd_buf_init(&text);
    if (sd_clip_tok_load(argv[1], &t, &err) || sd_read_file(argv[2], &text, &err))
        return fprintf(stderr, "%s\n", err.msg), 1;
    int repeat = atoi(argv[3]);
    sd_clip_work *w = sd_clip_work_new();
    sd_clip_ids ids = {0};
    size_t n = 0, tokens = 0;
    double t0 = sd_now();
    for (int r = 0; r < repeat; r++)
        for (char *p = text.data, *end = text.data + text.len; p < end;) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
            if (sd_clip_encode(t, w, p, len, &ids, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
            tokens += ids.n;
            n++;
            p += len + 1;
        }
    double dt = sd_now() - t0;
    printf("sdtk: %zu captions in %.3f s: %.0f captions/s (%zu ids)\n", n, dt, n / dt, tokens);
    sd_clip_ids_free(&ids);
    sd_clip_work_free(w);
    sd_clip_tok_free(t);
    sd_buf_free(&text);
    return 0;
}
