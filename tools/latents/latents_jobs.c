/* sd-latents input: bucketed JSONL records (sd-meta | sd-bucket) into a job
 * list, this process's part of it, sorted by bucket for batching. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "hash.h"
#include "json.h"
#include "latents.h"
#include "strmap.h"
#include "utf8.h"

/* A JSON array of `n` integers into out; 0 on success. */
static int int_array(const sd_json *a, int n, int *out)
{
    if (!a || a->type != SD_JSON_ARRAY || (int)a->len != n) return -1;
    int i = 0;
    for (const sd_json *e = a->child; e; e = e->next, i++) {
        double d;
        if (sd_json_whole(e, 0, 1e7, &d)) return -1;
        out[i] = (int)d;
    }
    return 0;
}

/* A plan field (bucket, resize, crop): a JSON array of n whole numbers
 * 0..1e7 into out; 0 when valid, 1 when absent, -1 when malformed with
 * why saying how ("crop has 3 numbers, not 4", "crop [-8,2,392,298]:
 * negative"), so a record that has its plan is never called unbucketed. */
static int plan_array(const sd_json *obj, const char *field, int n, int *out, char *why, size_t cap)
{
    const sd_json *a = sd_json_get(obj, field);
    if (!a || a->type == SD_JSON_NULL) return 1;
    if (a->type != SD_JSON_ARRAY) {
        snprintf(why, cap, "%s is not an array of %d numbers", field, n);
        return -1;
    }
    if ((int)a->len != n) {
        snprintf(why, cap, "%s has %zu numbers, not %d", field, (size_t)a->len, n);
        return -1;
    }
    char text[160] = "";
    int i = 0, negative = 0, fraction = 0, huge = 0;
    for (const sd_json *e = a->child; e; e = e->next, i++) {
        double d;
        if (sd_json_num(e, &d)) {
            snprintf(why, cap, "%s: element %d is not a number", field, i + 1);
            return -1;
        }
        snprintf(text + strlen(text), sizeof text - strlen(text), "%s%.15g", i ? "," : "", d);
        negative |= d < 0;
        fraction |= d != floor(d);
        huge |= d > 1e7;
        if (!negative && !fraction && !huge) out[i] = (int)d;
    }
    const char *what = negative ? "negative" : fraction ? "not whole numbers" : huge ? "out of range (max 10000000)" : NULL;
    if (what) snprintf(why, cap, "%s [%s]: %s", field, text, what);
    return what ? -1 : 0;
}

/* The record's bucket, resize and crop into the job: NULL when they make
 * a sound plan, else the skip reason with the precise why ("not
 * bucketed" only when a field is missing). */
static const char *plan_from(const sd_json *r, latent_job *j, int rs[2], char *why, size_t cap)
{
    int b[2], c[4];
    int hb = plan_array(r, "bucket", 2, b, why, cap);
    int hr = hb < 0 ? 0 : plan_array(r, "resize", 2, rs, why, cap);
    int hc = hb < 0 || hr < 0 ? 0 : plan_array(r, "crop", 4, c, why, cap);
    if (hb < 0) return "bad bucket";
    if (hr < 0 || hc < 0) return "bad resize/crop";
    if (hb || hr || hc) {
        snprintf(why, cap, "no %s", hb ? "bucket" : hr ? "resize" : "crop");
        return "not bucketed (no bucket/resize/crop: run sd-bucket first)";
    }
    if (b[0] % 8 || b[1] % 8 || b[0] < 8 || b[1] < 8) {
        snprintf(why, cap, "bucket %dx%d", b[0], b[1]);
        return "bucket size is not a positive multiple of 8";
    }
    j->bucket_w = b[0];
    j->bucket_h = b[1];
    j->plan = (sd_image_plan){.resize_w = rs[0], .resize_h = rs[1], .crop_l = c[0], .crop_t = c[1],
                              .crop_r = c[2], .crop_b = c[3], .keep_aspect = 1};
    sd_error e = {0};
    if (sd_image_plan_check(&j->plan, &e)) {
        snprintf(why, cap, "%.250s", e.msg); /* a plan check: short */
        return "bad resize/crop";
    }
    if (sd_image_out_w(&j->plan) != b[0] || sd_image_out_h(&j->plan) != b[1]) {
        snprintf(why, cap, "crop [%d,%d,%d,%d] is %dx%d, the bucket %dx%d", c[0], c[1], c[2], c[3],
                 sd_image_out_w(&j->plan), sd_image_out_h(&j->plan), b[0], b[1]);
        return "crop size differs from bucket";
    }
    return NULL;
}

