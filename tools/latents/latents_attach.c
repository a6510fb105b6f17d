/* sd-latents --text-only: CLIP text embeddings for the latent records a
 * shard already holds, attached by record name from the captions of a
 * JSONL stream. For caches made without them: sd-pack import-kohya of an
 * SD 1.x/2.x cache (sd-scripts caches text-encoder outputs only for SDXL),
 * or sd-latents run without --text. A record keeps its key, latents and
 * header; only its text reference changes, in the same transaction as the
 * text records it names, so after a kill every record is either as it was
 * or done, and a rerun skips what is done (its reference is already this
 * caption's key under this encoder). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "buf.h"
#include "json.h"
#include "log.h"
#include "pool.h"
#include "progress.h"
#include "shard.h"
#include "latents.h"
#include "latents_text.h"

typedef struct {
    const latents_opts *o;
    sd_shard *shard;
    job_list jobs;
    text_cache text;
    int text_ok;
    void *cuda;
    sd_pool *pool;
    sd_tally tally;
    uint8_t empty_key[16];
    sd_buf trec;      /* a text record being built */
    sd_buf *vals;     /* the window's rebuilt latent records */
    sd_buf *keys;     /* and their record keys */
    size_t nvals;
    int meta_pending; /* text_encoder, empty_text, dtypes go into the first transaction */
    uint64_t attached, replaced, done, left_without;
} attach;

/* The shard's text encoder setup against this run's: embeddings of
 * another setup (encoder, clip skip, dtype, numerics) must not be mixed
 * with these in one shard, since the trainer treats a shard as one setup. */
static sd_status check_encoder(attach *a, sd_error *err)
{
    char *old = NULL;
    sd_error e = {0};
    sd_status st = sd_shard_meta_get(a->shard, SD_SHARD_META_TEXT_ENCODER, &old, &e);
    if (st == SD_ENOTFOUND) return SD_OK;
    if (st) return sd_err_set(err, st, "%s", e.msg);
    if (strcmp(old, a->text.ident) != 0)
        st = sd_err_set(err, SD_EINVAL,
                        "%s holds text embeddings of another text encoder setup ('%s'; this run's is '%s'); "
                        "attach them to a shard made without embeddings (sd-pack import-kohya, sd-latents "
                        "without --text)",
                        sd_shard_path(a->shard), old, a->text.ident);
    free(old);
    return st;
}

/* Whether the record under key has the job's caption variants stored
 * (none when it has one caption). */
static int variants_as_stored(sd_shard_txn *t, const void *key, size_t klen, const latent_job *j)
{
    const uint8_t *refs;
    size_t n;
    sd_status g = sd_shard_get_variants(t, key, klen, &refs, &n, NULL);
    if (g == SD_ENOTFOUND) return j->nvariants == 0;
    return !g && n == (size_t)j->nvariants && !memcmp(refs, j->variant_keys, n * 16);
}

/* Mark each job done (its record already refers to this caption's
 * embedding), stale (it refers to another one: replaced) or to do;
 * a name with no latent record in the shard is reported and skipped. */
