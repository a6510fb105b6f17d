/* safetensors reader and writer: a file written by the reference Python
 * implementation (tests/golden/safetensors) reads back exactly; our writer's
 * files read back; every truncation and every single-byte corruption of the
 * header is either rejected or still self-consistent; hand-made bad headers
 * (overlap, hole, size mismatch, duplicate tensors, a second __metadata__
 * or repeated metadata key, names holding \u0000, huge length) are
 * rejected; empty tensors at tensor boundaries pass in any header order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "buf.h"
#include "check.h"
#include "f16.h"
#include "json.h"
#include "safetensors.h"
#include "slurp.h"

#ifndef GOLDEN_DIR
#define GOLDEN_DIR "tests/golden/safetensors"
#endif

/* Compare the golden file with its description written by the same script. */
static void test_golden(void)
{
    sd_safetensors *st;
    sd_error err;
    if (!CHECK(sd_st_open(&st, GOLDEN_DIR "/tiny.safetensors", &err) == SD_OK)) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    sd_buf text;
    sd_buf_init(&text);
    sd_arena a;
    sd_arena_init(&a, 4096);
    sd_json *root;
    if (!CHECK(sd_parse_json_file(GOLDEN_DIR "/tiny.json", &text, &a, &root, &err) == SD_OK)) return;
    const sd_json *tensors = sd_json_get(root, "tensors");
    CHECK(sd_st_count(st) == tensors->len);
    for (const sd_json *e = tensors->child; e; e = e->next) {
        const sd_st_tensor *t = sd_st_find(st, e->key);
        if (!CHECK(t != NULL)) continue;
        CHECK_STR(sd_st_dtype_name(t->dtype), sd_json_str(sd_json_get(e, "dtype")));
        const sd_json *shape = sd_json_get(e, "shape");
        int ok = t->ndim == (int)shape->len;
        int k = 0;
        for (const sd_json *s = shape->child; s && ok; s = s->next, k++) ok = t->shape[k] == (uint64_t)s->num;
        CHECK(ok);
        CHECK(t->nbytes == (uint64_t)sd_json_get(e, "nbytes")->num);
        uint64_t sum = 0;
        for (uint64_t i = 0; i < t->nbytes; i++) sum += ((const unsigned char *)t->data)[i];
        CHECK(sum == (uint64_t)sd_json_get(e, "byte_sum")->num);
        k = 0;
        int head_ok = 1;
        for (const sd_json *h = sd_json_get(e, "head")->child; h; h = h->next, k++)
            head_ok &= ((const unsigned char *)t->data)[k] == (unsigned)h->num;
        CHECK(head_ok);
    }
    const sd_json *meta = sd_json_get(root, "metadata");
    CHECK(sd_st_meta_count(st) == meta->len);
    for (size_t i = 0; i < sd_st_meta_count(st); i++) {
        const sd_st_meta *m = sd_st_meta_at(st, i);
        CHECK_STR(m->value, sd_json_str(sd_json_get(meta, m->key)));
    }
    sd_st_close(st);
    sd_arena_free(&a);
    sd_buf_free(&text);
}

/* Our writer: tensors and metadata come back byte for byte; header padded. */
static void test_write_roundtrip(void)
{
    float w[6] = {1, -2, 3.5f, 0, 1e-3f, 7};
    uint16_t h[3] = {0x3c00, 0xc000, 0x7bff};
    sd_st_tensor t[3] = {{"w", SD_ST_F32, 2, {2, 3}, sizeof w, w, NULL, NULL},
                         {"h", SD_ST_F16, 1, {3}, sizeof h, h, NULL, NULL},
                         {"scalar_empty", SD_ST_F32, 1, {0}, 0, NULL, NULL, NULL}};
    sd_st_meta meta[1] = {{"producer", "sdtk \"test\""}};
    char path[] = "/tmp/sdtk-st-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    sd_error err;
    if (!CHECK(sd_st_write(path, t, 3, meta, 1, &err) == SD_OK)) return;
    sd_safetensors *st;
    if (!CHECK(sd_st_open(&st, path, &err) == SD_OK)) {
        fprintf(stderr, "  %s\n", err.msg);
        return;
    }
    const sd_st_tensor *rw = sd_st_find(st, "w"), *rh = sd_st_find(st, "h"), *re = sd_st_find(st, "scalar_empty");
    CHECK(rw && rw->nbytes == sizeof w && memcmp(rw->data, w, sizeof w) == 0 && rw->ndim == 2 && rw->shape[1] == 3);
    CHECK(rh && rh->nbytes == sizeof h && memcmp(rh->data, h, sizeof h) == 0 && rh->dtype == SD_ST_F16);
    CHECK(re && re->nbytes == 0);
    CHECK(sd_st_meta_count(st) == 1 && strcmp(sd_st_meta_at(st, 0)->value, "sdtk \"test\"") == 0);
    sd_st_close(st);
    sd_buf file;
    sd_buf_init(&file);
    sd_read_file(path, &file, &err);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | (unsigned char)file.data[i];
    CHECK(hl % 8 == 0);
    sd_buf_free(&file);
    /* a size that does not match the shape is refused */
    t[0].nbytes = 8;
    CHECK(sd_st_write(path, t, 1, NULL, 0, &err) == SD_EINVAL);
    unlink(path);
}