/* A non-negative integer member; 0 when present and valid, 1 when absent. */
static int opt_u64(const sd_json *obj, const char *key, uint64_t *out)
{
    const sd_json *m = sd_json_get(obj, key);
    double d;
    if (!m) return 1;
    if (sd_json_whole(m, 0, 9007199254740992.0, &d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

/* A string member copied to the heap, NULL when absent or not a string. */
static char *dup_str(const sd_json *obj, const char *key)
{
    const sd_json *m = sd_json_get(obj, key);
    if (!m || m->type != SD_JSON_STRING || memchr(m->str, 0, m->len)) return NULL;
    char *s = malloc(m->len + 1);
    if (s) {
        memcpy(s, m->str, m->len);
        s[m->len] = 0;
    }
    return s;
}

/* Free one job's strings. */
static void job_free(latent_job *j)
{
    free(j->name);
    free(j->image);
    free(j->member);
    free(j->caption);
    free(j->mask);
    for (int i = 0; i < j->nvariants; i++) free(j->variants[i]);
    free(j->variants);
    free(j->variant_lens);
    free(j->variant_keys);
}

/* The record's caption variants (sd-meta --caption-variants: "captions",
 * an array of strings) into the job: the caption first, then each other
 * distinct one, at most SD_SHARD_MAX_VARIANTS; none kept when that leaves
 * one. A reason string when the field is not an array of strings. */
static const char *variants_from(const sd_json *r, latent_job *j)
{
    const sd_json *a = sd_json_get(r, "captions");
    if (!a || a->type == SD_JSON_NULL) return NULL;
    if (a->type != SD_JSON_ARRAY) return "captions is not an array of strings";
    size_t cap = (size_t)a->len + 1;
    j->variants = calloc(cap, sizeof *j->variants);
    j->variant_lens = calloc(cap, sizeof *j->variant_lens);
    if (!j->variants || !j->variant_lens) return "out of memory";
    j->variants[0] = strdup(j->caption);
    if (!j->variants[0]) return "out of memory";
    j->variant_lens[0] = j->caption_len;
    j->nvariants = 1;
    for (const sd_json *e = a->child; e; e = e->next) {
        if (e->type != SD_JSON_STRING) return "captions is not an array of strings";
        int dup = 0;
        for (int i = 0; i < j->nvariants && !dup; i++)
            dup = j->variant_lens[i] == e->len && !memcmp(j->variants[i], e->str, e->len);
        if (dup || j->nvariants == SD_SHARD_MAX_VARIANTS) continue;
        char *c = malloc((size_t)e->len + 1);
        if (!c) return "out of memory";
        memcpy(c, e->str, e->len);
        c[e->len] = 0;
        j->variants[j->nvariants] = c;
        j->variant_lens[j->nvariants++] = e->len;
    }
    if (j->nvariants < 2) { /* one caption: no variants entry */
        free(j->variants[0]);
        free(j->variants);
        free(j->variant_lens);
        j->variants = NULL;
        j->variant_lens = NULL;
        j->nvariants = 0;
    }
    return NULL;
}

/* The record's caption into the job ("" when it has none); a reason
 * string when it cannot be. */
static const char *caption_from(const sd_json *r, latent_job *j)
{
    const sd_json *cap = sd_json_get(r, "caption");
    if (cap && cap->type != SD_JSON_STRING && cap->type != SD_JSON_NULL) return "caption is not a string";
    size_t cl = cap && cap->type == SD_JSON_STRING ? cap->len : 0;
    j->caption = malloc(cl + 1);
    if (!j->caption) return "out of memory";
    if (cl) memcpy(j->caption, cap->str, cl);
    j->caption[cl] = 0;
    j->caption_len = cl;
    return NULL;
}

/* Turn one parsed record into a job; a reason string when it cannot be
 * (why: the details, or ""). captions_only (--text-only) reads the key
 * and caption alone. */
static const char *job_from(const sd_json *r, int captions_only, const char *root, latent_job *j, char *detail,
                            size_t cap)
{
    int rs[2], o[2];
    detail[0] = 0;
    memset(j, 0, sizeof(*j));
    if (r->type != SD_JSON_OBJECT) return "not a JSON object";
    j->name = dup_str(r, "key");
    if (!j->name || !j->name[0] || strlen(j->name) > 511) return "no usable key (1..511 bytes)";
    if (captions_only) { /* --text-only replaces a record's embedding: no caption is no reason to blank it */
        const sd_json *c = sd_json_get(r, "caption");
        if (!c || c->type == SD_JSON_NULL) return "no caption (the record keeps its embedding; \"caption\": \"\" sets the empty one)";
        const char *cw = caption_from(r, j);
        return cw ? cw : variants_from(r, j);
    }
    j->image = dup_str(r, "image");
    if (!j->image) return "no image path";
    if (root && j->image[0] != '/') { /* as sd-bucket --root resolved it */
        size_t rl = strlen(root), il = strlen(j->image);
        char *p = malloc(rl + il + 2);
        if (!p) return "out of memory";
        memcpy(p, root, rl);
        p[rl] = '/';
        memcpy(p + rl + 1, j->image, il + 1);
        free(j->image);
        j->image = p;
    }
    const char *bad = plan_from(r, j, rs, detail, cap);
    if (bad) return bad;
    const sd_json *os = sd_json_get(r, "original_size");
    if (os && os->type != SD_JSON_NULL) { /* present: SDXL's size conditioning must get what it says */
        if (int_array(os, 2, o) || o[0] < 1 || o[1] < 1) return "bad original_size (not [w, h] of 1..1e7)";
        j->orig_w = o[0];
        j->orig_h = o[1];
    } else {
        j->orig_w = rs[0];
        j->orig_h = rs[1];
    }
    j->member = dup_str(r, "member");
    const char *why = caption_from(r, j);
    if (!why) why = variants_from(r, j);
    if (why) return why;
    j->size = SD_IMAGE_WHOLE_FILE;
    int ho = opt_u64(r, "offset", &j->offset), hs = opt_u64(r, "size", &j->size);
    if (ho < 0 || hs < 0) return "bad offset/size";
    if (j->member && (ho || hs)) return "tar member without offset/size (compressed tar? unpack it)";
    return NULL;
}

/* Append a job, growing the list. */
static int push(job_list *l, const latent_job *j)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        latent_job *v = realloc(l->v, cap * sizeof(*v));
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = *j;
    return 0;
}

/* Bucket order (width, then height), then input order: stable batching. */
static int by_bucket(const void *a, const void *b)
{
    const latent_job *x = a, *y = b;
    if (x->bucket_w != y->bucket_w) return x->bucket_w < y->bucket_w ? -1 : 1;
    if (x->bucket_h != y->bucket_h) return x->bucket_h < y->bucket_h ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Which of count --shard processes takes the record named name. */
static int shard_of(const char *name, int count)
{
    return (int)(sd_hash64(name, strlen(name), 0) % (uint64_t)count);
}

/* Whether job j repeats a key seen before (first line wins, as sd-meta and
 * sd-pack merge keep the first): counted and named with both lines. seen
 * maps a key to its first line; -1 when out of memory. */
static int duplicate(sd_strmap *seen, const latent_job *j, const char *path, sd_tally *tally)
{
    sd_strmap_slot *s = sd_strmap_put(seen, j->name, strlen(j->name));
    if (!s) return -1;
    if (s->nval == 0) {
        s->nval = (double)j->line;
        return 0;
    }
    sd_skip(tally, "duplicate key", "%s:%llu: key %s seen before on line %.0f (the first is kept)", path,
            (unsigned long long)j->line, j->name, s->nval);
    return 1;
}

/* Read, select and sort (see latents.h). */
sd_status jobs_read(job_list *l, const char *path, int index, int count, int captions_only, const char *root,
                    sd_tally *tally, sd_error *err)
{
    memset(l, 0, sizeof(*l));
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "r");
    if (!f) return sd_err_set(err, SD_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    sd_arena a;
    sd_arena_init(&a, 1 << 16);
    sd_strmap seen;
    sd_strmap_init(&seen);
    sd_status st = SD_OK;
    while (!st && (len = getline(&line, &cap, f)) >= 0) {
        l->lines++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        size_t bom = l->lines == 1 ? sd_bom_len(line, (size_t)len) : 0; /* a Windows editor's byte order mark */
        if ((size_t)len == bom) continue;
        sd_json *root_json = NULL;
        sd_error pe = {0};
        sd_arena_reset(&a);
        if (sd_json_parse(&a, line + bom, (size_t)len - bom, &root_json, &pe)) {
            if (index == 0) /* every --shard process reads the line: the first one reports it */
                sd_skip(tally, "malformed JSON", "%s:%llu: %s", path, (unsigned long long)l->lines, pe.msg);
            continue;
        }
        latent_job j;
        char detail[256];
        const char *why = job_from(root_json, captions_only, root, &j, detail, sizeof detail);
        if (why) { /* reported by the process whose shard the key falls in (the first one without a key) */
            int mine = count <= 1 || (j.name ? shard_of(j.name, count) == index : index == 0);
            if (mine)
                sd_skip(tally, why, "%s:%llu (%s)%s%s", path, (unsigned long long)l->lines, j.name ? j.name : "no key",
                        detail[0] ? ": " : "", detail);
            job_free(&j);
            continue;
        }
        if (count > 1 && shard_of(j.name, count) != index) {
            l->other_shard++;
            job_free(&j);
            continue;
        }
        j.seq = l->n;
        j.line = l->lines;
        int dup = duplicate(&seen, &j, path, tally);
        if (dup == 0 && push(l, &j) == 0) continue;
        job_free(&j);
        if (dup != 1) st = sd_err_set(err, SD_ENOMEM, "out of memory reading %s", path);
    }
    if (!st && ferror(f)) st = sd_err_set(err, SD_EIO, "%s: read error", path);
    free(line);
    sd_arena_free(&a);
    sd_strmap_free(&seen);
    if (!is_stdin) fclose(f);
    if (st) {
        jobs_free(l);
        return st;
    }
    if (l->n) qsort(l->v, l->n, sizeof(*l->v), by_bucket);
    return SD_OK;
}

/* Free the list and every job's strings. */
void jobs_free(job_list *l)
{
    for (size_t i = 0; i < l->n; i++) job_free(&l->v[i]);
    free(l->v);
    memset(l, 0, sizeof(*l));
}