static sd_status classify(attach *a, sd_error *err)
{
    sd_shard_txn *t = NULL;
    sd_status st = sd_shard_read_begin(a->shard, &t, err);
    for (size_t i = 0; i < a->jobs.n && !st; i++) {
        latent_job *j = &a->jobs.v[i];
        if (j->state == JOB_DONE) continue; /* skipped by latents_match_names */
        text_key(&a->text, j->caption, j->caption_len, j->text_key);
        if (j->nvariants && !(j->variant_keys = malloc((size_t)j->nvariants * 16))) j->nvariants = 0; /* out of memory: the caption alone */
        for (int v = 0; v < j->nvariants; v++) text_key(&a->text, j->variants[v], j->variant_lens[v], j->variant_keys + 16 * v);
        const void *k, *v;
        size_t kl, vl;
        sd_error e = {0};
        sd_status g = sd_shard_get_name(t, j->name, strlen(j->name), &k, &kl, &e);
        if (!g) g = sd_shard_get(t, k, kl, &v, &vl, &e);
        sd_shard_rec r;
        if (g == SD_ENOTFOUND) {
            sd_skip(&a->tally, "no latent record of this name", "%s: record %s is not in %s", a->o->input, j->name,
                    sd_shard_path(a->shard));
            j->state = JOB_DONE;
            continue;
        }
        if (g) {
            st = sd_err_set(err, g, "%s", e.msg);
            break;
        }
        g = sd_shard_rec_parse(v, vl, &r, &e);
        if (!g) g = sd_shard_rec_check_payload(&r, &e);
        if (!g && (r.name_len != strlen(j->name) || memcmp(r.name, j->name, r.name_len) != 0))
            g = sd_err_set(&e, SD_EFORMAT, "the names index leads to a record of another name");
        if (g) {
            sd_skip(&a->tally, "corrupt record (sd-verify)", "%s: record %s: %s", sd_shard_path(a->shard), j->name,
                    e.msg);
            j->state = JOB_DONE;
        } else if (!memcmp(r.text_ref, j->text_key, 16)) {
            j->state = JOB_DONE;
            j->variants_stale = !variants_as_stored(t, k, kl, j);
            a->done += !j->variants_stale;
        } else {
            static const uint8_t zero[16];
            j->state = memcmp(r.text_ref, zero, 16) ? JOB_STALE : JOB_TODO;
        }
    }
    if (t) sd_shard_read_end(t);
    return st;
}

/* The record named name, as stored but for its text reference, rebuilt
 * into key (its record key) and val, read in t (the writer's lock keeps it
 * current until the caller puts it back). Its payload checksum and name
 * are checked first (SD_EFORMAT when damaged), since the rebuild computes
 * a fresh checksum that would hide the damage for good. */
sd_status latents_retext_record(sd_shard_txn *t, const char *name, const uint8_t text_ref[16], sd_buf *key,
                                sd_buf *val, sd_error *err)
{
    const void *k, *v;
    size_t kl, vl;
    sd_shard_rec r;
    sd_status st = sd_shard_get_name(t, name, strlen(name), &k, &kl, err);
    if (!st) st = sd_shard_get(t, k, kl, &v, &vl, err);
    if (!st) st = sd_shard_rec_parse(v, vl, &r, err);
    if (!st) st = sd_shard_rec_check_payload(&r, err) ? SD_EFORMAT : SD_OK;
    if (!st && (r.name_len != strlen(name) || memcmp(r.name, name, r.name_len) != 0))
        st = sd_err_set(err, SD_EFORMAT, "the names index leads to a record of another name");
    if (st) return st;
    sd_buf_clear(key);
    sd_buf_put(key, k, kl);
    memcpy(r.text_ref, text_ref, 16);
    st = sd_shard_rec_build(&r, val, err); /* copies the tensors out of the map */
    if (!st && key->oom) st = sd_err_set(err, SD_ENOMEM, "out of memory");
    return st;
}

/* The dtypes meta entry (JSON, old: its value or NULL) with its text
 * member set to dtype and every other member kept. */
static sd_status set_text_dtype(sd_shard *s, char *old, const char *dtype, sd_error *err)
{
    sd_arena ar;
    sd_arena_init(&ar, 1 << 12);
    sd_json *root = NULL;
    sd_buf b;
    sd_buf_init(&b);
    int first = 1;
    sd_buf_putc(&b, '{');
    if (old && sd_json_parse(&ar, old, strlen(old), &root, NULL) == SD_OK && root->type == SD_JSON_OBJECT)
        for (const sd_json *m = root->child; m; m = m->next)
            if (strcmp(m->key, "text") != 0) {
                sd_buf_json_key(&b, &first, m->key);
                sd_json_write(&b, m);
            }
    sd_buf_json_key(&b, &first, "text");
    sd_buf_json_cstr(&b, dtype);
    sd_buf_putc(&b, '}');
    sd_status st = b.oom ? sd_err_set(err, SD_ENOMEM, "out of memory")
                         : sd_shard_meta_set(s, SD_SHARD_META_DTYPES, sd_buf_cstr(&b), err);
    sd_buf_free(&b);
    sd_arena_free(&ar);
    return st;
}