/* Tensors given as floats (.f32) are converted while written, in pieces:
 * the bytes equal the whole tensor converted at once with f16.h (40,000
 * values cross the writer's pieces), for F32, F16 and BF16; another dtype
 * is refused. */
static void test_write_converted(void)
{
    enum { N = 40000 };
    float *x = malloc(N * sizeof(float));
    uint16_t *h = malloc(N * sizeof(uint16_t)), *b = malloc(N * sizeof(uint16_t));
    float *xb = malloc(N * sizeof(float));
    uint16_t *hb = malloc(N * sizeof(uint16_t));
    if (!CHECK(x && h && b && xb && hb)) goto out;
    for (int i = 0; i < N; i++) {
        x[i] = (float)((i * 2654435761u) % 100003) / 977.0f - 50.0f;
        h[i] = sd_f32_to_f16(x[i]);
        b[i] = sd_f32_to_bf16(x[i]);
    }
    /* and from bf16 bits (.bf16: sd-train --weight-dtype bf16's weights),
     * widened exactly: b itself as BF16, its values as F32 and F16 */
    for (int i = 0; i < N; i++) {
        xb[i] = sd_bf16_to_f32(b[i]);
        hb[i] = sd_f32_to_f16(xb[i]);
    }
    sd_st_tensor t[6] = {{"f32", SD_ST_F32, 1, {N}, N * 4, NULL, x, NULL},
                         {"f16", SD_ST_F16, 2, {200, 200}, N * 2, NULL, x, NULL},
                         {"bf16", SD_ST_BF16, 1, {N}, N * 2, NULL, x, NULL},
                         {"b_f32", SD_ST_F32, 1, {N}, N * 4, NULL, NULL, b},
                         {"b_f16", SD_ST_F16, 1, {N}, N * 2, NULL, NULL, b},
                         {"b_bf16", SD_ST_BF16, 1, {N}, N * 2, NULL, NULL, b}};
    char path[] = "/tmp/sdtk-stc-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    sd_error err;
    sd_safetensors *st = NULL;
    if (!CHECK(sd_st_write(path, t, 6, NULL, 0, &err) == SD_OK && sd_st_open(&st, path, &err) == SD_OK)) goto out;
    const sd_st_tensor *r32 = sd_st_find(st, "f32"), *r16 = sd_st_find(st, "f16"), *rb = sd_st_find(st, "bf16");
    CHECK(r32 && r32->nbytes == N * 4 && memcmp(r32->data, x, N * 4) == 0);
    CHECK(r16 && r16->nbytes == N * 2 && r16->ndim == 2 && memcmp(r16->data, h, N * 2) == 0);
    CHECK(rb && rb->nbytes == N * 2 && memcmp(rb->data, b, N * 2) == 0);
    const sd_st_tensor *w32 = sd_st_find(st, "b_f32"), *w16 = sd_st_find(st, "b_f16"), *wb = sd_st_find(st, "b_bf16");
    CHECK(w32 && w32->nbytes == N * 4 && memcmp(w32->data, xb, N * 4) == 0);
    CHECK(w16 && w16->nbytes == N * 2 && memcmp(w16->data, hb, N * 2) == 0);
    CHECK(wb && wb->nbytes == N * 2 && memcmp(wb->data, b, N * 2) == 0);
    sd_st_close(st);
    t[0].dtype = SD_ST_I32;
    CHECK(sd_st_write(path, t, 1, NULL, 0, &err) == SD_EINVAL && strstr(err.msg, "F32, F16 or BF16") != NULL);
out:
    unlink(path);
    free(x);
    free(h);
    free(b);
    free(xb);
    free(hb);
}

