#include "bucket_split.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hash.h"
#include "log.h"

typedef struct {
    uint64_t order;
    size_t idx;
} bucket_order;

/* Sort by the seeded order key, then by index (keys can collide). */
static int order_cmp(const void *a, const void *b)
{
    const bucket_order *x = a, *y = b;
    if (x->order != y->order) return x->order < y->order ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Plan the split once every bucket's count is known. Record k of bucket b
 * goes to part (start[b] + k) mod N: round-robin keeps each bucket even. The
 * leftovers (count mod N) of the buckets, taken in a seeded order, are laid
 * end to end around the ring of parts (each bucket starts where the previous
 * one's leftovers stopped), so the totals come out even too. keys identify
 * buckets independently of their numbering (e.g. w<<32|h); NULL uses index. */
sd_status sd_splitter_init(sd_splitter *s, const uint64_t *counts, const uint64_t *keys, size_t nbuckets, int nparts,
                           uint64_t seed, sd_error *err)
{
    memset(s, 0, sizeof *s);
    if (nparts < 1) return sd_err_set(err, SD_EINVAL, "need at least one part");
    s->nparts = nparts;
    s->nbuckets = nbuckets;
    s->start = calloc(nbuckets ? nbuckets : 1, sizeof *s->start);
    s->seen = calloc(nbuckets ? nbuckets : 1, sizeof *s->seen);
    bucket_order *ord = malloc((nbuckets ? nbuckets : 1) * sizeof *ord);
    if (!s->start || !s->seen || !ord) {
        free(ord);
        sd_splitter_free(s);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < nbuckets; i++) {
        ord[i].order = sd_mix64(seed ^ sd_mix64(keys ? keys[i] : (uint64_t)i));
        ord[i].idx = i;
    }
    qsort(ord, nbuckets, sizeof *ord, order_cmp);
    uint64_t cursor = sd_mix64(seed) % (uint64_t)nparts;
    for (size_t k = 0; k < nbuckets; k++) {
        size_t b = ord[k].idx;
        s->start[b] = (int)cursor;
        cursor = (cursor + counts[b] % (uint64_t)nparts) % (uint64_t)nparts;
    }
    free(ord);
    return SD_OK;
}

/* The part for the next record of bucket b (in input order). */
int sd_splitter_next(sd_splitter *s, size_t b)
{
    uint64_t k = s->seen[b]++;
    return (int)(((uint64_t)s->start[b] + k) % (uint64_t)s->nparts);
}

/* Free the tables. */
void sd_splitter_free(sd_splitter *s)
{
    free(s->start);
    free(s->seen);
    s->start = NULL;
    s->seen = NULL;
}

/* Find the one %d / %0Nd conversion in pattern (other '%' must be "%%").
 * Returns its offset, -1 if there is none or more than one; *width gets N. */
static long find_conv(const char *pattern, int *width, size_t *conv_len)
{
    long at = -1;
    for (size_t i = 0; pattern[i]; i++) {
        if (pattern[i] != '%') continue;
        if (pattern[i + 1] == '%') {
            i++;
            continue;
        }
        size_t j = i + 1;
        int wd = 0;
        while (pattern[j] >= '0' && pattern[j] <= '9' && wd < 100) wd = wd * 10 + (pattern[j++] - '0');
        if (pattern[j] != 'd' || at >= 0 || wd > 20) return -1;
        at = (long)i;
        *width = wd;
        *conv_len = j + 1 - i;
        i = j;
    }
    return at;
}

/* Does pattern hold exactly one %d (or %0Nd) and nothing else printf-like? */
int sd_part_pattern_ok(const char *pattern)
{
    int w;
    size_t cl;
    return find_conv(pattern, &w, &cl) >= 0;
}

/* The pattern with its conversion replaced by piece (a part number or a
 * glob's '*') and "%%" by '%', without handing the user's text to printf
 * as a format. Returns 0 on success, -1 if it does not fit. */
static int fill_pattern(const char *pattern, const char *piece_at_conv, char *out, size_t cap)
{
    int width = 0;
    size_t cl = 0;
    long at = find_conv(pattern, &width, &cl);
    if (at < 0) return -1;
    size_t o = 0;
    for (size_t i = 0; pattern[i]; i++) {
        const char *piece;
        size_t pl;
        if ((long)i == at) {
            piece = piece_at_conv;
            pl = strlen(piece);
            i += cl - 1;
        } else if (pattern[i] == '%') {
            piece = "%";
            pl = 1;
            i++; /* "%%" */
        } else {
            piece = pattern + i;
            pl = 1;
        }
        if (o + pl >= cap) return -1;
        memcpy(out + o, piece, pl);
        o += pl;
    }
    out[o] = 0;
    return 0;
}

/* Build a part's file name from the pattern. Returns 0 on success, -1 if
 * it does not fit. */
int sd_part_name(const char *pattern, int part, char *out, size_t cap)
{
    int width = 0;
    size_t cl = 0;
    if (find_conv(pattern, &width, &cl) < 0) return -1;
    char num[32];
    snprintf(num, sizeof num, "%0*d", width, part);
    return fill_pattern(pattern, num, out, cap);
}

/* The shell glob that matches every part name of pattern (the number as
 * '*'), for messages. Returns 0, or -1 if it does not fit. */
int sd_part_glob(const char *pattern, char *out, size_t cap)
{
    return fill_pattern(pattern, "*", out, cap);
}

/* Parts numbered nparts and up that exist: left by an earlier split into
 * more parts, they match the same glob as this split's parts and would be
 * read with them. The scan stops at the first missing number from
 * nparts + 3 on (so a gap or two in an old set is stepped over). Their
 * names, comma-separated, go to list (cut short with ", ..."); returns how
 * many exist. */
int sd_part_leftovers(const char *pattern, int nparts, char *list, size_t cap)
{
    int found = 0, cut = 0;
    size_t len = 0;
    if (cap) list[0] = 0;
    for (long i = nparts; i < 2000000000L; i++) {
        char name[4096];
        struct stat sb;
        if (sd_part_name(pattern, (int)i, name, sizeof name) != 0) break;
        if (lstat(name, &sb) != 0) {
            if (i >= (long)nparts + 3) break;
            continue;
        }
        found++;
        if (cut) continue;
        if (len + strlen(name) + 8 < cap) {
            len += (size_t)snprintf(list + len, cap - len, "%s%s", found > 1 ? ", " : "", name);
        } else {
            cut = 1;
            if (len + 6 < cap) len += (size_t)snprintf(list + len, cap - len, ", ...");
        }
    }
    return found;
}

/* Empty streaming splitter over nparts parts. */
sd_status sd_stream_splitter_init(sd_stream_splitter *s, int nparts, uint64_t seed, sd_error *err)
{
    memset(s, 0, sizeof *s);
    if (nparts < 1) return sd_err_set(err, SD_EINVAL, "need at least one part");
    s->nparts = nparts;
    s->seed = seed;
    return SD_OK;
}

/* The pending state of bucket (dense index), created on first use. */
static sd_split_pending *pending(sd_stream_splitter *s, size_t bucket, uint64_t key)
{
    if (bucket >= s->nb) {
        size_t nb = bucket + 1 > s->nb * 2 ? bucket + 1 : s->nb * 2;
        sd_split_pending *n = realloc(s->b, nb * sizeof *n);
        if (!n) return NULL;
        memset(n + s->nb, 0, (nb - s->nb) * sizeof *n);
        s->b = n;
        s->nb = nb;
    }
    sd_split_pending *p = &s->b[bucket];
    if (!p->lens) {
        p->lens = calloc((size_t)s->nparts, sizeof *p->lens);
        if (!p->lens) return NULL;
        p->key = key;
        p->base = (int)(sd_mix64(s->seed ^ sd_mix64(key)) % (uint64_t)s->nparts);
    }
    return p;
}

/* Write the npend held records of p to parts first, first+1, ... (mod N). */
static int release(const sd_stream_splitter *s, sd_split_pending *p, int first, sd_part_write_fn fn, void *ctx)
{
    size_t off = 0;
    for (int j = 0; j < p->npend; j++) {
        if (fn(ctx, (first + j) % s->nparts, p->data + off, p->lens[j])) return -1;
        off += p->lens[j];
    }
    p->npend = 0;
    p->len = 0;
    return 0;
}

/* Take one record of a bucket (dense index, key as for sd_splitter_init);
 * writes a round through fn when it completes. 0 ok, -1 on failure. */
int sd_stream_splitter_add(sd_stream_splitter *s, size_t bucket, uint64_t key, const char *rec, size_t len,
                           sd_part_write_fn fn, void *ctx)
{
    sd_split_pending *p = pending(s, bucket, key);
    if (!p || len > UINT32_MAX) return -1;
    if (s->nparts == 1) return fn(ctx, 0, rec, len);
    if (p->len + len > p->cap) {
        size_t cap = p->cap ? p->cap : 4096;
        while (cap < p->len + len) cap *= 2;
        char *d = realloc(p->data, cap);
        if (!d) return -1;
        p->data = d;
        p->cap = cap;
    }
    memcpy(p->data + p->len, rec, len);
    p->len += len;
    p->lens[p->npend++] = (uint32_t)len;
    return p->npend == s->nparts ? release(s, p, p->base, fn, ctx) : 0;
}

/* Lay the incomplete rounds end to end around the ring, buckets in the same
 * seeded order sd_splitter uses, so part totals differ by at most one. */
int sd_stream_splitter_finish(sd_stream_splitter *s, sd_part_write_fn fn, void *ctx)
{
    bucket_order *ord = malloc((s->nb ? s->nb : 1) * sizeof *ord);
    if (!ord) return -1;
    size_t n = 0;
    for (size_t i = 0; i < s->nb; i++)
        if (s->b[i].lens) {
            ord[n].order = sd_mix64(s->seed ^ sd_mix64(s->b[i].key));
            ord[n].idx = i;
            n++;
        }
    qsort(ord, n, sizeof *ord, order_cmp);
    uint64_t cursor = sd_mix64(s->seed) % (uint64_t)s->nparts;
    int rc = 0;
    for (size_t k = 0; k < n && !rc; k++) {
        sd_split_pending *p = &s->b[ord[k].idx];
        int cnt = p->npend;
        rc = release(s, p, (int)cursor, fn, ctx);
        cursor = (cursor + (uint64_t)cnt) % (uint64_t)s->nparts;
    }
    free(ord);
    return rc;
}

/* Free the held records and tables. */
void sd_stream_splitter_free(sd_stream_splitter *s)
{
    for (size_t i = 0; i < s->nb; i++) {
        free(s->b[i].data);
        free(s->b[i].lens);
    }
    free(s->b);
    memset(s, 0, sizeof *s);
}

/* One warning for sd-bucket --split, sd-pack split and export-tar. */
void sd_part_warn_leftovers(const char *pattern, int nparts, const char *earlier)
{
    char list[256], glob[4200];
    int n = sd_part_leftovers(pattern, nparts, list, sizeof list);
    if (n == 0) return;
    if (sd_part_glob(pattern, glob, sizeof glob) != 0) snprintf(glob, sizeof glob, "a glob of the outputs");
    int one = n == 1;
    sd_log(SD_LOG_WARN, "%s (%d file%s) %s from an earlier %s, not this one's %d: remove %s before using %s", list, n,
           one ? "" : "s", one ? "is" : "are", earlier, nparts, one ? "it" : "them", glob);
}
