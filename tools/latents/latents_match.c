/* sd-latents --text-only: input keys that name no record exactly, matched
 * to the shard's record names the way sd-pack import-kohya --meta matches
 * a cache file to a metadata key. sd-meta's keys for a kohya metadata file
 * are sd-scripts' own (an image stem, or with --full_path the image's
 * path), while an imported cache names each record by its stem under the
 * cache directory ("cats/001"): the longest run of trailing path
 * components shared wins, a key's image extension left out. */
#include <stdlib.h>
#include <string.h>

#include "keyset.h"
#include "kohya_cache.h"
#include "latents.h"
#include "log.h"
#include "shard.h"

/* Per unmatched key: the best record so far and how deep it matched. */
typedef struct {
    char *name;  /* the record's name, or NULL */
    char *other; /* an equally good second record: ambiguous */
    int depth;
} best_match;

/* One record name against the unmatched keys: a deeper match replaces
 * the key's best, an equal one with another record makes it ambiguous. */
static sd_status consider(const sd_kohya_meta *m, best_match *best, const char *name, sd_error *err)
{
    sd_kohya_meta_match mm;
    sd_kohya_meta_find(m, name, &mm);
    if (!mm.entry) return SD_OK;
    best_match *b = &best[mm.entry - m->e];
    if (mm.depth < b->depth) return SD_OK;
    char *copy = strdup(name);
    if (!copy) return sd_err_set(err, SD_ENOMEM, "out of memory");
    if (mm.depth > b->depth) {
        free(b->name);
        free(b->other);
        b->name = copy;
        b->other = NULL;
        b->depth = mm.depth;
    } else if (!b->other) {
        b->other = copy;
    } else {
        free(copy);
    }
    return SD_OK;
}

/* Every record name of the shard through consider(). */
static sd_status scan_names(sd_shard *shard, const sd_kohya_meta *m, best_match *best, sd_error *err)
{
    sd_shard_txn *t = NULL;
    sd_shard_cursor *c = NULL;
    sd_status st = sd_shard_read_begin(shard, &t, err);
    if (!st) st = sd_shard_cursor_open(t, SD_SHARD_DB_NAMES, &c, err);
    const void *k, *v;
    size_t kl, vl;
    char name[SD_SHARD_MAX_KEY + 1];
    while (!st && (st = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err)) == SD_OK) {
        if (kl > SD_SHARD_MAX_KEY || memchr(k, 0, kl)) continue; /* sd-verify reports such names */
        memcpy(name, k, kl);
        name[kl] = 0;
        st = consider(m, best, name, err);
    }
    if (st == SD_ENOTFOUND) st = SD_OK;
    if (c) sd_shard_cursor_close(c);
    if (t) sd_shard_read_end(t);
    return st;
}

/* The jobs whose name is no record's name, by index into miss. */
static sd_status find_missing(sd_shard *shard, const job_list *jobs, size_t *miss, size_t *nmiss, sd_error *err)
{
    sd_shard_txn *t = NULL;
    sd_status st = sd_shard_read_begin(shard, &t, err);
    *nmiss = 0;
    for (size_t i = 0; i < jobs->n && !st; i++) {
        const void *k;
        size_t kl;
        sd_error e = {0};
        sd_status g = sd_shard_get_name(t, jobs->v[i].name, strlen(jobs->v[i].name), &k, &kl, &e);
        if (g == SD_ENOTFOUND) miss[(*nmiss)++] = i;
        else if (g) st = sd_err_set(err, g, "%s", e.msg);
    }
    if (t) sd_shard_read_end(t);
    return st;
}

/* The jobs whose name is no record's, renamed to the record they match
 * best; ambiguous ones are skipped into the tally, the rest are left for
 * the caller to report as missing. A record a key already names exactly,
 * or that another key matched first, is not given to a second key. */
sd_status latents_match_names(sd_shard *shard, job_list *jobs, sd_tally *tally, sd_error *err)
{
    size_t *miss = malloc((jobs->n ? jobs->n : 1) * sizeof *miss), nmiss = 0;
    if (!miss) return sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_status st = find_missing(shard, jobs, miss, &nmiss, err);
    const char **keys = st || !nmiss ? NULL : malloc(nmiss * sizeof *keys);
    best_match *best = keys ? calloc(nmiss, sizeof *best) : NULL;
    if (!st && nmiss && (!keys || !best)) st = sd_err_set(err, SD_ENOMEM, "out of memory");
    sd_kohya_meta m;
    int indexed = 0;
    if (!st && nmiss) {
        for (size_t i = 0; i < nmiss; i++) keys[i] = jobs->v[miss[i]].name;
        st = sd_kohya_meta_index_keys(&m, keys, nmiss, err);
        indexed = 1;
        if (!st) st = scan_names(shard, &m, best, err);
    }
    sd_keyset taken; /* the record names some job holds */
    sd_keyset_init(&taken);
    for (size_t i = 0; i < jobs->n && !st && nmiss; i++)
        if (sd_keyset_insert(&taken, sd_key128_of(jobs->v[i].name, strlen(jobs->v[i].name))) < 0)
            st = sd_err_set(err, SD_ENOMEM, "out of memory");
    size_t matched = 0;
    for (size_t i = 0; i < nmiss && !st; i++) {
        latent_job *j = &jobs->v[miss[i]];
        best_match *b = &best[i];
        if (!b->name) continue;
        if (b->other) {
            sd_skip(tally, "ambiguous record name", "input line %llu: key %s matches records %s and %s equally well",
                    (unsigned long long)j->line, j->name, b->name, b->other);
            j->state = JOB_DONE;
            continue;
        }
        int fresh = sd_keyset_insert(&taken, sd_key128_of(b->name, strlen(b->name)));
        if (fresh < 0) {
            st = sd_err_set(err, SD_ENOMEM, "out of memory");
        } else if (!fresh) {
            sd_skip(tally, "record named by another key", "input line %llu: key %s matches record %s, which another "
                    "key names", (unsigned long long)j->line, j->name, b->name);
            j->state = JOB_DONE;
        } else {
            if (matched++ == 0)
                sd_log(SD_LOG_INFO, "keys matched to records by their trailing path components, as import-kohya "
                       "--meta matches them: %s -> %s (first of them)", j->name, b->name);
            free(j->name);
            j->name = b->name;
            b->name = NULL;
        }
    }
    if (!st && matched) sd_log(SD_LOG_INFO, "%zu keys matched to records by path", matched);
    for (size_t i = 0; best && i < nmiss; i++) {
        free(best[i].name);
        free(best[i].other);
    }
    if (indexed) sd_kohya_meta_free(&m);
    sd_keyset_free(&taken);
    free(best);
    free(keys);
    free(miss);
    return st;
}