/* This process's file-backed resident KiB (/proc/self/status RssFile);
 * -1 where /proc has none. */
static long rss_file_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssFile: %ld", &kib) == 1) break;
    if (f) fclose(f);
    return kib;
}

/* sd_st_drop_pages (a model loaded a tensor at a time, issue 28): a 16 MiB
 * tensor read through the mapping is resident, and after the drop it is
 * not (the file-backed RSS falls by most of it) while its bytes read back
 * the same; a tensor of an in-memory file is left alone. */
static void test_drop_pages(void)
{
    enum { N = 4 << 20 };
    float *x = malloc(N * sizeof(float));
    char path[] = "/tmp/sdtk-std-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    sd_error err;
    sd_safetensors *st = NULL;
    if (!CHECK(x)) goto out;
    for (int i = 0; i < N; i++) x[i] = (float)(i % 1000) - 500.0f;
    sd_st_tensor t = {"x", SD_ST_F32, 1, {N}, (uint64_t)N * 4, x, NULL, NULL};
    if (!CHECK(sd_st_write(path, &t, 1, NULL, 0, &err) == SD_OK && sd_st_open(&st, path, &err) == SD_OK)) goto out;
    const sd_st_tensor *r = sd_st_find(st, "x");
    if (!CHECK(r != NULL)) goto out;
    long before = rss_file_kib();
    CHECK(memcmp(r->data, x, (size_t)N * 4) == 0);
    long read = rss_file_kib();
    sd_st_drop_pages(st, r);
    long dropped = rss_file_kib();
    if (before >= 0) {
        CHECK(read - before > 12 * 1024);
        if (!CHECK(read - dropped > 12 * 1024))
            fprintf(stderr, "  RssFile %ld KiB before, %ld read, %ld after the drop\n", before, read, dropped);
    }
    CHECK(memcmp(r->data, x, (size_t)N * 4) == 0); /* read again: the same bytes */
    /* the same file in memory (no mapping: madvise there would zero it) */
    sd_buf b;
    sd_buf_init(&b);
    sd_safetensors *mem = NULL;
    if (CHECK(sd_read_file(path, &b, &err) == SD_OK && sd_st_open_memory(&mem, b.data, b.len, "mem", &err) == SD_OK)) {
        const sd_st_tensor *m = sd_st_find(mem, "x");
        if (CHECK(m != NULL)) {
            sd_st_drop_pages(mem, m);
            CHECK(memcmp(m->data, x, (size_t)N * 4) == 0);
        }
        sd_st_close(mem);
    }
    sd_buf_free(&b);
out:
    sd_st_close(st);
    unlink(path);
    free(x);
}

/* Every prefix of the golden file and every single-byte change of its header
 * area: rejected with an error, or (for harmless changes) a consistent parse. */
static void test_corruptions(void)
{
    sd_buf file;
    sd_buf_init(&file);
    sd_error err;
    if (!CHECK(sd_read_file(GOLDEN_DIR "/tiny.safetensors", &file, &err) == SD_OK)) return;
    size_t n = file.len;
    unsigned char *buf = malloc(n);
    int accepted_prefix = 0, inconsistent = 0, tried = 0;
    for (size_t cut = 0; cut < n; cut++) {
        memcpy(buf, file.data, cut);
        sd_safetensors *st;
        if (sd_st_open_memory(&st, buf, cut, "cut", &err) == SD_OK) {
            accepted_prefix++;
            sd_st_close(st);
        }
    }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | (unsigned char)file.data[i];
    static const unsigned char vals[] = {0x00, 0x22, 0x2c, 0x30, 0x39, 0x5b, 0x5d, 0x7b, 0x7d, 0xff};
    for (size_t pos = 0; pos < 8 + hl; pos++) {
        for (size_t v = 0; v < sizeof vals; v++) {
            if ((unsigned char)file.data[pos] == vals[v]) continue;
            memcpy(buf, file.data, n);
            buf[pos] = vals[v];
            tried++;
            sd_safetensors *st;
            if (sd_st_open_memory(&st, buf, n, "flip", &err) != SD_OK) continue;
            for (size_t i = 0; i < sd_st_count(st); i++) { /* accepted: must still be consistent */
                const sd_st_tensor *t = sd_st_tensor_at(st, i);
                uint64_t count = 1;
                for (int k = 0; k < t->ndim; k++) count *= t->shape[k];
                const unsigned char *p = t->data;
                if (count * sd_st_dtype_size(t->dtype) != t->nbytes || p < buf || p + t->nbytes > buf + n) inconsistent++;
            }
            sd_st_close(st);
        }
    }
    CHECK(accepted_prefix == 0);
    CHECK(inconsistent == 0);
    CHECK(tried > 5000);
    printf("safetensors: %zu truncations and %d header byte changes tried\n", n, tried);
    free(buf);
    sd_buf_free(&file);
}

