/* See fuzz_post.h. */
#include "fuzz_post.h"

#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "record.h"
#include "source.h"

/* The text is copied: the builder parses it in place. */
void fuzz_post(const char *text, size_t len, uint64_t ordinal, const sd_rules *r, int e621, const char *pattern)
{
    char *copy = malloc(len + 1);
    if (!copy) abort();
    if (len) memcpy(copy, text, len);
    copy[len] = 0;
    sd_input in;
    sd_input_init(&in, SD_IN_BOORU, "fuzz", 1);
    in.text = copy;
    in.len = len;
    in.ordinal = ordinal;
    sd_build_opts o = {pattern, "/data", 0, NULL, e621};
    sd_arena a;
    sd_arena_init(&a, 1 << 14);
    sd_buf scratch[3], out;
    for (int i = 0; i < 3; i++) sd_buf_init(&scratch[i]);
    sd_buf_init(&out);
    sd_record rec;
    const char *reason = NULL;
    char detail[320];
    if (sd_input_build(&in, &o, &a, &rec, &reason, detail, sizeof detail) == 0 &&
        sd_rules_apply(r, &rec, in.ordinal, &a, scratch, &reason) == 0) {
        sd_record_write_json(&out, &rec, 1);
        sd_record_write_kohya(&out, &rec, sd_record_kohya_key(&rec));
    }
    for (int i = 0; i < 3; i++) sd_buf_free(&scratch[i]);
    sd_buf_free(&out);
    sd_arena_free(&a);
    free(copy);
}
