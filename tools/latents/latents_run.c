/* sd-latents: decode + resize + crop (libvips), VAE encode (the engine),
 * write records into one LMDB shard, one transaction per batch, so a kill
 * loses at most the batches in flight and a rerun skips what is stored.
 * On a GPU the encode of one batch overlaps the decode of the next and the
 * writing of the one before (run_batches).
 *
 * Batches are cut at fixed positions of the bucket-sorted job list (every
 * `batch` jobs of one bucket), whatever is already stored, so a resumed run
 * encodes exactly the batches an uninterrupted run would have: with the
 * engine's thread-count-independent ops, the shard's records are then
 * bit-identical to an uninterrupted run's. With --text the captions come
 * first, in their own transactions (run_texts), so the text encoder sees
 * several captions per call whatever the image batch is. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "backend.h"
#include "buf.h"
#include "cli.h"
#include "dtoa.h"
#include "hash.h"
#include "imghdr.h"
#include "json.h"
#include "keyset.h"
#include "log.h"
#include "pool.h"
#include "progress.h"
#include "shard.h"
#include "latents.h"
#include "latents_text.h"
#include "vae.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif

typedef struct {
    const latents_opts *o;
    sd_vae vae;
    const sd_backend *be;
    sd_pool *pool;
    sd_shard *shard;
    job_list jobs;
    sd_tally tally;
    int dtype;
    char model_hash[17];   /* the VAE's identity: weights and encoder config (vae_identity) */
    char weights_hash[17]; /* the weights alone: model_hash before the config joined it */
    char vae_desc[256];    /* the encoder config as hashed, for meta and logs */
    int scale_changed;     /* --scale differs from the shard's scaling_factor: meta rewritten up front */
    float *img, *mean, *std, *ws;
    size_t img_cap, lat_cap, std_cap, ws_cap;
    float *img_spare; /* a batch decoded again for its retry (collect_or_retry) while img holds the next */
    size_t spare_cap;
    sd_vae_runner runner; /* the VAE on its device (the CPU, or a GPU with --device cuda:K) */
    int runner_ok;
    void *cuda;           /* sd_cuda * when a GPU runs the VAE and the text encoders */
    sd_status *dec_st; /* per job of a batch */
    const char **dec_why; /* its skip reason when dec_st is set */
    char (*dec_msg)[1024]; /* an sd_error message per image */
    sd_buf conv; /* the record's tensors in the stored dtype */
    sd_buf rec, trec;
    int text_on;
    text_cache text;
    uint8_t empty_key[16];
    int meta_pending; /* the shard's meta goes into the next transaction */
    double t_decode, t_encode, t_write;
    uint64_t written, cached, bad, replaced;
    uint64_t retexted; /* records whose caption changed: new text reference, no image encoded */
    uint64_t revaried; /* records whose caption variants alone changed: their variants entry rewritten */
    sd_buf *rt_keys, *rt_vals; /* run_texts: a window's retext records */
    latent_job **rt_jobs;      /* and their jobs */
} run;

/* Grow a float buffer to at least n floats (contents not kept). */
static int ensure(float **p, size_t *cap, size_t n)
{
    if (n <= *cap) return 0;
    free(*p);
    *p = aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
    *cap = *p ? n : 0;
    return *p ? 0 : -1;
}

/* The seed that decides the stored bytes: --seed only with --sample (the
 * mean and std draw no noise), 0 otherwise, as keys made before had it. */
static uint64_t key_seed(const latents_opts *o)
{
    return o->sample ? o->seed : 0;
}

/* A record key: XXH3-128 of everything that decides the stored latents
 * (name, plan, tar member, mode, flip, dtype, --sample's seed, the VAE's
 * weights and config, numerics), after prefix (a text key, or nothing). */
static void key_of(const run *r, const latent_job *j, const uint8_t *prefix, uint8_t out[16])
{
    sd_buf b;
    sd_buf_init(&b);
    if (prefix) sd_buf_put(&b, prefix, 16);
    sd_buf_printf(&b, "%s%c%d,%d,%d,%d,%d,%d|%d,%d|%s|%d|%d|%d|%llu|%s", j->name, 0, j->plan.resize_w,
                  j->plan.resize_h, j->plan.crop_l, j->plan.crop_t, j->plan.crop_r, j->plan.crop_b, j->orig_w,
                  j->orig_h, j->member ? j->member : "", r->o->sample, r->o->flip, r->dtype,
                  (unsigned long long)key_seed(r->o), r->model_hash);
    sd_buf_puts(&b, latents_numerics(r->o)); /* other numerics: other records (nothing added for strict fp32) */
    if (r->o->vae_act) sd_buf_puts(&b, r->o->vae_act == SD_DT_BF16 ? "|act-bf16" : "|act-fp16");
    if (r->o->masks) sd_buf_puts(&b, r->o->masks == LATENTS_MASK_ALPHA ? "|mask-alpha" : "|mask-files");
    sd_key128 k = sd_key128_of(b.data, b.len);
    memcpy(out, &k.lo, 8);
    memcpy(out + 8, &k.hi, 8);
    sd_buf_free(&b);
}

/* The job's record key (key_of, no prefix: a changed plan or model is a
 * new key, a rerun with the same inputs finds its records) and with
 * --text its caption's text key. The caption stays out of the record key,
 * so an edited caption changes only the record's text reference (no image
 * is encoded again) and a run without --text keeps the references. */
static void job_key(const run *r, latent_job *j)
{
    if (r->text_on) text_key(&r->text, j->caption, j->caption_len, j->text_key);
    if (r->text_on && j->nvariants && !j->variant_keys) {
        j->variant_keys = malloc((size_t)j->nvariants * 16);
        if (!j->variant_keys) j->nvariants = 0; /* out of memory: the first caption alone */
        for (int i = 0; i < j->nvariants; i++) text_key(&r->text, j->variants[i], j->variant_lens[i], j->variant_keys + 16 * i);
    }
    key_of(r, j, NULL, j->key);
}

/* Whether the shard's variants entry for key is the job's (none when it
 * has one caption): a rerun whose variants changed rewrites the entry
 * alone. */
static int variants_match(sd_shard_txn *t, const latent_job *j, const void *key)
{
    const uint8_t *refs;
    size_t n;
    sd_status g = sd_shard_get_variants(t, key, 16, &refs, &n, NULL);
    if (g == SD_ENOTFOUND) return j->nvariants == 0;
    return !g && n == (size_t)j->nvariants && !memcmp(refs, j->variant_keys, n * 16);
}