/* Build "len + header + data" in memory and try to open it. */
static sd_status try_header(const char *header, size_t data_len, sd_error *err)
{
    size_t hl = strlen(header);
    unsigned char *b = calloc(1, 8 + hl + data_len + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    sd_safetensors *st;
    sd_status s = sd_st_open_memory(&st, b, 8 + hl + data_len, "hand-made", err);
    if (!s) sd_st_close(st);
    free(b);
    return s;
}

/* try_header that must be refused as EFORMAT with `says` in the message. */
static void refused(const char *header, size_t data_len, const char *says)
{
    sd_error err = {0};
    sd_status s = try_header(header, data_len, &err);
    if (!CHECK(s == SD_EFORMAT && strstr(err.msg, says) != NULL))
        fprintf(stderr, "  %s: status %d, '%s' lacks '%s'\n", header, (int)s, err.msg, says);
}

/* A key twice in the header or in __metadata__ (the JSON parser keeps
 * both; a second __metadata__ overflowed the metadata table), and a name
 * holding \u0000 (it could not be looked up), are refused by name. */
static void test_repeated_and_nul_keys(void)
{
    const char *a = "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}";
    char h[512];
    snprintf(h, sizeof h, "{\"__metadata__\":{\"k\":\"1\",\"l\":\"2\"},%s,\"__metadata__\":{\"m\":\"3\",\"n\":\"4\"}}", a);
    refused(h, 4, "header key '__metadata__' appears twice");
    snprintf(h, sizeof h, "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"},%s}", a);
    refused(h, 4, "__metadata__ key 'k' appears twice");
    snprintf(h, sizeof h, "{\"x\\u0000y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}");
    refused(h, 4, "header key 'x\\u0000...' holds a NUL");
    /* the reviewer's case: "a\0b" and "a" both accepted, "a\0b" found as "a" */
    snprintf(h, sizeof h, "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},%s}", a);
    refused(h, 8, "holds a NUL");
    snprintf(h, sizeof h, "{\"__metadata__\":{\"k\\u0000\":\"1\"},%s}", a);
    refused(h, 4, "__metadata__ key 'k\\u0000...' holds a NUL");
    /* a NUL in a metadata value is data, not a name */
    snprintf(h, sizeof h, "{\"__metadata__\":{\"k\":\"1\\u00002\"},%s}", a);
    sd_error err = {0};
    CHECK(try_header(h, 4, &err) == SD_OK);
}

/* Empty tensors may sit at any tensor boundary, in any header order: the
 * coverage check sorts by (begin, end) as the reference reader does
 * (sorting by begin alone let a zero-size tensor listed after a tensor
 * with the same begin look like an overlap); inside a tensor is refused,
 * as the reference reader refuses it. */
static void test_empty_tensors(void)
{
    const char *a = "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    const char *b = "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}";
    const char *zs[] = {"\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
                        "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}",
                        "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[12,12]}"};
    char h[512];
    sd_error err = {0};
    for (int i = 0; i < 3; i++) {
        const char *orders[6][3] = {{a, b, zs[i]}, {a, zs[i], b}, {b, a, zs[i]},
                                    {b, zs[i], a}, {zs[i], a, b}, {zs[i], b, a}};
        for (int k = 0; k < 6; k++) {
            snprintf(h, sizeof h, "{%s,%s,%s}", orders[k][0], orders[k][1], orders[k][2]);
            sd_status s = try_header(h, 12, &err);
            if (!CHECK(s == SD_OK)) fprintf(stderr, "  %s: %s\n", h, err.msg);
        }
    }
    snprintf(h, sizeof h, "{%s,\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", a);
    refused(h, 8, "'z' overlaps another");
    snprintf(h, sizeof h, "{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},%s}", a);
    refused(h, 8, "'z' overlaps another");
}

