/* CLIP text encoders of Stable Diffusion on the engine (transformers'
 * CLIPTextModel / CLIPTextModelWithProjection, forward only: the text
 * encoders are frozen when their outputs are cached):
 *   SD 1.x   OpenAI CLIP ViT-L/14: quick_gelu, last layer + final LN
 *            (optional clip skip);
 *   SD 2.x   OpenCLIP ViT-H/14: gelu, penultimate layer + final LN;
 *   SDXL     CLIP ViT-L/14 penultimate layer without final LN, and OpenCLIP
 *            ViT-bigG/14 penultimate without final LN plus the pooled output
 *            (final LN of the last layer at the end token, text_projection).
 *
 * Weights come from a diffusers folder (text_encoder/ or text_encoder_2/:
 * config.json + model.safetensors), a single-file checkpoint (SD1
 * cond_stage_model.transformer.text_model.*, SD2 cond_stage_model.model.*,
 * SDXL conditioner.embedders.0.transformer.text_model.* and
 * conditioner.embedders.1.model.*), or a standalone text encoder file. The
 * OpenCLIP layout's fused attention in_proj and transposed text_projection
 * are converted on load. The config comes from config.json when there is
 * one, else it is inferred from weight shapes (see sd_clip_text_load).
 *
 * Ops and copies go through the backend table (backend.h), so the same code
 * runs on any backend. A caption's embedding never depends on which
 * captions share its batch (the text cache keys embeddings by caption): on
 * a host backend, whose linear gives each row the same bits whatever the
 * row count (gemm_rows.h), up to SD_CLIP_BATCH captions run through the
 * model together; a device backend (cuBLAS results differ with the row
 * count) encodes them one at a time. */
#ifndef SDTK_CLIP_TEXT_H
#define SDTK_CLIP_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "err.h"
#include "weights.h"

/* SD_CLIP_BATCH: sequences per pass through the model on a host backend
 * (bench/bench_clip.sh: 8 packs each weight once per 616 rows). */
enum { SD_CLIP_MAX_LAYERS = 64, SD_CLIP_LEGACY_EOS = 2, SD_CLIP_BATCH = 8 };

typedef enum { SD_CLIP_QUICK_GELU = 1, SD_CLIP_GELU = 2 } sd_clip_act;

typedef struct {
    int vocab;     /* vocab_size */
    int positions; /* max_position_embeddings (77) */
    int width;     /* hidden_size */
    int layers;    /* num_hidden_layers */
    int heads;     /* num_attention_heads */
    int mlp;       /* intermediate_size */
    int proj;      /* projection_dim when the model has text_projection, else 0 */
    sd_clip_act act;
    float eps; /* layer_norm_eps */
    /* eos_token_id: the pooled output's position. transformers keeps the
     * legacy rule for configs saying 2 (every SD/SDXL config): argmax of
     * the ids, i.e. the first end token when it has the largest id; any
     * other value selects the first position holding that id (0 if none). */
    int eos_id;
    char source[32]; /* "config.json" or "inferred", for logs */
} sd_clip_text_config;

/* Where to read and what to assume; zero-initialised means "infer". */
typedef struct {
    int which;               /* 0: first text encoder (text_encoder/, cond_stage_model, embedders.0); 1: second */
    const char *config_path; /* a transformers config.json overriding inference */
    int heads;               /* >0: heads for files without a config (default width / 64) */
    sd_clip_act act;         /* non-zero: activation for files without a config */
} sd_clip_text_opts;

typedef struct {
    size_t g, b;
} sd_clip_norm;

/* One pre-LN transformer block; q, k, v fused in one [3 * width, width]
 * weight (OpenCLIP's in_proj order: q rows, then k, then v). */
typedef struct {
    sd_clip_norm ln1, ln2;
    size_t wqkv, bqkv, wo, bo, w1, b1, w2, b2;
} sd_clip_layer;

typedef struct {
    sd_clip_text_config cfg;
    sd_weights w;
    /* After sd_clip_text_to_16bit: the layers' four matrices (wqkv, wo, w1,
     * w2, their offsets in elements of `half`) in fp16 or bf16, the other
     * parameters in w; wdtype 0 while every weight is in w. */
    int wdtype;
    uint16_t *half;
    size_t half_total;
    size_t tok, pos;
    sd_clip_layer layer[SD_CLIP_MAX_LAYERS];
    sd_clip_norm final_ln;
    size_t proj_w;   /* [proj, width] (transformers layout), when cfg.proj */
    int openclip;    /* weights came in the OpenCLIP layout */
    char layout[80]; /* "transformers prefix ...", "OpenCLIP prefix ...", for logs */
} sd_clip_text;

/* Which hidden state an SD variant conditions on: the output of layer
 * (layers - skip), so skip 0 is the last layer and 1 the penultimate
 * (transformers' hidden_states[-(skip + 1)]); final_ln applies the final
 * layer norm to it. skip = layers gives the embeddings themselves. */
typedef struct {
    int skip;
    int final_ln;
} sd_clip_text_out;

typedef enum {
    SD_CLIP_SD1,    /* last layer + final LN */
    SD_CLIP_SD2,    /* penultimate of OpenCLIP ViT-H + final LN */
    SD_CLIP_SDXL_L, /* SDXL text_encoder: penultimate, no final LN */
    SD_CLIP_SDXL_G  /* SDXL text_encoder_2: penultimate, no final LN, pooled */
} sd_clip_variant;