/* Put the job's variants entry under key (deleted when it has one caption). */
static sd_status put_variants(run *r, const latent_job *j, const void *key, sd_error *err)
{
    return sd_shard_put_variants(r->shard, key, 16, j->variant_keys, (size_t)j->nvariants, err);
}

/* The text reference in the header of the record stored under key
 * (zeros: none); 0 on success, -1 when it cannot be read (then it is
 * encoded again). The payload is checked only before a rewrite
 * (latents_retext_record): a resume reads headers, not every latent. */
static int stored_text_ref(sd_shard_txn *t, const void *key, uint8_t ref[16])
{
    const void *v;
    size_t vl;
    sd_shard_rec rec;
    if (sd_shard_get(t, key, 16, &v, &vl, NULL) || sd_shard_rec_parse(v, vl, &rec, NULL)) return -1;
    memcpy(ref, rec.text_ref, 16);
    return 0;
}

/* Job j found under key k (16 bytes): done (its key and, with --text, its
 * caption's reference), retext (the right latents, another caption's or no
 * reference: put back with this caption's, no image encoded; rekey when it
 * also moves to the current key) or stale (other latents: encoded again).
 * A record keyed before the caption left the key (its text reference
 * hashed first) holds current latents when that old key is k: without
 * --text it stays as it is, with --text it is moved to the current key. */
static void classify_found(run *r, sd_shard_txn *t, latent_job *j, const void *k)
{
    static const uint8_t zero[16];
    uint8_t ref[16], legacy[16];
    int current = !memcmp(k, j->key, 16);
    if (current && !r->text_on) { /* the common resume: no record read */
        j->state = JOB_DONE;
        return;
    }
    int have = stored_text_ref(t, k, ref);
    if (!current && have == 0 && memcmp(ref, zero, 16)) {
        key_of(r, j, ref, legacy);
        if (!memcmp(k, legacy, 16)) { /* current latents under the old kind of key */
            j->state = !r->text_on || !memcmp(ref, j->text_key, 16) ? JOB_DONE : JOB_RETEXT;
            j->rekey = j->state == JOB_RETEXT;
            memcpy(j->old_key, k, 16);
            j->variants_stale = r->text_on && j->state == JOB_DONE && !variants_match(t, j, k);
            return;
        }
    }
    if (current && have == 0 && !memcmp(ref, j->text_key, 16)) j->state = JOB_DONE;
    else if (current && have == 0) j->state = JOB_RETEXT;
    else j->state = JOB_STALE;
    memcpy(j->old_key, k, 16);
    j->variants_stale = j->state == JOB_DONE && !variants_match(t, j, k);
}

/* Mark each job (classify_found) or, when its name is not in the shard,
 * to do. */
static sd_status classify(run *r, sd_error *err)
{
    sd_shard_txn *t = NULL;
    sd_status st = sd_shard_read_begin(r->shard, &t, err);
    for (size_t i = 0; i < r->jobs.n && !st; i++) {
        latent_job *j = &r->jobs.v[i];
        job_key(r, j);
        const void *k;
        size_t kl;
        sd_error e = {0};
        sd_status g = sd_shard_get_name(t, j->name, strlen(j->name), &k, &kl, &e);
        if (g == SD_ENOTFOUND) j->state = JOB_TODO;
        else if (g) st = sd_err_set(err, g, "%s", e.msg);
        else if (kl != 16)
            st = sd_err_set(err, SD_EFORMAT, "%s: record %s has a %zu-byte key; not written by sd-latents",
                            sd_shard_path(r->shard), j->name, kl);
        else classify_found(r, t, j, k);
    }
    if (t) sd_shard_read_end(t);
    return st;
}

/* A shard made with another VAE (weights or encoder config) must not be
 * mixed with this one. A shard whose model_hash is these weights' own hash
 * was made before the config joined model_hash: with possibly another
 * config, so its records (keyed by the old hash) are all re-encoded. */
static sd_status check_meta(run *r, sd_error *err)
{
    char *old = NULL;
    sd_error e = {0};
    sd_status st = sd_shard_meta_get(r->shard, SD_SHARD_META_MODEL, &old, &e);
    if (st == SD_ENOTFOUND) return SD_OK;
    if (st) return sd_err_set(err, st, "%s", e.msg);
    if (strcmp(old, r->weights_hash) == 0)
        sd_log(SD_LOG_WARN, "%s: made before model_hash covered the VAE's config (its model_hash %s is the weights' "
               "alone): every record is encoded again, under model_hash %s", sd_shard_path(r->shard), old,
               r->model_hash);
    else if (strcmp(old, r->model_hash) != 0)
        st = sd_err_set(err, SD_EINVAL,
                        "%s holds latents of another VAE (model_hash %s; this one's, of its weights and encoder "
                        "config, is %s); write to a new shard or remove it",
                        sd_shard_path(r->shard), old, r->model_hash);
    free(old);
    return st;
}

/* The shard's scaling_factor against this run's: the latents are stored
 * unscaled (the trainer multiplies by the meta's factor), so an explicit
 * --scale only rewrites the meta (r->scale_changed), even when every
 * record is cached; a factor that is not the command line's (config.json,
 * a guess) never silently replaces the one the shard holds. */
static sd_status check_scale(run *r, sd_error *err)
{
    char *old = NULL, now[64];
    sd_error e = {0};
    sd_status st = sd_shard_meta_get(r->shard, SD_SHARD_META_SCALING, &old, &e);
    if (st == SD_ENOTFOUND) return SD_OK;
    if (st) return sd_err_set(err, st, "%s", e.msg);
    sd_dtoa_shortest(r->vae.cfg.scaling_factor, now, sizeof now);
    char *end;
    double was = strtod(old, &end); /* by value: sd-pack writes the shortest form, older runs 17 digits */
    if (old[0] && !*end && was == r->vae.cfg.scaling_factor) {
        free(old);
        return SD_OK;
    }
    if (r->o->scale > 0) {
        sd_log(SD_LOG_WARN, "%s: scaling_factor %s in the meta becomes %s (--scale; the latents are stored unscaled, "
               "so only the meta changes)", sd_shard_path(r->shard), old, now);
        r->scale_changed = 1;
    } else {
        st = sd_err_set(err, SD_EINVAL, "%s records scaling_factor %s, this run's is %s (%s); pass --scale %s to "
                        "keep it or --scale %s to change it", sd_shard_path(r->shard), old, now,
                        r->vae.cfg.scale_source, old, now);
    }
    free(old);
    return st;
}

