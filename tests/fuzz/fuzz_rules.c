/* Fuzz target for sd-meta's rules files (formats/rules.c): the input is a
 * rules file. Any bytes are refused with an error or compiled; compiled
 * rules are then applied to a few fixed booru posts (filters, tag
 * rewrites, templates, shuffling, the split), and every kept record is
 * written in both output formats. fuzz_booru does the reverse: fixed
 * rules, fuzzed posts. */
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "fuzz.h"
#include "fuzz_post.h"
#include "json.h"
#include "log.h"
#include "record.h"
#include "rules.h"
#include "source.h"

static const char *const posts[] = {
    "{\"id\": 7, \"md5\": \"abc\", \"file_ext\": \"png\", \"rating\": \"s\", \"score\": 12, \"fav_count\": 3,"
    " \"image_width\": 1200, \"image_height\": 800, \"tag_string_general\": \"1girl long_hair smile (cosplay)\","
    " \"tag_string_character\": \"hatsune_miku\", \"tag_string_artist\": \"someone_(artist)\","
    " \"tag_string_copyright\": \"vocaloid\", \"tag_string_meta\": \"highres absurdres\"}",
    "{\"id\": 8, \"file\": {\"ext\": \"jpg\", \"width\": 64, \"height\": 4000}, \"rating\": \"e\","
    " \"score\": {\"total\": -20}, \"tags\": {\"general\": [\"solo\", \"a_b\"], \"species\": [\"cat\"],"
    " \"artist\": [\"x\"]}, \"description\": \"d\"}",
    "{\"id\": 9, \"tag_string\": \"\", \"rating\": \"q\"}",
};

/* Copy n bytes into a fresh NUL-terminated buffer the parser may modify. */
static char *copy_text(const void *data, size_t n)
{
    char *text = malloc(n + 1);
    if (!text) abort();
    if (n) memcpy(text, data, n);
    text[n] = 0;
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet) sd_log_setup("fuzz_rules", SD_LOG_ERROR), quiet = 1;
    char *text = copy_text(data, size);
    sd_arena a;
    sd_arena_init(&a, 1 << 14);
    sd_json *root;
    sd_error err;
    sd_rules r;
    sd_rules_init(&r);
    if (sd_json_parse(&a, text, size, &root, &err) == SD_OK && sd_rules_load_json(&r, root, &err) == SD_OK) {
        for (size_t i = 0; i < sizeof posts / sizeof *posts; i++)
            for (uint64_t ord = 0; ord < 3; ord++)
                fuzz_post(posts[i], strlen(posts[i]), ord * 7 + i, &r, i == 1 ? 1 : -1, "{id}.{file_ext}");
    }
    sd_rules_free(&r);
    sd_arena_free(&a);
    free(text);
    return 0;
}