/* Build the layer table and the flat parameter buffer for cfg. */
sd_status sd_clip_text_build(sd_clip_text *m, const sd_clip_text_config *cfg, sd_error *err);
/* Load from a model folder, a text_encoder(_2)/ folder or a .safetensors
 * file (single-file checkpoint or standalone encoder). */
sd_status sd_clip_text_load(sd_clip_text *m, const char *path, const sd_clip_text_opts *opts, sd_error *err);
/* A single-file checkpoint with SDXL's second encoder (conditioner.embedders.1.*)? */
sd_status sd_clip_text_file_has_second(const char *path, int *yes, sd_error *err);
void sd_clip_text_free(sd_clip_text *m);
/* Hold the layers' matrices (nearly all of the weights) in fp16 or bf16
 * instead of fp32: half the memory; the CPU linear widens them exactly while
 * packing, so the encoder computes with exactly the values they hold, in
 * fp32. *exact is set to 1 when every value was representable (fp16 files
 * into fp16: embeddings bit-identical to the fp32 model's), else 0
 * (rounded to nearest-even). Host backends only (sd_clip_text_encode_on
 * refuses a device); call before sd_clip_text_runner_init. */
sd_status sd_clip_text_to_16bit(sd_clip_text *m, int dtype, int *exact, sd_error *err);

/* The output an SD variant uses for this loaded model, plus extra_skip
 * more layers skipped (diffusers' clip_skip argument; kohya's and A1111's
 * "CLIP skip N" is extra_skip N - 1). SD2's penultimate layer is layer 23
 * of OpenCLIP's 24, which diffusers folders store as a 23-layer model
 * (their last layer): skip 1 for OpenCLIP-layout weights, 0 otherwise. */
sd_status sd_clip_text_preset(const sd_clip_text *m, sd_clip_variant v, int extra_skip, sd_clip_text_out *out,
                              sd_error *err);

/* Floats of scratch memory sd_clip_text_encode(_on) needs for n
 * sequences of t tokens (a chunk of at most SD_CLIP_BATCH of them). */
size_t sd_clip_text_workspace_floats(const sd_clip_text *m, int n, int t);
/* Floats per sequence of the pooled output: proj if the model has a
 * text_projection, else width. */
int sd_clip_text_pooled_dim(const sd_clip_text *m);
/* ids [n, t] (t <= positions, every id < vocab) -> hidden [n, t, width]
 * (the state `out` selects) and pooled [n, pooled_dim] (the final LN of
 * the last layer at the end-token position, projected when the model has
 * text_projection); either output may be NULL. ws holds
 * sd_clip_text_workspace_floats(m, n, t) floats. */
sd_status sd_clip_text_encode(const sd_clip_text *m, const sd_backend *be, sd_pool *pool, int n, int t,
                              const int32_t *ids, const sd_clip_text_out *out, float *hidden, float *pooled, float *ws,
                              sd_error *err);
/* The same on any backend: exec is the backend's context; params (a copy
 * of m->w.data, m->w.total floats), ids_be (the ids), hidden, pooled and
 * ws live in its memory, ids is a host copy of the ids (checked, and read
 * for the pooling position). Returns the backend's sync status. */
sd_status sd_clip_text_encode_on(const sd_clip_text *m, const sd_backend *be, void *exec, const float *params, int n,
                                 int t, const int32_t *ids, const int32_t *ids_be, const sd_clip_text_out *out,
                                 float *hidden, float *pooled, float *ws, sd_error *err);

/* Prompts over 75 tokens, as sd-scripts' --max_token_length
 * (clip_text_chunks.c): sd_clip_kohya_rows(N) is the joined length for
 * --max-tokens N (77, 152, 227; 0 when N is not 75, 150 or 225), and
 * sd_clip_kohya_join joins the hidden states of a caption's k chunks
 * ([k, 77, width], from sd_clip_kohya_chunks' ids) into [75 k + 2, width]
 * as get_hidden_states does. SDXL's pooled output is the first chunk's. */
int sd_clip_kohya_rows(int max_tokens);
void sd_clip_kohya_join(const float *chunks, size_t k, size_t width, float *out);

/* The encoder on any backend from host buffers (clip_text_runner.c), as
 * sd_vae_runner is for the VAE: init copies the parameters into the
 * backend's memory once; encode copies ids [n, t] in, runs
 * sd_clip_text_encode_on on buffers the runner keeps (grown on demand) and
 * copies hidden [n, t, width] and pooled [n, pooled_dim] out (either may be
 * NULL). On the CPU backend the results equal sd_clip_text_encode's bit for
 * bit. free releases everything; calling it twice is harmless. */
typedef struct {
    const sd_backend *be;
    void *exec;
    float *params, *ws, *hidden, *pooled; /* the backend's memory */
    int32_t *ids_be;
    size_t ws_cap, ids_cap, hidden_cap, pooled_cap; /* bytes */
    int params_borrowed; /* a host backend: params is the model's own buffer, not a copy */
} sd_clip_text_runner;

sd_status sd_clip_text_runner_init(sd_clip_text_runner *r, const sd_clip_text *m, const sd_backend *be, void *exec,
                                   sd_error *err);
sd_status sd_clip_text_runner_encode(sd_clip_text_runner *r, const sd_clip_text *m, int n, int t, const int32_t *ids,
                                     const sd_clip_text_out *out, float *hidden, float *pooled, sd_error *err);
void sd_clip_text_runner_free(sd_clip_text_runner *r);

#endif