/* The meta that says which embeddings the shard holds: the encoder
 * setup, the empty caption's key (its record stored, for conditioning
 * dropout) and the text member of dtypes, in the open transaction. */
static sd_status write_meta(attach *a, sd_error *err)
{
    char hex[33], *old = NULL;
    sd_shard_text_key_hex(a->empty_key, hex);
    sd_status st = text_put(&a->text, a->shard, "", 0, a->empty_key, &a->trec, err);
    if (!st) st = sd_shard_meta_set(a->shard, SD_SHARD_META_EMPTY_TEXT, hex, err);
    if (!st) st = sd_shard_meta_set(a->shard, SD_SHARD_META_TEXT_ENCODER, a->text.ident, err);
    if (st) return st;
    sd_error e = {0};
    sd_status g = sd_shard_meta_get(a->shard, SD_SHARD_META_DTYPES, &old, &e);
    if (g && g != SD_ENOTFOUND) return sd_err_set(err, g, "%s", e.msg);
    st = set_text_dtype(a->shard, old, sd_dtype_name(a->text.dtype), err);
    free(old);
    return st;
}

/* The text meta (empty_text, text_encoder, dtypes) and the empty caption's
 * embedding (conditioning dropout) written again, in their own
 * transaction, when the shard lost them while records still refer to this
 * setup's embeddings: the embedding deleted by sd-verify --repair, or the
 * meta gone with a salvage that took it from before the attach. Otherwise
 * only the first transaction with records to attach writes them, and a
 * rerun with every record attached left the shard without them for good.
 * A shard with nothing attached gets them with its first attached records,
 * as before: never an encoder identity on a shard with none attached. */
static sd_status restore_empty(attach *a, sd_error *err)
{
    int lost = 0;
    sd_status st = text_empty_lost(a->shard, a->empty_key, &lost, err);
    if (st || !lost || (lost == 1 && a->done == 0)) return st;
    sd_log(SD_LOG_INFO, "%s: %s: stored again", a->o->output,
           lost == 2 ? "the empty caption's embedding (for conditioning dropout) is missing"
                     : "its text meta (empty_text, text_encoder) is missing while records refer to these embeddings");
    st = sd_shard_begin(a->shard, err);
    if (st) return st;
    st = write_meta(a, err);
    if (!st) st = sd_shard_commit(a->shard, err);
    else sd_shard_abort(a->shard);
    if (!st) a->meta_pending = 0;
    return st;
}

/* Up to --text-batch jobs with work (a new reference, or new caption
 * variants) from *next on, rebuilt (read in one snapshot, which the
 * writer's lock keeps current) into jobs (*m of them); their captions,
 * each variant, into caps/lens/keys (*ncap; room for --text-batch +
 * SD_SHARD_MAX_VARIANTS). */
static sd_status window(attach *a, size_t *next, const char **caps, size_t *lens, const uint8_t **tkeys,
                        latent_job **jobs, size_t *m, size_t *ncap, sd_error *err)
{
    sd_shard_txn *t = NULL;
    sd_status st = sd_shard_read_begin(a->shard, &t, err);
    a->nvals = 0;
    *m = *ncap = 0;
    for (; !st && *next < a->jobs.n && *ncap < (size_t)a->o->text_batch; ++*next) {
        latent_job *j = &a->jobs.v[*next];
        if (j->state == JOB_DONE && !j->variants_stale) continue;
        st = latents_retext_record(t, j->name, j->text_key, &a->keys[a->nvals], &a->vals[a->nvals], err);
        if (st) break;
        a->nvals++;
        if (!j->nvariants) {
            caps[*ncap] = j->caption;
            lens[*ncap] = j->caption_len;
            tkeys[(*ncap)++] = j->text_key;
        }
        for (int v = 0; v < j->nvariants; v++) {
            caps[*ncap] = j->variants[v];
            lens[*ncap] = j->variant_lens[v];
            tkeys[(*ncap)++] = j->variant_keys + 16 * v;
        }
        jobs[(*m)++] = j;
    }
    if (t) sd_shard_read_end(t);
    return st;
}

/* Every job to do, --text-batch per transaction: their captions' missing
 * embeddings encoded together and stored, then their records put back
 * with the new references. */