static void test_bad_headers(void)
{
    sd_error err;
    CHECK(try_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &err) == SD_OK);
    CHECK(try_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, &err) == SD_EFORMAT);  /* overlap */
    CHECK(try_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, &err) == SD_EFORMAT);     /* hole */
    CHECK(try_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, &err) == SD_EFORMAT);     /* tail */
    CHECK(try_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, &err) == SD_EFORMAT);     /* size */
    CHECK(try_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8, &err) == SD_ETRUNC);    /* past end */
    CHECK(try_header("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &err) == SD_EUNSUPPORTED);
    CHECK(try_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, &err) == SD_EFORMAT);    /* duplicate */
    CHECK(try_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,8]}}", 8, &err) == SD_EFORMAT);
    CHECK(try_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, &err) ==
          SD_ERANGE);
    CHECK(try_header("[1,2]", 0, &err) == SD_EFORMAT);
    CHECK(try_header("{\"__metadata__\":{\"a\":1}}", 0, &err) == SD_EFORMAT);
    test_repeated_and_nul_keys();
    test_empty_tensors();
    /* a header length past the end, and one over the 100 MB limit */
    unsigned char b[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, '{', '}'};
    sd_safetensors *st;
    CHECK(sd_st_open_memory(&st, b, 10, "big", &err) != SD_OK);
    CHECK(sd_st_open(&st, "/nonexistent.safetensors", &err) == SD_ENOTFOUND);
    /* a .ckpt (a zip of pickles) is named for what it is, not for a huge header length */
    unsigned char zip[32] = {'P', 'K', 3, 4, 20, 0, 0, 0, 8, 0};
    CHECK(sd_st_open_memory(&st, zip, sizeof zip, "model.ckpt", &err) == SD_EFORMAT &&
          strstr(err.msg, "not a safetensors file") != NULL);
}

