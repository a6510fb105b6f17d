/* Fuzz target for the booru path of sd-meta: the input is one post line.
 * It is built into a record, run through two rule sets (one with every
 * filter and rewrite, one that keeps everything so the writers see most
 * inputs) and serialised; separately the same bytes are parsed as JSON,
 * written back and the output must parse again. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "log.h"
#include "fuzz_post.h"
#include "rules.h"
#include "source.h"

static const char rules_full[] =
    "{\"blacklist_tags\": [\"bad_tag\", \"Comic\", \"guro\"],"
    " \"ratings\": [\"general\", \"sensitive\", \"questionable\", \"safe\"],"
    " \"abs_min_score\": -50, \"min_score\": -5,"
    " \"tag_bonus_scores\": {\"masterpiece\": 10, \"sketch\": -3},"
    " \"where\": [\"score>=-100\", \"fav_count>=0\", \"rating!='explicit'\", \"file.ext!=gif\"],"
    " \"min_side\": 8, \"min_pixels\": 64,"
    " \"escape_parens\": true,"
    " \"replace_tags\": {\"1girl\": \"one girl\", \"solo\": \"\", \"long_hair\": \"long hair\"},"
    " \"replace_substrings\": {\"_(cosplay)\": \" cosplay\", \"a\": \"aa\", \"(\": \"[\"},"
    " \"non_caption_tags\": [\"highres\", \"absurdres\"],"
    " \"score_tags\": [100, 50, 10, 0, -10], \"score_tag_prefix\": \"score_\","
    " \"tag_order\": [\"artist\", \"character\", \"copyright\", \"general\", \"meta\"],"
    " \"rating_words\": {\"general\": \"safe\", \"questionable\": \"nsfw\"},"
    " \"artist_prefix\": \"by \","
    " \"caption_template\": \"{rating}, {score_tag}, {caption}, {character}, {tags}, {unknown}, {artist\","
    " \"tag_separator\": \", \", \"shuffle_tag_p\": 0.5, \"keep_tokens\": 1, \"seed\": 7,"
    " \"val_every\": 3, \"val_fraction\": 0.25}";

static const char rules_open[] =
    "{\"underscores\": false, \"replace_substrings\": {\"_\": \" \", \"\\\\\": \"/\"},"
    " \"score_tags\": [5], \"caption_template\": \"{caption}. {general} | {meta} {score_tag}\","
    " \"tag_separator\": \" \", \"shuffle_tag_p\": 1}";

static sd_rules rules[2];
static int ready;

/* Compile the fixed rule sets once; a failure here is a bug in this file. */
static void setup(void)
{
    const char *texts[2] = {rules_full, rules_open};
    sd_log_setup("fuzz_booru", SD_LOG_ERROR);
    for (int i = 0; i < 2; i++) {
        sd_arena a;
        sd_arena_init(&a, 1 << 14);
        size_t n = strlen(texts[i]);
        char *copy = malloc(n + 1);
        memcpy(copy, texts[i], n + 1);
        sd_json *root;
        sd_error err;
        sd_rules_init(&rules[i]);
        if (sd_json_parse(&a, copy, n, &root, &err) || sd_rules_load_json(&rules[i], root, &err)) {
            sd_log(SD_LOG_ERROR, "fuzz rules %d: %s", i, err.msg);
            abort();
        }
        sd_arena_free(&a);
        free(copy);
    }
    ready = 1;
}

/* Copy the input into a fresh NUL-terminated buffer the parser may modify. */
static char *copy_input(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) abort();
    if (size) memcpy(text, data, size);
    text[size] = 0;
    return text;
}

/* Parse, write back, and require that the written text parses again. */
static void round_trip(const uint8_t *data, size_t size)
{
    char *text = copy_input(data, size);
    sd_arena a;
    sd_arena_init(&a, 1 << 14);
    sd_json *root;
    sd_error err;
    if (sd_json_parse(&a, text, size, &root, &err) == SD_OK) {
        sd_buf b;
        sd_buf_init(&b);
        sd_json_write(&b, root);
        size_t n = b.len;
        char *again = copy_input((const uint8_t *)(b.data ? b.data : ""), n);
        sd_json *root2;
        if (sd_json_parse(&a, again, n, &root2, &err) != SD_OK || root2->type != root->type) {
            sd_log(SD_LOG_ERROR, "round trip failed: %s", err.msg);
            abort();
        }
        free(again);
        sd_buf_free(&b);
    }
    sd_arena_free(&a);
    free(text);
}

/* Python's NaN and Infinity are read, and what is written back is strict JSON. */
static void round_trip_py(const uint8_t *data, size_t size)
{
    char *text = copy_input(data, size);
    sd_arena a;
    sd_arena_init(&a, 1 << 14);
    sd_json *root;
    sd_error err;
    int nonfinite;
    if (sd_json_parse_py(&a, text, size, &root, &nonfinite, &err) == SD_OK) {
        sd_buf b;
        sd_buf_init(&b);
        sd_json_write(&b, root);
        char *again = copy_input((const uint8_t *)(b.data ? b.data : ""), b.len);
        sd_json *root2;
        if (sd_json_parse(&a, again, b.len, &root2, &err) != SD_OK) {
            sd_log(SD_LOG_ERROR, "written back is not strict JSON: %s", err.msg);
            abort();
        }
        free(again);
        sd_buf_free(&b);
    }
    sd_arena_free(&a);
    free(text);
}

/* libFuzzer entry: every input goes through all four paths. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ready) setup();
    fuzz_post((const char *)data, size, size, &rules[0], -1, "{id%1000:04d}/{id}.{file_ext}");
    fuzz_post((const char *)data, size, size, &rules[1], 1, "{id%1000:04d}/{id}.{file_ext}");
    round_trip(data, size);
    round_trip_py(data, size);
    return 0;
}
