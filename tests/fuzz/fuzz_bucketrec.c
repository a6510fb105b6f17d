/* Fuzz target for sd-bucket's record path (libcore/image/bucket_rec.c): the
 * input is one JSONL line, as sd-meta writes or a user edits it. It goes
 * through the kohya and SDXL plans; a bucketed record must come out as one
 * JSON object whose crop box lies inside its resize size and has exactly
 * the bucket's size, and bucketing that output again must give the same
 * bytes (sd-bucket on its own output changes nothing). Lines naming a
 * device or proc file are dropped: without width/height the image header
 * is read from the named path, and a FIFO would block. */
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "bucket.h"
#include "bucket_rec.h"
#include "buf.h"
#include "fuzz.h"
#include "json.h"

/* An integer array member of n whole numbers into out; 0 on success. */
static int ints(const sd_json *obj, const char *key, int n, long *out)
{
    const sd_json *a = sd_json_get(obj, key);
    if (!a || a->type != SD_JSON_ARRAY || (int)a->len != n) return -1;
    int i = 0;
    for (const sd_json *e = a->child; e; e = e->next, i++) {
        double d;
        if (sd_json_whole(e, -1e9, 1e9, &d)) return -1;
        out[i] = (long)d;
    }
    return 0;
}

/* The invariants of one bucketed output line (NUL-terminated copy made
 * here: parsing is in place). */
static void check_output(const char *text, size_t len)
{
    char *copy = malloc(len + 1);
    if (!copy) return;
    memcpy(copy, text, len);
    copy[len] = 0;
    sd_arena a;
    sd_arena_init(&a, 1 << 12);
    sd_json *v;
    sd_error err;
    if (len == 0 || text[len - 1] != '\n' || sd_json_parse(&a, copy, len - 1, &v, &err) != SD_OK ||
        v->type != SD_JSON_OBJECT)
        abort(); /* not one JSON object and a newline */
    long b[2], rs[2], c[4];
    if (ints(v, "bucket", 2, b) || ints(v, "resize", 2, rs) || ints(v, "crop", 4, c)) abort();
    if (b[0] < 8 || b[1] < 8 || b[0] % 8 || b[1] % 8) abort();
    if (c[0] < 0 || c[1] < 0 || c[2] > rs[0] || c[3] > rs[1]) abort(); /* crop outside the resized image */
    if (c[2] - c[0] != b[0] || c[3] - c[1] != b[1]) abort();             /* crop is not the bucket's size */
    sd_arena_free(&a);
    free(copy);
}

/* One plan over the line: bucket it, check the output, bucket the output
 * again and require the same bytes. */
static void run_plan(const sd_plan *plan, const uint8_t *data, size_t size)
{
    sd_brec_worker wk;
    sd_brec_worker_init(&wk);
    sd_buf out, again;
    sd_buf_init(&out);
    sd_buf_init(&again);
    char *line = malloc(size + 1);
    if (!line) abort();
    memcpy(line, data, size);
    line[size] = 0;
    sd_brec_result res;
    sd_bucket_record(plan, "/nonexistent-fuzz-root", &wk, line, size, &out, &res);
    if (!res.reason && !res.blank) {
        check_output(out.data, out.len);
        char *second = malloc(out.len + 1);
        if (!second) abort();
        memcpy(second, out.data, out.len);
        second[out.len] = 0;
        sd_brec_result res2;
        sd_bucket_record(plan, "/nonexistent-fuzz-root", &wk, second, out.len - 1, &again, &res2);
        if (res2.reason || again.len != out.len || memcmp(again.data, out.data, out.len) != 0) abort();
        free(second);
    }
    free(line);
    sd_buf_free(&out);
    sd_buf_free(&again);
    sd_brec_worker_free(&wk);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096 || memchr(data, '\n', size)) return 0; /* one line */
    static const char *const unsafe[] = {"/dev", "/proc", "/sys", "\\/", "\\u002"}; /* also escaped slashes */
    for (size_t i = 0; i < sizeof unsafe / sizeof *unsafe; i++)
        if (memmem(data, size, unsafe[i], strlen(unsafe[i]))) return 0;
    sd_error err;
    sd_plan kohya = {0}, sdxl = {0};
    if (sd_plan_kohya(&kohya, 1024, 1024, 256, 2048, 64, 0, &err) || sd_plan_sdxl(&sdxl, 1, &err)) abort();
    run_plan(&kohya, data, size);
    run_plan(&sdxl, data, size);
    sd_plan_free(&kohya);
    sd_plan_free(&sdxl);
    return 0;
}