/* producer, model_hash, scaling_factor, dtypes and options, in the open batch. */
static sd_status write_meta(run *r, sd_error *err)
{
    char buf[512];
    const latents_opts *o = r->o;
    snprintf(buf, sizeof buf, "sd-latents %s", sd_version());
    sd_status st = sd_shard_meta_set(r->shard, SD_SHARD_META_PRODUCER, buf, err);
    if (!st) st = sd_shard_meta_set(r->shard, SD_SHARD_META_MODEL, r->model_hash, err);
    sd_dtoa_shortest(r->vae.cfg.scaling_factor, buf, sizeof buf);
    if (!st) st = sd_shard_meta_set(r->shard, SD_SHARD_META_SCALING, buf, err);
    if (r->text_on)
        snprintf(buf, sizeof buf, "{\"latent\": \"%s\", \"text\": \"%s\"}", sd_dtype_name(r->dtype),
                 sd_dtype_name(r->dtype));
    else
        snprintf(buf, sizeof buf, "{\"latent\": \"%s\"}", sd_dtype_name(r->dtype));
    if (!st) st = sd_shard_meta_set(r->shard, SD_SHARD_META_DTYPES, buf, err);
    sd_buf b;
    sd_buf_init(&b);
    sd_buf_puts(&b, "{\"vae\": ");
    sd_buf_json_cstr(&b, o->vae_path);
    sd_buf_puts(&b, ", \"vae_config\": ");
    sd_buf_json_cstr(&b, r->vae_desc);
    sd_buf_printf(&b, ", \"mode\": \"%s\", \"flip\": %s, \"seed\": %llu, \"vae_activations\": \"%s\"",
                  o->sample ? "sample" : "mean_std", o->flip ? "true" : "false", (unsigned long long)key_seed(o),
                  sd_dtype_name(o->vae_act ? o->vae_act : SD_DT_F32));
    if (o->masks) sd_buf_printf(&b, ", \"masks\": \"%s\"", o->masks == LATENTS_MASK_ALPHA ? "alpha" : "files");
    sd_buf_putc(&b, '}');
    sd_buf parts;
    sd_buf_init(&parts);
    latents_parts_json(r->shard, o, &parts); /* before the options: an older shard's part is in them */
    if (!st) st = sd_shard_meta_set(r->shard, SD_SHARD_META_OPTIONS, sd_buf_cstr(&b), err);
    if (!st) st = sd_shard_meta_set(r->shard, SD_SHARD_META_PARTS, sd_buf_cstr(&parts), err);
    sd_buf_free(&b);
    sd_buf_free(&parts);
    if (!st && r->text_on) {
        /* the empty caption's embedding, stored once for conditioning
         * dropout at train time; its key is in meta "empty_text" */
        char hex[33];
        sd_shard_text_key_hex(r->empty_key, hex);
        st = text_put(&r->text, r->shard, "", 0, r->empty_key, &r->trec, err);
        if (!st) st = sd_shard_meta_set(r->shard, SD_SHARD_META_EMPTY_TEXT, hex, err);
        if (!st) st = sd_shard_meta_set(r->shard, SD_SHARD_META_TEXT_ENCODER, r->text.ident, err);
    }
    return st;
}

/* Per batch: the jobs being decoded and where their pixels go. */
typedef struct {
    run *r;
    latent_job **jobs;
    size_t chw;
} dec_ctx;

/* Whether the file stores the image transposed (EXIF orientation 5-8,
 * which the decoders undo): the record says so, so that export-kohya names
 * the npz by the stored size, the one sd-scripts (which ignores EXIF)
 * looks for. A header that cannot be read again leaves it 0. */
