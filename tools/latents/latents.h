/* sd-latents internals: the job list read from a bucketed JSONL stream
 * (latents_jobs.c) and the run that decodes, encodes and writes it
 * (latents_run.c). tools/sd_latents.c is only the command line. */
#ifndef SDTK_LATENTS_H
#define SDTK_LATENTS_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "buf.h"
#include "err.h"
#include "image.h"
#include "shard.h"
#include "tally.h"

/* One image to cache: where it is, its plan from sd-bucket, its key. */
typedef struct {
    char *name;   /* sd-meta `key`: the record name */
    char *image;  /* file, or the tar holding the member */
    char *member; /* tar member or NULL */
    char *caption; /* the record's caption ("" when it has none) */
    size_t caption_len;
    uint64_t offset, size;
    int bucket_w, bucket_h;
    int orig_w, orig_h;
    int transposed;     /* the file stores the image transposed (EXIF 5-8): SD_REC_F_TRANSPOSED */
    sd_image_plan plan; /* resize + crop (flip is per variant) */
    size_t seq;         /* position in the input, for a stable order */
    uint64_t line;      /* its line in the input, for messages */
    uint8_t text_key[16]; /* with --text: key of the caption's embedding */
    uint8_t key[16];    /* record key: hash of name, plan, member, options, model (not the caption) */
    int state;          /* JOB_TODO, JOB_DONE, JOB_STALE, JOB_RETEXT */
    uint8_t old_key[16]; /* the key it was found under */
    int rekey;           /* JOB_RETEXT: found under the old kind of key (caption hashed in): moved to key */
    float *mask;         /* --masks: the loss mask at the latent size, from decode to record; NULL: none */
} latent_job;

/* JOB_RETEXT: the record is right but refers to another caption's
 * embedding (or none): put back with this caption's, no image encoded. */
enum { JOB_TODO = 0, JOB_DONE = 1, JOB_STALE = 2, JOB_RETEXT = 3 };

typedef struct {
    latent_job *v;
    size_t n, cap;
    uint64_t lines, other_shard;
} job_list;

/* Read every record of path ("-": stdin), keep those of shard `index` of
 * `count` (by a hash of the name), skip bad ones into tally, and of several
 * records with one key the first line (later ones: "duplicate key", both
 * lines named); then sort by bucket (stable). captions_only (--text-only)
 * reads only each record's key and caption (no image, no plan needed).
 * root (or NULL): the directory relative image paths are resolved against. */
sd_status jobs_read(job_list *l, const char *path, int index, int count, int captions_only, const char *root,
                    sd_tally *tally, sd_error *err);
void jobs_free(job_list *l);

/* Everything the run needs from the command line. */
typedef struct {
    const char *input, *output, *vae_path, *vae_config, *device, *dtype_name;
    const char *root; /* --root DIR: relative image paths resolved against it (NULL: the current directory) */
    const char *text_model, *tokenizer; /* --text MODEL, --tokenizer DIR */
    const char *text_weights;           /* --text-weights fp32|fp16|bf16 (NULL: fp32) */
    int clip_skip;
    int max_tokens; /* --max-tokens 75|150|225 (0 reads as 75) */
    int cuda_device; /* -1: the CPU */
    int tf32;        /* GPU: TF32 tensor cores (part of the record key: other bytes) */
    int mixed;       /* GPU: SD_DT_BF16 / SD_DT_F16 matrix products (sd_cuda_opts; part of the key too) */
    int vae_act;     /* CPU: SD_DT_F16 / SD_DT_BF16 VAE activation storage, 0: fp32 (part of the key too) */
    size_t gpu_mem_limit; /* GPU: most device bytes held (sd_cuda_opts.mem_limit); 0: no limit */
    int cudnn_search; /* GPU: cuDNN's timed algorithm choice (the last bits may vary by run) */
    int vae_groups;
    double scale;
    int shard_index, shard_count;
    int batch, text_batch, threads, flip, sample, nosync, strict, quiet;
    int masks; /* --masks: 0 none, LATENTS_MASK_ALPHA, LATENTS_MASK_FILES */
    int verbose; /* -v: every skipped record named, not the first 10 of each reason */
    uint64_t seed;
    size_t max_workspace; /* --max-workspace: most bytes of VAE workspace a bucket may need; 0: the default */
} latents_opts;