static sd_status run_windows(attach *a, sd_error *err)
{
    size_t w = (size_t)a->o->text_batch, todo = 0, next = 0, done = 0, ncap = 0;
    size_t wc = w + SD_SHARD_MAX_VARIANTS; /* captions: a window's last job may bring all its variants */
    const char **caps = malloc(wc * sizeof(*caps));
    size_t *lens = malloc(wc * sizeof(*lens));
    const uint8_t **tkeys = malloc(wc * sizeof(*tkeys));
    latent_job **jobs = malloc(w * sizeof(*jobs));
    a->vals = calloc(w, sizeof(*a->vals));
    a->keys = calloc(w, sizeof(*a->keys));
    sd_status st = caps && lens && tkeys && jobs && a->vals && a->keys ? SD_OK
                                                                        : sd_err_set(err, SD_ENOMEM, "out of memory");
    for (size_t i = 0; i < a->jobs.n; i++) todo += a->jobs.v[i].state != JOB_DONE || a->jobs.v[i].variants_stale;
    sd_progress prog;
    sd_progress_init(&prog, "sd-latents text-only", "records", todo, !a->o->quiet);
    size_t m = 0;
    while (!st && todo && (st = window(a, &next, caps, lens, tkeys, jobs, &m, &ncap, err)) == SD_OK && m > 0) {
        st = sd_shard_begin(a->shard, err);
        if (st) break;
        if (a->meta_pending) st = write_meta(a, err);
        if (!st) st = text_put_many(&a->text, a->shard, ncap, caps, lens, tkeys, &a->trec, err);
        for (size_t i = 0; i < m && !st; i++) {
            st = sd_shard_put(a->shard, a->keys[i].data, a->keys[i].len, a->vals[i].data, a->vals[i].len, err);
            if (!st)
                st = sd_shard_put_variants(a->shard, a->keys[i].data, a->keys[i].len, jobs[i]->variant_keys,
                                           (size_t)jobs[i]->nvariants, err);
        }
        if (!st) st = sd_shard_commit(a->shard, err);
        else sd_shard_abort(a->shard);
        if (st) break;
        a->meta_pending = 0;
        for (size_t i = 0; i < m; i++) {
            a->attached++;
            a->replaced += jobs[i]->state == JOB_STALE;
        }
        done += m;
        sd_progress_update(&prog, done, 0);
    }
    sd_progress_finish(&prog);
    for (size_t i = 0; a->vals && i < w; i++) sd_buf_free(&a->vals[i]);
    for (size_t i = 0; a->keys && i < w; i++) sd_buf_free(&a->keys[i]);
    free(a->vals);
    free(a->keys);
    a->vals = a->keys = NULL;
    free(caps);
    free(lens);
    free(tkeys);
    free(jobs);
    return st;
}

/* Latent records of the shard that still refer to no text embedding
 * (no line of the input named them): sd-train skips those. */
static sd_status count_without(attach *a, sd_error *err)
{
    sd_shard_txn *t = NULL;
    sd_shard_cursor *c = NULL;
    static const uint8_t zero[16];
    sd_status st = sd_shard_read_begin(a->shard, &t, err);
    if (!st) st = sd_shard_cursor_open(t, SD_SHARD_DB_LATENTS, &c, err);
    while (!st) {
        const void *k, *v;
        size_t kl, vl;
        sd_shard_rec r;
        sd_status g = sd_shard_cursor_next(c, &k, &kl, &v, &vl, err);
        if (g == SD_ENOTFOUND) break;
        if (g) st = g;
        else if (sd_shard_rec_parse(v, vl, &r, NULL) == SD_OK && !memcmp(r.text_ref, zero, 16))
            a->left_without++;
    }
    if (c) sd_shard_cursor_close(c);
    if (t) sd_shard_read_end(t);
    return st;
}