static int stored_transposed(const sd_image_src *src)
{
    sd_imginfo info;
    sd_error e;
    if (!src->member) return sd_imghdr_read_file(src->path, &info, &e) == SD_OK && info.orientation >= 5;
    int fd = open(src->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    sd_status st = sd_imghdr_read_fd(fd, src->offset, src->size, &info, &e);
    close(fd);
    return st == SD_OK && info.orientation >= 5;
}

/* Decode one job per unit into its slot (with --masks its mask into the
 * job); failures are kept per job. */
static void decode_range(void *vctx, int worker, size_t begin, size_t end)
{
    dec_ctx *c = vctx;
    (void)worker;
    int lh = 0, lw = 0;
    for (size_t i = begin; i < end; i++) {
        latent_job *j = c->jobs[i];
        sd_image_src src = {.path = j->image, .member = j->member, .offset = j->offset, .size = j->size};
        sd_error e = {0};
        sd_status st = sd_image_check_member(&src, &e);
        if (st) /* another member at the recorded offset, or no tar header there */
            c->r->dec_why[i] = st == SD_EFORMAT ? "tar member changed since sd-meta" : "unreadable image";
        else {
            st = sd_image_load_chw(&src, &j->plan, c->r->img + i * c->chw, &e);
            c->r->dec_why[i] = st == SD_EINVAL         ? "record does not fit the image"
                               : st == SD_EUNSUPPORTED ? "not a supported image" /* sd-bucket's word (BMP) */
                                                       : "unreadable image";
            if (!st) j->transposed = stored_transposed(&src);
            if (!st && c->r->o->masks) {
                sd_vae_latent_size(&c->r->vae.cfg, j->bucket_h, j->bucket_w, &lh, &lw);
                const char *why = latents_mask_load(c->r->o, j, lh, lw, &e);
                if (why) {
                    c->r->dec_why[i] = why;
                    st = SD_EFORMAT;
                }
            }
        }
        c->r->dec_st[i] = st;
        if (st) snprintf(c->r->dec_msg[i], sizeof c->r->dec_msg[i], "%s", e.msg);
    }
}

/* Build job j's record (latents_record.c) and put it; with --text it
 * refers to its caption's embedding (run_texts stored it). Latents of
 * variant v of image k of the batch sit at (v * ok + k) * lat. */
static sd_status put_record(run *r, latent_job *j, size_t k, size_t ok, size_t lat, int lc, int lh, int lw,
                            sd_error *err)
{
    const uint8_t *text_ref = r->text_on ? j->text_key : NULL;
    float *mean[2] = {r->mean + k * lat, r->mean + (ok + k) * lat};
    float *std[2] = {r->std + k * lat, r->std + (ok + k) * lat};
    latent_shape ls = {lat, lc, lh, lw};
    sd_status st = latents_record(j, r->o, r->dtype, mean, std, &ls, text_ref, &r->conv, &r->rec, err);
    free(j->mask); /* in the record now */
    j->mask = NULL;
    if (!st && j->state == JOB_STALE) {
        st = sd_shard_del(r->shard, j->old_key, 16, err);
        r->replaced++;
    }
    if (!st) st = sd_shard_put(r->shard, j->key, 16, r->rec.data, r->rec.len, err);
    if (!st && r->text_on) st = put_variants(r, j, j->key, err);
    return st;
}

/* One batch between its decode and its records: the jobs that decoded
 * (ok of them; with --flip each has a mirrored copy behind the others)
 * and the bucket's image and latent sizes. */
typedef struct {
    latent_job **todo;
    size_t ok;
    int h, w, lc, lh, lw;
    size_t lat;
} batch;

/* Decode m jobs of one bucket into r->img; unreadable ones are reported,
 * counted and dropped, the rest packed to the front (b->ok of them). */
static sd_status decode_batch(run *r, batch *b, size_t m, sd_error *err)
{
    const latents_opts *o = r->o;
    latent_job **todo = b->todo;
    b->w = todo[0]->bucket_w;
    b->h = todo[0]->bucket_h;
    b->lc = r->vae.cfg.latent_channels;
    sd_vae_latent_size(&r->vae.cfg, b->h, b->w, &b->lh, &b->lw);
    b->lat = (size_t)b->lc * (size_t)b->lh * (size_t)b->lw;
    b->ok = 0;
    size_t chw = 3 * (size_t)b->w * (size_t)b->h, n = m * (size_t)(o->flip ? 2 : 1);
    if (ensure(&r->img, &r->img_cap, n * chw))
        return sd_err_set(err, SD_ENOMEM, "out of memory for a batch of %zu images of %dx%d (try a smaller --batch)",
                          n, b->w, b->h);
    double t0 = sd_now();
    dec_ctx dc = {r, todo, chw};
    sd_pool_for(r->pool, m, decode_range, &dc);
    size_t ok = 0;
    for (size_t i = 0; i < m; i++) {
        if (r->dec_st[i]) {
            sd_skip(&r->tally, r->dec_why[i], "%s (%s): %s", todo[i]->name, todo[i]->image, r->dec_msg[i]);
            r->bad++;
            todo[i] = NULL;
            continue;
        }
        if (ok != i) memmove(r->img + ok * chw, r->img + i * chw, chw * sizeof(float));
        todo[ok++] = todo[i];
    }
    if (o->flip)
        for (size_t i = 0; i < ok; i++) latents_flip_lr(r->img + (ok + i) * chw, r->img + i * chw, 3, b->h, b->w);
    b->ok = ok;
    r->t_decode += sd_now() - t0;
    return SD_OK;
}

/* Images (and flipped copies) of a batch. */
static size_t batch_images(const run *r, const batch *b)
{
    return b->ok * (size_t)(r->o->flip ? 2 : 1);
}

/* The batch's images to the VAE's device and its encode queued: on a GPU
 * it runs while the next batch decodes and this one's predecessor is
 * written; on the CPU it runs here. r->img is free again on return. */
static sd_status submit_batch(run *r, const batch *b, sd_error *err)
{
    double t0 = sd_now();
    sd_status st = sd_vae_runner_submit(&r->runner, &r->vae, (int)batch_images(r, b), b->h, b->w, r->img, err);
    r->t_encode += sd_now() - t0;
    return st;
}

/* Waits for the submitted batch's moments, into r->mean and r->std. */
static sd_status collect_batch(run *r, const batch *b, sd_error *err)
{
    size_t n = batch_images(r, b) * b->lat;
    if (ensure(&r->mean, &r->lat_cap, n) || ensure(&r->std, &r->std_cap, n))
        return sd_err_set(err, SD_ENOMEM, "out of memory for the latents of %zu images", batch_images(r, b));
    double t0 = sd_now();
    sd_status st = sd_vae_runner_collect(&r->runner, r->mean, r->std, err);
    r->t_encode += sd_now() - t0;
    return st;
}

/* collect_batch; and when the device ran out of memory encoding the
 * batch in one pass (the runner plans the encoder's workspace, not the
 * backend's own scratch: cuDNN workspaces, padded copies, attention
 * blocks), the runner goes one image at a time from now on and the batch
 * is decoded again, into a spare buffer (img holds the next batch by
 * now), and encoded so. Any other failure (host memory for the moments:
 * the runner's batch is then still pending), or one at a time already,
 * stays an error. (A run resumed after such a retry starts with whole
 * batches again: its latents may differ from an uninterrupted run's in the
 * last bits, as after the runner's own up-front fallback.) */
static sd_status collect_or_retry(run *r, batch *b, sd_error *err)
{
    sd_status st = collect_batch(r, b, err);
    if (st != SD_ENOMEM || r->runner.pending || batch_images(r, b) < 2 || !r->runner.whole_batch)
        return st; /* whole_batch: a device runner that has not gone one at a time yet */
    sd_log(SD_LOG_WARN, "%s; encoding one image at a time from now on, this batch again (a smaller --batch avoids "
           "the retry)", err->msg);
    sd_vae_runner_one_at_a_time(&r->runner);
    memset(err, 0, sizeof *err);
    float *next = r->img;
    size_t next_cap = r->img_cap;
    r->img = r->img_spare;
    r->img_cap = r->spare_cap;
    st = decode_batch(r, b, b->ok, err);
    if (!st && b->ok) st = submit_batch(r, b, err);
    if (!st && b->ok) st = collect_batch(r, b, err);
    r->img_spare = r->img;
    r->spare_cap = r->img_cap;
    r->img = next;
    r->img_cap = next_cap;
    return st;
}

/* The collected batch's records, in one transaction. */
static sd_status write_batch(run *r, const batch *b, sd_error *err)
{
    double t0 = sd_now();
    sd_status st = sd_shard_begin(r->shard, err);
    if (!st && r->meta_pending) {
        st = write_meta(r, err);
        r->meta_pending = 0;
    }
    for (size_t i = 0; i < b->ok && !st; i++) st = put_record(r, b->todo[i], i, b->ok, b->lat, b->lc, b->lh, b->lw, err);
    if (!st) st = sd_shard_commit(r->shard, err);
    else sd_shard_abort(r->shard);
    if (!st) r->written += b->ok;
    r->t_write += sd_now() - t0;
    return st;
}

/* Jobs still to do (or whose variants entry changed) from *next on, in
 * job order, into jobs, and their captions (each variant) into
 * caps/lens/keys, until --text-batch captions; returns how many jobs,
 * *ncap the captions, *next past them. caps holds --text-batch +
 * SD_SHARD_MAX_VARIANTS entries. */
static size_t text_window(run *r, size_t *next, const char **caps, size_t *lens, const uint8_t **keys,
                          latent_job **jobs, size_t *ncap)
{
    size_t m = 0, c = 0;
    for (; *next < r->jobs.n && c < (size_t)r->o->text_batch; ++*next) {
        latent_job *j = &r->jobs.v[*next];
        if (j->state == JOB_DONE && !j->variants_stale) continue;
        jobs[m++] = j;
        if (!j->nvariants) {
            caps[c] = j->caption;
            lens[c] = j->caption_len;
            keys[c++] = j->text_key;
        }
        for (int v = 0; v < j->nvariants; v++) {
            caps[c] = j->variants[v];
            lens[c] = j->variant_lens[v];
            keys[c++] = j->variant_keys + 16 * v;
        }
    }
    *ncap = c;
    return m;
}

/* The window's retext jobs' records rebuilt with their captions' keys
 * (latents_retext_record) into r->rt_keys/rt_vals and their jobs into
 * r->rt_jobs, read in one snapshot; *n: how many. A record found damaged
 * is encoded again instead (stale). */
static sd_status retext_window(run *r, latent_job *const *jobs, size_t m, size_t *n, sd_error *err)
{
    sd_shard_txn *t = NULL;
    *n = 0;
    sd_status st = SD_OK;
    for (size_t i = 0; i < m && !st; i++) {
        latent_job *j = jobs[i];
        if (j->state != JOB_RETEXT) continue;
        if (!t && (st = sd_shard_read_begin(r->shard, &t, err))) break;
        sd_error e = {0};
        sd_status g = latents_retext_record(t, j->name, j->text_key, &r->rt_keys[*n], &r->rt_vals[*n], &e);
        if (g == SD_EFORMAT) {
            sd_log(SD_LOG_WARN, "%s: record %s is damaged (%s): its image is encoded again", sd_shard_path(r->shard),
                   j->name, e.msg);
            j->state = JOB_STALE;
            j->rekey = 0;
        } else if (g) {
            st = sd_err_set(err, g, "%s", e.msg);
        } else {
            r->rt_jobs[(*n)++] = j;
        }
    }
    if (t) sd_shard_read_end(t);
    return st;
}

/* With --text, before any image: the caption of every job still to do,
 * --text-batch jobs per transaction, the shard's missing ones encoded
 * together (text_put_many: several captions per pass through the model,
 * which is what makes the CPU encoder fast, whatever --batch is). An
 * embedding does not depend on the captions beside it, so this stores
 * what one call per caption would; a kill loses at most one window, and
 * the image records written later find their captions stored. */
static sd_status run_texts(run *r, sd_error *err)
{
    size_t w = (size_t)r->o->text_batch, todo_total = 0, next = 0, done = 0, nrt = 0, ncap = 0;
    size_t wc = w + SD_SHARD_MAX_VARIANTS; /* captions: a window's last job may bring all its variants */
    const char **caps = malloc(wc * sizeof(*caps));
    size_t *lens = malloc(wc * sizeof(*lens));
    const uint8_t **keys = malloc(wc * sizeof(*keys));
    latent_job **jobs = malloc(w * sizeof(*jobs));
    r->rt_keys = calloc(w, sizeof(*r->rt_keys));
    r->rt_vals = calloc(w, sizeof(*r->rt_vals));
    r->rt_jobs = calloc(w, sizeof(*r->rt_jobs));
    sd_status st = caps && lens && keys && jobs && r->rt_keys && r->rt_vals && r->rt_jobs
                       ? SD_OK
                       : sd_err_set(err, SD_ENOMEM, "out of memory");
    for (size_t i = 0; i < r->jobs.n; i++) todo_total += r->jobs.v[i].state != JOB_DONE || r->jobs.v[i].variants_stale;
    sd_progress prog;
    sd_progress_init(&prog, "sd-latents text", "records", todo_total, !r->o->quiet);
    size_t m;
    while (!st && (m = text_window(r, &next, caps, lens, keys, jobs, &ncap)) > 0) {
        st = retext_window(r, jobs, m, &nrt, err);
        if (!st) st = sd_shard_begin(r->shard, err);
        if (st) break;
        if (r->meta_pending) st = write_meta(r, err);
        if (!st) st = text_put_many(&r->text, r->shard, ncap, caps, lens, keys, &r->trec, err);
        for (size_t i = 0; i < nrt && !st; i++) { /* new reference, the same latents: no image encoded */
            latent_job *j = r->rt_jobs[i];
            if (j->rekey) /* from its old kind of key to the current one */
                st = sd_shard_del(r->shard, j->old_key, 16, err);
            const void *key = j->rekey ? (const void *)j->key : (const void *)r->rt_keys[i].data;
            if (!st)
                st = sd_shard_put(r->shard, key, j->rekey ? 16 : r->rt_keys[i].len, r->rt_vals[i].data,
                                  r->rt_vals[i].len, err);
            if (!st && (j->rekey || r->rt_keys[i].len == 16)) st = put_variants(r, j, key, err);
        }
        for (size_t i = 0; i < m && !st; i++) /* the same record, other variants: the entry alone */
            if (jobs[i]->state == JOB_DONE && jobs[i]->variants_stale) /* under the key it was found under */
                st = put_variants(r, jobs[i], jobs[i]->old_key, err);
        if (!st) st = sd_shard_commit(r->shard, err);
        else sd_shard_abort(r->shard);
        if (!st) {
            r->meta_pending = 0;
            for (size_t i = 0; i < m; i++) {
                if (jobs[i]->state == JOB_DONE && jobs[i]->variants_stale) r->revaried++;
                jobs[i]->variants_stale = 0;
                if (jobs[i]->state == JOB_RETEXT) {
                    jobs[i]->state = JOB_DONE;
                    r->retexted++;
                }
            }
        }
        done += m;
        sd_progress_update(&prog, done, 0);
    }
    sd_progress_finish(&prog);
    for (size_t i = 0; r->rt_keys && i < w; i++) sd_buf_free(&r->rt_keys[i]);
    for (size_t i = 0; r->rt_vals && i < w; i++) sd_buf_free(&r->rt_vals[i]);
    free(r->rt_keys);
    free(r->rt_vals);
    free(r->rt_jobs);
    r->rt_keys = r->rt_vals = NULL;
    r->rt_jobs = NULL;
    free(caps);
    free(lens);
    free(keys);
    free(jobs);
    return st;
}

/* The most VAE workspace one image may need, into *cap (0: no cap) and
 * what it is into what: --max-workspace, else on the CPU the memory this
 * process may use (the machine's or its cgroup's limit: under overcommit a
 * bigger allocation may succeed and the encode then be killed), else none
 * (a device allocation fails cleanly). */
static void workspace_cap(const run *r, size_t *cap, char *what, size_t what_cap)
{
    *cap = 0;
    what[0] = 0;
    if (r->o->max_workspace) {
        *cap = r->o->max_workspace;
        snprintf(what, what_cap, "over --max-workspace %zu MiB", *cap >> 20);
    } else if (!r->cuda && (*cap = sd_memory_limit())) {
        snprintf(what, what_cap, "over the %zu MiB of memory this process may use (the machine's or its cgroup's); "
                 "--max-workspace sets the limit", *cap >> 20);
    }
}

/* Whether the bucket of jobs [i, g) can be encoded: its VAE workspace
 * (one image's, the least a batch needs) is within workspace_cap and can
 * be allocated, tried before any of its images is decoded. When not, each
 * of its jobs still to do is skipped, named with the bucket, the size and
 * why, so the other buckets go on; *skipped: how many. The runner's
 * workspace may grow here: the batch in flight must have been collected. */
static int bucket_fits(run *r, size_t i, size_t g, uint64_t *skipped)
{
    const latent_job *first = &r->jobs.v[i];
    int w = first->bucket_w, h = first->bucket_h;
    size_t need = sd_vae_runner_image_workspace(&r->vae, h, w), cap;
    char why[sizeof r->dec_msg[0]];
    workspace_cap(r, &cap, why, sizeof why);
    sd_error e = {0};
    *skipped = 0;
    int under_cap = !cap || need <= cap;
    if (under_cap && sd_vae_runner_reserve(&r->runner, &r->vae, h, w, &e) == SD_OK) return 1;
    if (under_cap) snprintf(why, sizeof why, "%s", e.msg);
    for (size_t k = i; k < g; k++) {
        const latent_job *j = &r->jobs.v[k];
        if (j->state == JOB_DONE) continue;
        sd_skip(&r->tally, "VAE workspace cannot be allocated",
                "%s:%llu %s (%s), bucket %dx%d: VAE workspace of %zu MiB cannot be allocated (%s)", r->o->input,
                (unsigned long long)j->line, j->name, j->image, w, h, need >> 20, why);
        r->bad++;
        ++*skipped;
    }
    return 0;
}

/* The batch in flight collected and written now, when bucket [i, ...)
 * needs a bigger workspace than the runner holds (bucket_fits grows it,
 * and the batch in flight may still be using it on a device). */
static sd_status settle_before_growth(run *r, size_t i, batch *prev, int *in_flight, sd_error *err)
{
    const latent_job *j = &r->jobs.v[i];
    if (!*in_flight || r->runner.ws_cap >= sd_vae_runner_image_workspace(&r->vae, j->bucket_h, j->bucket_w))
        return SD_OK;
    *in_flight = 0;
    sd_status st = collect_or_retry(r, prev, err);
    return st ? st : write_batch(r, prev, err);
}

/* Whether any job of [i, g) is still to do. */
static int bucket_has_work(const run *r, size_t i, size_t g)
{
    for (size_t k = i; k < g; k++)
        if (r->jobs.v[k].state != JOB_DONE) return 1;
    return 0;
}

/* Walk the bucket-sorted jobs in fixed batches, running those with work:
 * batch k decodes while batch k - 1 encodes (a GPU works meanwhile),
 * then k - 1 is collected, k submitted, and k - 1's records written while
 * k encodes. Each batch is still encoded and written whole, one
 * transaction each, so a kill loses at most the two batches in flight. */
static sd_status run_batches(run *r, sd_error *err)
{
    const latents_opts *o = r->o;
    size_t todo_total = 0;
    for (size_t i = 0; i < r->jobs.n; i++) todo_total += r->jobs.v[i].state != JOB_DONE;
    r->cached = r->jobs.n - todo_total - r->retexted; /* run_texts marked the retexted ones done */
    batch cur = {.todo = malloc((size_t)o->batch * sizeof(latent_job *))};
    batch prev = {.todo = malloc((size_t)o->batch * sizeof(latent_job *))};
    r->dec_st = calloc((size_t)o->batch, sizeof(*r->dec_st));
    r->dec_why = calloc((size_t)o->batch, sizeof(*r->dec_why));
    r->dec_msg = calloc((size_t)o->batch, sizeof(*r->dec_msg));
    if (!cur.todo || !prev.todo || !r->dec_st || !r->dec_why || !r->dec_msg) {
        free(cur.todo);
        free(prev.todo);
        return sd_err_set(err, SD_ENOMEM, "out of memory");
    }
    sd_progress prog;
    sd_progress_init(&prog, "sd-latents", "images", todo_total, !o->quiet);
    uint64_t done = 0;
    double last_stage = sd_now();
    sd_status st = SD_OK;
    int in_flight = 0; /* prev is submitted, not yet collected */
    size_t i = 0;
    while (i < r->jobs.n && !st) {
        size_t g = i; /* one bucket: [i, e) */
        while (g < r->jobs.n && r->jobs.v[g].bucket_w == r->jobs.v[i].bucket_w &&
               r->jobs.v[g].bucket_h == r->jobs.v[i].bucket_h)
            g++;
        uint64_t skipped = 0;
        if (bucket_has_work(r, i, g)) st = settle_before_growth(r, i, &prev, &in_flight, err);
        if (!st && bucket_has_work(r, i, g) && !bucket_fits(r, i, g, &skipped)) {
            done += skipped;
            sd_progress_update(&prog, done, r->bad);
            i = g;
            continue;
        }
        for (size_t b = i; b < g && !st; b += (size_t)o->batch) {
            size_t m = 0;
            for (size_t k = b; k < g && k < b + (size_t)o->batch; k++)
                if (r->jobs.v[k].state != JOB_DONE) cur.todo[m++] = &r->jobs.v[k];
            if (!m) continue;
            st = decode_batch(r, &cur, m, err);
            if (!st && cur.ok) {
                if (in_flight) st = collect_or_retry(r, &prev, err);
                sd_status sub = st ? st : submit_batch(r, &cur, err);
                if (in_flight && !st) st = write_batch(r, &prev, err);
                in_flight = sub == SD_OK;
                if (!st) st = sub;
                if (in_flight) {
                    batch t = prev;
                    prev = cur;
                    cur = t;
                }
            }
            done += m;
            sd_progress_update(&prog, done, r->bad);
            if (!o->quiet && sd_now() - last_stage > 30) {
                last_stage = sd_now();
                sd_log(SD_LOG_INFO, "stages: decode %.1f img/s, encode %.2f img/s%s, write %.0f img/s",
                       r->t_decode > 0 ? (double)done / r->t_decode : 0, r->t_encode > 0 ? (double)r->written / r->t_encode : 0,
                       r->cuda ? " (by the time waited for it)" : "", r->t_write > 0 ? (double)r->written / r->t_write : 0);
            }
        }
        i = g;
    }
    if (in_flight) { /* the last batch, or the one in flight when a decode failed: still written */
        sd_error e2 = {0};
        sd_status s2 = collect_or_retry(r, &prev, st ? &e2 : err);
        if (!s2) s2 = write_batch(r, &prev, st ? &e2 : err);
        if (!st) st = s2;
        else if (s2 && strcmp(e2.msg, err->msg) != 0) /* the same failure (a full disk) is said once, by the caller */
            sd_log(SD_LOG_ERROR, "%s", e2.msg);
    }
    sd_progress_finish(&prog);
    free(cur.todo);
    free(prev.todo);
    return st;
}

/* Release everything the run holds. */
static void run_free(run *r)
{
    if (r->shard) {
        sd_error e = {0};
        if (sd_shard_close(r->shard, &e)) sd_log(SD_LOG_ERROR, "%s", e.msg);
    }
    jobs_free(&r->jobs);
    sd_vae_free(&r->vae);
    if (r->text_on) text_close(&r->text); /* its runners' device memory goes before the context */
    if (r->pool) sd_pool_destroy(r->pool);
    free(r->img);
    free(r->img_spare);
    free(r->mean);
    free(r->std);
    free(r->ws);
    if (r->runner_ok) sd_vae_runner_free(&r->runner);
    latents_cuda_close(r->cuda);
    free(r->dec_st);
    free(r->dec_why);
    free(r->dec_msg);
    sd_buf_free(&r->conv);
    sd_buf_free(&r->rec);
    sd_buf_free(&r->trec);
}

/* Each pool worker releases its libvips thread state. */
static void image_thread_done(void *ctx, int worker, size_t begin, size_t end)
{
    (void)ctx;
    (void)worker;
    (void)begin;
    (void)end;
    sd_image_thread_done();
}

/* The device of the VAE and, with --text, the text encoders: the CPU
 * engine on the thread pool, or with --device cuda:K the CUDA backend
 * (parameters copied to the GPU once). Decoding stays on the CPU pool. */
static sd_status open_device(run *r, sd_error *err)
{
    const sd_backend *be = r->be;
    void *exec = r->pool;
    if (r->o->cuda_device >= 0) {
        sd_status st = latents_cuda_open(r->o, &r->cuda, &be, err);
        if (st) return st;
        exec = r->cuda;
        sd_log(SD_LOG_INFO, "VAE%s on cuda:%d (sd-selftest --device cuda:%d checks the backend)",
               r->text_on ? " and text encoders" : "", r->o->cuda_device, r->o->cuda_device);
    }
    sd_status st = sd_vae_runner_init(&r->runner, &r->vae, be, exec, err);
    r->runner_ok = !st;
    if (!st && r->text_on) st = text_device(&r->text, be, exec, err);
    return st;
}

/* The VAE's identity, model_hash: a hash of its weights and of every
 * config field that changes what the encoder computes (block widths,
 * layers, norm groups and eps, channels, quant_conv, mid-block attention),
 * since --vae-groups or --vae-config change the latents but not the
 * weights. The scaling and shift factors stay out: the latents are stored
 * unscaled, the factor is the shard's meta (check_scale). */
static void vae_identity(run *r)
{
    const sd_vae_config *c = &r->vae.cfg;
    char blocks[64] = "";
    for (int i = 0; i < c->nblocks; i++)
        snprintf(blocks + strlen(blocks), sizeof blocks - strlen(blocks), "%s%d", i ? "," : "", c->block_out[i]);
    snprintf(r->vae_desc, sizeof r->vae_desc,
             "in_channels=%d latent_channels=%d block_out_channels=%s layers_per_block=%d norm_num_groups=%d "
             "norm_eps=%.9g use_quant_conv=%d mid_block_add_attention=%d",
             c->in_channels, c->latent_channels, blocks, c->layers_per_block, c->groups, (double)c->eps,
             c->use_quant_conv, c->mid_attention);
    uint64_t w = sd_hash64(r->vae.w.data, sd_weights_bytes(&r->vae.w), 0);
    snprintf(r->weights_hash, sizeof r->weights_hash, "%016llx", (unsigned long long)w);
    snprintf(r->model_hash, sizeof r->model_hash, "%016llx",
             (unsigned long long)sd_hash64(r->vae_desc, strlen(r->vae_desc), w));
}

/* Warn when the scaling factor is vae_load's guess (no config.json, no
 * SDXL conditioner beside the weights): a standalone SDXL VAE file would
 * get SD's factor, and the trainer scales every latent by it. */
static void warn_guessed_scale(const run *r)
{
    if (strncmp(r->vae.cfg.scale_source, "default", 7) != 0) return;
    sd_log(SD_LOG_WARN, "VAE %s: scaling factor %g is a guess (%s: no config.json gives one); an SDXL VAE needs "
           "0.13025: pass --scale X (or --vae-config FILE) when it is not %g", r->o->vae_path,
           r->vae.cfg.scaling_factor, r->vae.cfg.scale_source, r->vae.cfg.scaling_factor);
}

/* The meta alone, in its own transaction: a --scale that changes the
 * shard's factor takes effect even when every record is cached. */
static sd_status rewrite_meta(run *r, sd_error *err)
{
    sd_status st = sd_shard_begin(r->shard, err);
    if (st) return st;
    st = write_meta(r, err);
    if (!st) st = sd_shard_commit(r->shard, err);
    else sd_shard_abort(r->shard);
    if (!st) r->meta_pending = 0;
    return st;
}

/* Load the VAE, read the jobs, open the shard, run, report. */
int latents_run(const latents_opts *o)
{
    run r;
    memset(&r, 0, sizeof r);
    r.o = o;
    sd_buf_init(&r.rec);
    sd_buf_init(&r.trec);
    sd_buf_init(&r.conv);
    sd_tally_init(&r.tally, o->verbose ? -1 : 10);
    sd_error err = {0};
    sd_status st = SD_OK;
    r.dtype = latents_dtype(o->dtype_name); /* sd_latents.c checked it */
    r.be = sd_backend_cpu();
    int image_ok = 0;
    if (!st) {
        st = sd_image_init(&err);
        image_ok = !st;
    }
    sd_vae_opts vo = {.config_path = o->vae_config, .groups = o->vae_groups, .scaling_factor = o->scale};
    double t0 = sd_now();
    if (!st) st = sd_vae_load(&r.vae, o->vae_path, &vo, &err);
    if (!st && o->vae_act) st = sd_vae_set_activations(&r.vae, o->vae_act, &err);
    if (!st) {
        vae_identity(&r);
        sd_log(SD_LOG_INFO, "VAE %s (%s): %s, %zu MB of weights (hash %s), scaling factor %g (%s), model_hash %s, "
               "%.1f s", o->vae_path, r.vae.layout, r.vae_desc, sd_weights_bytes(&r.vae.w) >> 20, r.weights_hash,
               r.vae.cfg.scaling_factor, r.vae.cfg.scale_source, r.model_hash, sd_now() - t0);
        warn_guessed_scale(&r);
        if (o->vae_groups > 0 && r.vae.cfg.groups != o->vae_groups) /* a config.json gave the groups */
            sd_log(SD_LOG_WARN, "VAE %s: its config.json says norm_num_groups %d; --vae-groups %d is for weights "
                   "without one, and is not used", o->vae_path, r.vae.cfg.groups, o->vae_groups);
    }
    if (!st && o->text_model) {
        int wdt = o->text_weights ? latents_dtype(o->text_weights) : SD_DT_F32; /* sd_latents.c checked it */
        st = text_open(&r.text, o->text_model, o->tokenizer, o->clip_skip, o->max_tokens ? o->max_tokens : 75, r.dtype,
                       wdt, latents_numerics(r.o), &err);
        r.text_on = !st;
        if (r.text_on) text_key(&r.text, "", 0, r.empty_key);
    }
    if (!st) st = jobs_read(&r.jobs, o->input, o->shard_index, o->shard_count, 0, o->root, &r.tally, &err);
    if (!st) latents_mask_orphans(o, &r.jobs, &r.tally);
    sd_shard_opts so = {SD_SHARD_CREATE | (o->nosync ? SD_SHARD_NOSYNC : 0), 0, 0};
    if (!st) st = sd_shard_open(&r.shard, o->output, &so, &err);
    if (!st) st = check_meta(&r, &err);
    if (!st) st = check_scale(&r, &err);
    int refused = 0; /* records of other options: a usage error, nothing written */
    if (!st) refused = (st = latents_check_options(r.shard, o, r.dtype, &err)) != SD_OK;
    if (!st) latents_warn_other_part(r.shard, o);
    if (!st) st = classify(&r, &err);
    if (!st) {
        r.pool = o->threads > 1 ? sd_pool_create(o->threads) : NULL;
        st = open_device(&r, &err);
    }
    if (!st) {
        sd_log(SD_LOG_INFO, "%zu records for this process (%llu lines read, %llu for other shards), batch %d, %d threads",
               r.jobs.n, (unsigned long long)r.jobs.lines, (unsigned long long)r.jobs.other_shard, o->batch,
               o->threads);
        r.meta_pending = 1;
        int empty_lost = 0;
        if (r.text_on) st = text_empty_lost(r.shard, r.empty_key, &empty_lost, &err);
        if (!st && empty_lost == 2)
            sd_log(SD_LOG_INFO, "%s: the empty caption's embedding (for conditioning dropout) is missing: stored again",
                   o->output);
        if (!st && (r.scale_changed || empty_lost)) st = rewrite_meta(&r, &err);
        if (!st && r.text_on) st = run_texts(&r, &err);
        if (!st) st = run_batches(&r, &err);
        if (r.pool) sd_pool_for(r.pool, (size_t)sd_pool_size(r.pool), image_thread_done, NULL);
    }
    if (st) sd_log(SD_LOG_ERROR, "%s", err.msg);
    if (r.written + r.bad)
        sd_log(SD_LOG_INFO,
               "%llu written (%llu replaced stale), %llu already cached, %llu bad; "
               "stages: decode %.1f img/s (%.1f s), encode %.2f img/s (%.1f s%s), write %.0f img/s (%.2f s)",
               (unsigned long long)r.written, (unsigned long long)r.replaced, (unsigned long long)r.cached,
               (unsigned long long)r.bad, r.t_decode > 0 ? (double)(r.written + r.bad) / r.t_decode : 0, r.t_decode,
               r.t_encode > 0 ? (double)r.written / r.t_encode : 0, r.t_encode,
               r.cuda ? " waited for: the rest ran during decoding and writing" : "",
               r.t_write > 0 ? (double)r.written / r.t_write : 0, r.t_write);
    else if (!st && r.jobs.n == 0 && r.tally.total)
        sd_log(SD_LOG_ERROR, "every record of the input was skipped (%llu lines read; the reasons are counted below)",
               (unsigned long long)r.jobs.lines);
    else if (!st && r.jobs.n == 0)
        sd_log(SD_LOG_WARN, "no record in the input (%llu lines read)", (unsigned long long)r.jobs.lines);
    else if (!st && !r.retexted && !r.revaried)
        sd_log(SD_LOG_INFO, "nothing to do: %llu records already cached", (unsigned long long)r.cached);
    if (r.revaried)
        sd_log(SD_LOG_INFO, "%llu records kept their latents and caption and now refer to their new caption variants "
               "(no image encoded again)", (unsigned long long)r.revaried);
    if (r.retexted)
        sd_log(SD_LOG_INFO, "%llu records kept their latents and now refer to their new caption's embedding (no "
               "image encoded again)", (unsigned long long)r.retexted);
    if (r.text_on && r.text.total) {
        sd_log(SD_LOG_INFO,
               "text: %llu captions looked up, %llu embeddings computed (%.1f captions/s), %llu already stored; "
               "one %zu-byte record per distinct caption saved about %.1f MB over one per image; "
               "%llu captions had invalid UTF-8 (replaced by U+FFFD)",
               (unsigned long long)r.text.total, (unsigned long long)r.text.encoded,
               r.text.seconds > 0 ? (double)r.text.encoded / r.text.seconds : 0, (unsigned long long)r.text.reused,
               r.text.record_bytes, (double)r.text.reused * (double)r.text.record_bytes / 1e6,
               (unsigned long long)r.text.invalid_utf8);
    }
    if (r.text.cut)
        sd_log(SD_LOG_WARN, "text: %llu captions had more than %d tokens and were cut to them (as the encoders "
               "do); --max-tokens 150 or 225 keeps up to that many, as sd-scripts' --max_token_length",
               (unsigned long long)r.text.cut, r.text.max_tokens);
    sd_tally_log(&r.tally, "skipped by reason");
    /* a run that skipped every record made nothing: not a success even without --strict */
    int skipped_out = r.tally.total && (o->strict || r.jobs.n == 0);
    int code = refused ? SD_EXIT_USAGE : st ? SD_EXIT_FATAL : skipped_out ? SD_EXIT_SKIPPED : SD_EXIT_OK;
    run_free(&r);
    if (image_ok) sd_image_shutdown();
    return code;
}