enum { LATENTS_MASK_ALPHA = 1, LATENTS_MASK_FILES = 2 };

/* latents_mask.c: job j's loss mask at the latent size [lh, lw] into
 * j->mask (NULL when --masks is off, the image has no alpha or no mask
 * file): the image's alpha channel or NAME_mask.png's first band, through
 * the record's plan, / 255, the mean of each 8 x 8 block. A skip reason
 * (details in e) for an unreadable mask or one of another size than the
 * image. */
const char *latents_mask_load(const latents_opts *o, latent_job *j, int lh, int lw, sd_error *e);
/* --masks files: NAME_mask.png files beside the input's images that no job
 * owns, counted as "mask without an image". */
void latents_mask_orphans(const latents_opts *o, const job_list *l, sd_tally *tally);

/* Floats per latent and its shape [c, h, w]. */
typedef struct {
    size_t n;
    int c, h, w;
} latent_shape;

/* latents_record.c */
void latents_flip_lr(float *dst, const float *src, int planes, int h, int w);
sd_status latents_record(const latent_job *j, const latents_opts *o, int dtype, float *const mean[2],
                         float *const std[2], const latent_shape *ls, const uint8_t *text_ref, sd_buf *conv,
                         sd_buf *out, sd_error *err);

/* The stored dtype (SD_DT_F16, SD_DT_BF16, SD_DT_F32) a name gives: fp16
 * (NULL too), bf16 or fp32; 0 for anything else (latents_device.c). */
int latents_dtype(const char *name);

/* The whole tool: returns an SD_EXIT_* code. */
int latents_run(const latents_opts *o);
/* --text-only: text embeddings attached to the shard's latent records by
 * name (latents_attach.c); an SD_EXIT_* code. */
int latents_attach(const latents_opts *o);
/* --text-only: jobs whose key names no record renamed to the record whose
 * name shares the most trailing path components with it (an imported
 * kohya cache's "cats/001" for sd-scripts' key "001" or
 * "/data/cats/001.png"; latents_match.c); ambiguous ones skipped. */
sd_status latents_match_names(sd_shard *shard, job_list *jobs, sd_tally *tally, sd_error *err);

/* The shard's meta against this run (latents_meta.c): SD_EINVAL naming
 * both when the latent dtype, mode, flip, --sample's seed or the VAE's
 * activation storage the shard records differ from this run's (fields the
 * meta lacks are not compared), before anything is written. */
sd_status latents_check_options(sd_shard *s, const latents_opts *o, int dtype, sd_error *err);
/* The meta's "parts" (the --shard I/N of every run that wrote the shard)
 * with this run's added, as a JSON list into out. */
void latents_parts_json(sd_shard *s, const latents_opts *o, sd_buf *out);
/* A warning when another I of this run's --shard I/N wrote the shard (one
 * -o given to two processes by mistake); sd-pack's merges are no mistake. */
void latents_warn_other_part(sd_shard *s, const latents_opts *o);

/* The device's numerics as a key suffix: "" for the CPU and strict fp32,
 * else "|tf32", "|mixed-bf16" or "|mixed-fp16" (record and text keys;
 * latents_device.c). */
const char *latents_numerics(const latents_opts *o);

/* The record named name rebuilt with text_ref as its text reference (all
 * else as stored) into key and val, read in t: what --text-only and a
 * --text run whose caption changed put back, with no image encoded. */
sd_status latents_retext_record(sd_shard_txn *t, const char *name, const uint8_t text_ref[16], sd_buf *key,
                                sd_buf *val, sd_error *err);

/* The CUDA context of --device cuda:K (an sd_cuda *) and its backend; an
 * error when this build has no CUDA. latents_cuda_close(NULL) is a no-op
 * (latents_device.c). */
sd_status latents_cuda_open(const latents_opts *o, void **cuda, const sd_backend **be, sd_error *err);
void latents_cuda_close(void *cuda);

#endif