/* The text encoders on the CPU pool, or on --device cuda:K. */
static sd_status open_device(attach *a, sd_error *err)
{
    const sd_backend *be = sd_backend_cpu();
    void *exec = a->pool;
    if (a->o->cuda_device >= 0) {
        sd_status st = latents_cuda_open(a->o, &a->cuda, &be, err);
        if (st) return st;
        exec = a->cuda;
        sd_log(SD_LOG_INFO, "text encoders on cuda:%d", a->o->cuda_device);
    }
    return text_device(&a->text, be, exec, err);
}

/* Open the encoders, read the captions, open the shard, attach, report. */
int latents_attach(const latents_opts *o)
{
    attach a;
    memset(&a, 0, sizeof a);
    a.o = o;
    a.meta_pending = 1;
    sd_buf_init(&a.trec);
    sd_tally_init(&a.tally, o->verbose ? -1 : 10);
    sd_error err = {0};
    int dtype = latents_dtype(o->dtype_name);
    int wdt = o->text_weights ? latents_dtype(o->text_weights) : SD_DT_F32; /* sd_latents.c checked both */
    sd_status st = text_open(&a.text, o->text_model, o->tokenizer, o->clip_skip, o->max_tokens ? o->max_tokens : 75,
                             dtype, wdt, latents_numerics(o), &err);
    a.text_ok = !st;
    if (!st) text_key(&a.text, "", 0, a.empty_key);
    if (!st) st = jobs_read(&a.jobs, o->input, 0, 1, 1, NULL, &a.tally, &err);
    sd_shard_opts so = {o->nosync ? SD_SHARD_NOSYNC : 0, 0, 0}; /* no SD_SHARD_CREATE: the records must exist */
    if (!st) st = sd_shard_open(&a.shard, o->output, &so, &err);
    if (!st) st = check_encoder(&a, &err);
    if (!st) st = latents_match_names(a.shard, &a.jobs, &a.tally, &err);
    if (!st) st = classify(&a, &err);
    if (!st) {
        a.pool = o->threads > 1 ? sd_pool_create(o->threads) : NULL;
        st = open_device(&a, &err);
    }
    if (!st) st = restore_empty(&a, &err);
    if (!st) {
        sd_log(SD_LOG_INFO, "%zu captions read (%llu lines), %llu records already refer to theirs", a.jobs.n,
               (unsigned long long)a.jobs.lines, (unsigned long long)a.done);
        st = run_windows(&a, &err);
    }
    if (!st) st = count_without(&a, &err);
    if (st) sd_log(SD_LOG_ERROR, "%s", err.msg);
    else {
        sd_log(SD_LOG_INFO,
               "text embeddings attached to %llu records (%llu had another one), %llu already attached; "
               "%llu captions looked up, %llu embeddings computed (%.1f captions/s), %llu already stored",
               (unsigned long long)a.attached, (unsigned long long)a.replaced, (unsigned long long)a.done,
               (unsigned long long)a.text.total, (unsigned long long)a.text.encoded,
               a.text.seconds > 0 ? (double)a.text.encoded / a.text.seconds : 0, (unsigned long long)a.text.reused);
        if (a.left_without)
            sd_log(SD_LOG_WARN, "%s: %llu latent records still have no text embedding (no input line names them); "
                   "sd-train skips them", o->output, (unsigned long long)a.left_without);
    }
    if (a.text.cut)
        sd_log(SD_LOG_WARN, "text: %llu captions had more than %d tokens and were cut to them (as the encoders "
               "do); --max-tokens 150 or 225 keeps up to that many, as sd-scripts' --max_token_length",
               (unsigned long long)a.text.cut, a.text.max_tokens);
    sd_tally_log(&a.tally, "skipped by reason");
    int code = st ? SD_EXIT_FATAL : (o->strict && a.tally.total ? SD_EXIT_SKIPPED : SD_EXIT_OK);
    if (a.shard) {
        sd_error e = {0};
        if (sd_shard_close(a.shard, &e)) {
            sd_log(SD_LOG_ERROR, "%s", e.msg);
            code = SD_EXIT_FATAL;
        }
    }
    jobs_free(&a.jobs);
    if (a.text_ok) text_close(&a.text); /* its runners' device memory goes before the context */
    if (a.pool) sd_pool_destroy(a.pool);
    latents_cuda_close(a.cuda);
    sd_buf_free(&a.trec);
    return code;
}