/* Writes text to dir/name. */
static void put_text(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* Opens dir/m.safetensors.index.json: the status, the message in err. */
static sd_status open_index(const char *dir, sd_safetensors **st, sd_error *err)
{
    char path[512];
    snprintf(path, sizeof path, "%s/m.safetensors.index.json", dir);
    return sd_st_open(st, path, err);
}

/* A sharded checkpoint (index.json + shards, as save_pretrained writes):
 * read as one file through its index; every way the index and the shards
 * can disagree is refused with a message naming the tensor or shard. */
static void test_sharded(void)
{
    char dir[] = "/tmp/sdtk-shards-XXXXXX";
    if (!CHECK(mkdtemp(dir) != NULL)) return;
    float a[4] = {1, 2, 3, 4}, b[2] = {-1, 0.5f}, c[3] = {7, 8, 9};
    sd_st_tensor s1[2] = {{"a", SD_ST_F32, 2, {2, 2}, sizeof a, a, NULL, NULL},
                          {"b", SD_ST_F32, 1, {2}, sizeof b, b, NULL, NULL}};
    sd_st_tensor s2[1] = {{"c", SD_ST_F32, 1, {3}, sizeof c, c, NULL, NULL}};
    sd_st_meta meta[1] = {{"format", "pt"}};
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/m-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/m-00002-of-00002.safetensors", dir);
    sd_error err = {0};
    if (!CHECK(sd_st_write(p1, s1, 2, meta, 1, &err) == SD_OK && sd_st_write(p2, s2, 1, NULL, 0, &err) == SD_OK))
        return;
    const char *good = "{\"metadata\": {\"total_size\": 36}, \"weight_map\": {\"a\": \"m-00001-of-00002.safetensors\", "
                       "\"c\": \"m-00002-of-00002.safetensors\", \"b\": \"m-00001-of-00002.safetensors\"}}";
    put_text(dir, "m.safetensors.index.json", good);
    sd_safetensors *st = NULL;
    if (CHECK(open_index(dir, &st, &err) == SD_OK)) {
        const sd_st_tensor *ta = sd_st_find(st, "a"), *tb = sd_st_find(st, "b"), *tc = sd_st_find(st, "c");
        CHECK(sd_st_count(st) == 3 && ta && tb && tc);
        CHECK(ta && ta->ndim == 2 && ta->shape[1] == 2 && memcmp(ta->data, a, sizeof a) == 0);
        CHECK(tb && memcmp(tb->data, b, sizeof b) == 0 && tc && memcmp(tc->data, c, sizeof c) == 0);
        CHECK(sd_st_find(st, "d") == NULL);
        CHECK(sd_st_meta_count(st) == 1 && strcmp(sd_st_meta_at(st, 0)->key, "format") == 0);
        sd_st_close(st);
    } else {
        fprintf(stderr, "  %s\n", err.msg);
    }
    static const struct {
        const char *index, *says;
    } bad[] = {
        {"{\"weight_map\": {\"a\": \"m-00001-of-00002.safetensors\", \"c\": \"m-00002-of-00002.safetensors\"}}",
         "'b' of m-00001-of-00002.safetensors is not in the index"},
        {"{\"weight_map\": {\"a\": \"m-00001-of-00002.safetensors\", \"b\": \"m-00001-of-00002.safetensors\", "
         "\"c\": \"m-00001-of-00002.safetensors\"}}",
         "puts 'c' in m-00001-of-00002.safetensors, which does not hold it"},
        {"{\"weight_map\": {\"a\": \"m-00001-of-00002.safetensors\", \"b\": \"m-00001-of-00002.safetensors\", "
         "\"c\": \"m-00002-of-00002.safetensors\", \"d\": \"m-00002-of-00002.safetensors\"}}",
         "puts 'd' in m-00002-of-00002.safetensors"},
        {"{\"weight_map\": {\"a\": \"m-00001-of-00002.safetensors\", \"b\": \"m-00001-of-00002.safetensors\", "
         "\"c\": \"../m-00002-of-00002.safetensors\"}}",
         "not a plain NAME.safetensors"},
        {"{\"weight_map\": {\"a\": \"m-00001-of-00002.safetensors\", \"b\": \"m-00001-of-00002.safetensors\", "
         "\"c\": \"missing.safetensors\"}}",
         "missing.safetensors"},
        {"{\"weight_map\": {\"a\": \"m-00001-of-00002.safetensors\", \"a\": \"m-00001-of-00002.safetensors\", "
         "\"b\": \"m-00001-of-00002.safetensors\", \"c\": \"m-00002-of-00002.safetensors\"}}",
         "lists 'a' twice"},
        {"{\"weight_map\": {\"a\": 3}}", "is not a file name"},
        {"{\"weight_map\": {\"a\": \"m-00001-of-00002.safetensors\", \"b\": \"m-00001-of-00002.safetensors\", "
         "\"c\": \"m-00002-of-00002.safetensors\", \"c\\u0000x\": \"m-00002-of-00002.safetensors\"}}",
         "weight_map key 'c\\u0000...' holds a NUL"},
        {"{\"weight_map\": {\"a\": \"m.safetensors.index.json\"}}", "not a plain NAME.safetensors"},
        {"{\"weight_map\": {\"a\": \"m-00001-of-00002.bin\"}}", "not a plain NAME.safetensors"},
        {"{\"metadata\": {}}", "no weight_map"},
        {"[1, 2]", "no weight_map"},
        {"{\"weight_map\": {\"a\": ", ""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        put_text(dir, "m.safetensors.index.json", bad[i].index);
        st = NULL;
        err = (sd_error){0};
        int refused = CHECK(open_index(dir, &st, &err) != SD_OK && st == NULL);
        if (refused && !CHECK(strstr(err.msg, bad[i].says) != NULL))
            fprintf(stderr, "  index %zu: '%s' lacks '%s'\n", i, err.msg, bad[i].says);
        if (st) sd_st_close(st);
    }
    /* the same tensor in both shards: the one the index does not name is refused */
    sd_st_tensor dup[1] = {{"a", SD_ST_F32, 2, {2, 2}, sizeof a, a, NULL, NULL}};
    if (CHECK(sd_st_write(p2, dup, 1, NULL, 0, &err) == SD_OK)) {
        put_text(dir, "m.safetensors.index.json",
                 "{\"weight_map\": {\"a\": \"m-00002-of-00002.safetensors\", \"b\": \"m-00001-of-00002.safetensors\"}}");
        err = (sd_error){0};
        CHECK(open_index(dir, &st, &err) != SD_OK &&
              strstr(err.msg, "'a' is in m-00001-of-00002.safetensors, the index puts it in m-00002") != NULL);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/m.safetensors.index.json", dir);
    unlink(path);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
}

int main(void)
{
    test_golden();
    test_write_roundtrip();
    test_write_converted();
    test_corruptions();
    test_bad_headers();
    test_sharded();
    test_drop_pages();
    return check_done("test_safetensors");
}
