/* The Stable Diffusion UNet (diffusers UNet2DConditionModel) for SD 1.x,
 * SD 2.x and SDXL, forward and backward, on the engine's backend table.
 *
 * Parameters are named slots in one flat fp32 buffer (weights.h), known by
 * their diffusers names and their original ldm names (input_blocks /
 * middle_block / output_blocks), so a diffusers unet/ folder, a single-file
 * checkpoint (model.diffusion_model.*) or a config.json with random init
 * all give the same model. Gradients live in a second flat buffer with the
 * same offsets.
 *
 * A forward pass is first planned for one input shape (batch, latent size,
 * text tokens) as a graph: a list of ops whose tensors are offsets into one
 * flat activation buffer (llm.c style, every intermediate a backward needs
 * kept in place). sd_unet_forward runs the list; sd_unet_backward runs the
 * ops' backward in reverse order, adding into a gradient buffer laid out
 * like the activations and into the parameter gradients. */
#ifndef SDTK_UNET_H
#define SDTK_UNET_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "buf.h"
#include "err.h"
#include "weights.h"

enum { SD_UNET_MAX_BLOCKS = 6, SD_UNET_MAX_LAYERS = 4, SD_UNET_TIME_IDS = 6 };

/* The architecture, as diffusers' config.json describes it. Per-block
 * lists are in down-block order unless said otherwise. */
typedef struct {
    int in_channels, out_channels;
    int nblocks;                        /* len(block_out_channels) */
    int block_out[SD_UNET_MAX_BLOCKS];
    int layers[SD_UNET_MAX_BLOCKS];     /* resnets per down block; the mirrored up block has one more */
    int down_attn[SD_UNET_MAX_BLOCKS];  /* 1: CrossAttnDownBlock2D, 0: DownBlock2D */
    int up_attn[SD_UNET_MAX_BLOCKS];    /* up-block order: 1: CrossAttnUpBlock2D, 0: UpBlock2D */
    int heads[SD_UNET_MAX_BLOCKS];      /* attention heads (diffusers' attention_head_dim, sic) */
    int depth[SD_UNET_MAX_BLOCKS];      /* transformer_layers_per_block */
    int depth_up[SD_UNET_MAX_BLOCKS];   /* up-block order (reverse_transformer_layers_per_block) */
    int mid_attn;                       /* 1: UNetMidBlock2DCrossAttn, 0: no mid block */
    int groups;                         /* norm_num_groups */
    float eps;                          /* norm_eps (resnets, conv_norm_out) */
    int cross_dim;                      /* cross_attention_dim */
    int linear_proj;                    /* use_linear_projection (SD2, SDXL) */
    int upcast_attention;               /* SD2.1-v; a no-op in fp32 */
    int flip_sin_to_cos;                /* 1 in every SD model */
    float freq_shift;                   /* 0 in every SD model */
    int down_pad;                       /* downsample_padding: 1 (pad 1 each side) or 0 (pad right/bottom) */
    int text_time;                      /* addition_embed_type "text_time" (SDXL) */
    int add_time_dim;                   /* addition_time_embed_dim (SDXL: 256) */
    int add_in_dim;                     /* projection_class_embeddings_input_dim (SDXL: 2816) */
    int sample_size;                    /* informational (latent size the model was trained at) */
} sd_unet_config;

/* Where to read and what to assume; zero-initialised means "infer". */
typedef struct {
    const char *config_path; /* a diffusers config.json overriding inference */
    int groups;              /* >0: norm groups for files without a config (default 32) */
} sd_unet_opts;

typedef struct {
    size_t w, b; /* b is SIZE_MAX without bias */
    int cin, cout, k;
} sd_unet_conv;

typedef struct {
    size_t g, b;
} sd_unet_norm;

typedef struct {
    size_t w, b; /* b is SIZE_MAX without bias */
    int in, out;
} sd_unet_linear;

typedef struct {
    sd_unet_norm n1, n2;
    sd_unet_conv c1, c2, sc;
    sd_unet_linear temb;
    int cin, cout, has_sc;
} sd_unet_resnet;

/* BasicTransformerBlock: self-attention, cross-attention, GEGLU MLP. */
typedef struct {
    sd_unet_norm ln1, ln2, ln3;
    sd_unet_linear q1, k1, v1, o1, q2, k2, v2, o2, ff1, ff2;
} sd_unet_tblock;

/* Transformer2DModel: group norm, proj_in, depth blocks, proj_out, residual. */
typedef struct {
    sd_unet_norm gn;
    sd_unet_linear pin, pout;
    int c, heads;
    int first, depth; /* blocks tb[first .. first + depth) */
} sd_unet_xformer;

typedef struct {
    sd_unet_config cfg;
    sd_weights w;
    sd_unet_conv conv_in, conv_out;
    sd_unet_linear t1, t2; /* time_embedding.linear_1 / linear_2 */
    sd_unet_linear a1, a2; /* add_embedding.linear_1 / linear_2 (text_time) */
    sd_unet_resnet down_res[SD_UNET_MAX_BLOCKS][SD_UNET_MAX_LAYERS];
    sd_unet_xformer down_att[SD_UNET_MAX_BLOCKS][SD_UNET_MAX_LAYERS];
    sd_unet_conv down_conv[SD_UNET_MAX_BLOCKS];
    sd_unet_resnet mid_res[2];
    sd_unet_xformer mid_att;
    sd_unet_resnet up_res[SD_UNET_MAX_BLOCKS][SD_UNET_MAX_LAYERS + 1];
    sd_unet_xformer up_att[SD_UNET_MAX_BLOCKS][SD_UNET_MAX_LAYERS + 1];
    sd_unet_conv up_conv[SD_UNET_MAX_BLOCKS];
    sd_unet_norm norm_out;
    sd_unet_tblock *tb; /* every transformer block of the model */
    int ntb, tbcap;
    /* how from-scratch training initialises each slot (torch's defaults) */
    struct sd_unet_init *init;
    size_t ninit, initcap;
    char layout[64]; /* "diffusers", "ldm prefix model.diffusion_model.", ... for logs */
} sd_unet;

/* ---- config (unet_config.c), building (unet_names.c), loading (unet_load.c) - */

/* Diffusers' defaults (SD 1.x: 320/640/1280/1280, 2 layers, 8 heads, 768
 * cross dim, conv projections). */
void sd_unet_config_default(sd_unet_config *c);
/* Read a diffusers UNet2DConditionModel config.json over the defaults. */
sd_status sd_unet_config_read(const char *path, sd_unet_config *c, sd_error *err);
/* The first architecture field in which a and b differ: 1 with its
 * diffusers name (and block) in field and the values of a and b as text in
 * va and vb (vcap bytes each); 0 when they agree (sample_size aside). */
int sd_unet_config_diff(const sd_unet_config *a, const sd_unet_config *b, char *field, size_t fcap, char *va, char *vb,
                        size_t vcap);
/* The same from config.json's text held elsewhere (a single file's
 * metadata); name (where it came from) goes into the messages. */
sd_status sd_unet_config_parse(const char *json, size_t len, const char *name, sd_unet_config *c, sd_error *err);
/* The config as diffusers' save_config writes config.json (every key,
 * sorted, indented, floats as given): appended to b. */
void sd_unet_config_json(const sd_unet_config *c, sd_buf *b);
/* That text written to path atomically (checkpoints). */
sd_status sd_unet_config_write(const sd_unet_config *c, const char *path, sd_error *err);
/* Check a config the graph can run. */
sd_status sd_unet_config_check(const sd_unet_config *c, sd_error *err);

/* Build the layer table and the zeroed flat parameter buffer for cfg. */
sd_status sd_unet_build(sd_unet *u, const sd_unet_config *cfg, sd_error *err);
/* The layer table and the slots' names and shapes only (u->w.data stays
 * NULL): listings and memory estimates of real-size models. */
sd_status sd_unet_build_names(sd_unet *u, const sd_unet_config *cfg, sd_error *err);
/* Load from a model folder (unet/ inside), a unet/ folder or a
 * .safetensors file (diffusers names, or ldm names with or without
 * model.diffusion_model.); the config from config.json (the folder's or
 * opts->config_path), else from the file's metadata (unet_config, what
 * sd_unet_save writes), else inferred from shapes with a warning (heads: 8
 * per block with conv projections (SD1), else channels / 64 (SD2, SDXL)). */
sd_status sd_unet_load(sd_unet *u, const char *path, const sd_unet_opts *opts, sd_error *err);
/* The same with the weights as bf16: *w16 gets u->w.total values (free()
 * them; padding 0) converted a tensor at a time, each value rounded to the
 * nearest bf16 (the bits of sd_unet_load then rounding; bf16 files copied)
 * and u->w.data stays NULL: no fp32 model, and the file's pages are given
 * back tensor by tensor. w16 NULL: the layout only (every tensor's name,
 * shape and dtype checked, nothing allocated for weights). */
sd_status sd_unet_load_bf16(sd_unet *u, const char *path, const sd_unet_opts *opts, uint16_t **w16, sd_error *err);
/* Initialise every parameter as torch does for a new model (conv and
 * linear: uniform +-1/sqrt(fan_in) for weights and biases; norms 1 and 0),
 * from a seeded generator: the same seed gives the same weights. */
void sd_unet_init_random(sd_unet *u, uint64_t seed);
/* The same values each rounded to the nearest bf16 as it is drawn, into
 * dst (u->w.total values laid out like u->w.data; the caller zeroes the
 * padding): the bytes of sd_unet_init_random followed by rounding, with
 * no fp32 buffer (u->w.data may be NULL: sd_unet_build_names). */
void sd_unet_init_random_bf16(const sd_unet *u, uint64_t seed, uint16_t *dst);
void sd_unet_free(sd_unet *u);

typedef enum { SD_UNET_NAMES_DIFFUSERS = 0, SD_UNET_NAMES_LDM = 1 } sd_unet_names;

/* Write params (n = u->w.total floats laid out like u->w.data: the model,
 * or an EMA copy) as safetensors in diffusers names (a unet/ folder's
 * diffusion_pytorch_model.safetensors) or ldm names under prefix (a
 * single-file checkpoint's model.diffusion_model.), as fp32, fp16 or bf16
 * (st_dtype SD_ST_F32/F16/BF16), with the config's config.json text in
 * the metadata (unet_config). Atomic (temp + fsync + rename). */
sd_status sd_unet_save(const sd_unet *u, const float *params, const char *path, sd_unet_names names,
                       const char *prefix, int st_dtype, sd_error *err);
/* The same from bf16 parameters (u->w.total values laid out like
 * u->w.data), widened exactly while written: no fp32 copy is made. */
sd_status sd_unet_save_bf16(const sd_unet *u, const uint16_t *params, const char *path, sd_unet_names names,
                            const char *prefix, int st_dtype, sd_error *err);

/* ---- the graph (unet.c) ----------------------------------------------------- */

typedef struct sd_unet_op sd_unet_op;

/* A checkpointed segment: ops [begin, end) (a resnet or a transformer
 * block) whose intermediates live in the shared recompute region, only the
 * output of op end - 1 kept; the backward reruns ops [begin, end - 1) just
 * before it needs them. */
typedef struct {
    size_t begin, end;
} sd_unet_seg;

/* One planned forward pass. Activations [0, nconst) are the inputs (no
 * gradient is computed for them); the caller writes them at x, t, ctx and,
 * for text_time models, text and tids before sd_unet_forward, and reads the
 * prediction at out. Offsets are in floats. */
typedef struct {
    sd_unet_op *ops;
    size_t nops, cap;
    size_t nact;   /* floats of the activation buffer */
    size_t ndact;  /* floats of the activation-gradient buffer */
    size_t nconst; /* floats of the inputs at the start */
    size_t x;      /* [n, in_channels, h, w] noisy latents */
    size_t t;      /* [n] timesteps (float) */
    size_t ctx;    /* [n, tctx, cross_dim] text embeddings */
    size_t text;   /* [n, add_in_dim - 6 * add_time_dim] pooled text embedding (text_time) */
    size_t tids;   /* [n, 6] original h, w, crop top, left, target h, w (text_time) */
    size_t out;    /* [n, out_channels, h, w] */
    size_t outp;   /* the op that writes out */
    int n, h, w, tctx;
    /* gradient checkpointing: the segments, in op order, and the floats of
     * act that they share at its end (0 without checkpointing) */
    sd_unet_seg *segs;
    size_t nsegs, nrecompute;
} sd_unet_graph;

/* Plan a forward pass for n latents of h x w (multiples of
 * 2^(nblocks - 1)) and tctx text tokens. With checkpoint set, every resnet
 * and transformer block keeps only its output: its intermediates share one
 * region and are recomputed in the backward (one more forward of those
 * blocks per step, the activation buffer a fraction of the size; gradients
 * bit-identical either way). */
sd_status sd_unet_plan(const sd_unet *u, int n, int h, int w, int tctx, int checkpoint, sd_unet_graph *g,
                       sd_error *err);
void sd_unet_graph_free(sd_unet_graph *g);

/* Run the planned ops over act (g->nact floats, inputs written) with the
 * parameters params (u->w.total floats; u->w.data or a device copy). Every
 * tensor is touched through the backend table only (exec is its context:
 * the sd_pool * on the CPU), so act and params may be device memory. */
void sd_unet_forward(const sd_unet *u, const sd_unet_graph *g, const sd_backend *be, void *exec,
                     const float *params, float *act);

/* The parameters a run reads: fp32 (f32, as sd_unet_forward takes them),
 * or bf16 (bf16, u->w.total values, with scratch of
 * sd_unet_graph_wscratch floats): each op's weight and bias are widened
 * (exactly) into scratch just before the op runs, forward, recomputation
 * and backward alike, so no fp32 copy of the model exists. The widening
 * is the backend's bf16_widen: bf16 and scratch are in the backend's
 * memory (host memory on the CPU, device memory on CUDA). */
typedef struct {
    const float *f32;
    const uint16_t *bf16;
    float *scratch;
} sd_unet_wts;

/* The floats of scratch a bf16 run of g needs: its largest op's weight
 * plus bias. */
size_t sd_unet_graph_wscratch(const sd_unet_graph *g);
/* sd_unet_forward with the parameters of w (bit-identical to it for f32). */
void sd_unet_forward_wts(const sd_unet_graph *g, const sd_backend *be, void *exec, const sd_unet_wts *w,
                         float *act);

/* ---- backward (unet_bwd.c) -------------------------------------------------- */

/* Given act from sd_unet_forward and dout [n, out_channels, h, w] (both in
 * the backend's memory), run every op's backward in reverse with dact
 * (g->ndact floats, scratch, no need to clear) for the activations' gradients,
 * ADDING the parameter gradients into dparams (u->w.total floats, same
 * offsets as params; the caller zeroes it once per optimizer step, so
 * gradient accumulation is a sum over micro-batches). A checkpointed plan
 * rewrites the shared recompute region of act (the rest stays as the
 * forward left it). */
void sd_unet_backward(const sd_unet *u, const sd_unet_graph *g, const sd_backend *be, void *exec,
                      const float *params, float *act, float *dact, const float *dout, float *dparams);
/* sd_unet_backward with the parameters of w (sd_unet_wts); the gradients
 * stay fp32 either way. */
void sd_unet_backward_wts(const sd_unet *u, const sd_unet_graph *g, const sd_backend *be, void *exec,
                          const sd_unet_wts *w, float *act, float *dact, const float *dout, float *dparams);

/* A fused backward (--fused-backward): each op's parameter gradients go
 * into scratch (sd_unet_fused_scratch floats) and are handed to done(ctx,
 * offset of the tensor in the parameters, gradient, floats) once that op's
 * backward is over and its weights are read no more; done's nonzero
 * answer stops the pass. Tensors no op reaches are never handed over. */
typedef struct {
    float *scratch;
    int (*done)(void *ctx, size_t off, const float *grad, size_t n);
    void *ctx;
} sd_unet_fuse;
/* sd_unet_backward_wts, with f (when not NULL) taking the parameter
 * gradients instead of dparams (which may then be NULL); returns done's
 * stopping answer, 0 when the pass ran to the end. */
int sd_unet_backward_fused(const sd_unet *u, const sd_unet_graph *g, const sd_backend *be, void *exec,
                           const sd_unet_wts *w, float *act, float *dact, const float *dout, float *dparams,
                           const sd_unet_fuse *f);
/* The scratch floats a fused backward of plan g needs (the largest op's
 * weight and bias). */
size_t sd_unet_fused_scratch(const sd_unet *u, const sd_unet_graph *g);
/* The tensors sd_unet_backward_fused hands to done, in its order: their
 * offsets and floats into off and len (room for 2 * g->nops each), the
 * count returned. The order follows the ops alone, not the latent size:
 * a ZeRO-2 rank with no batch of its own still joins each tensor's
 * reduce-scatter in the order its peers' backward reaches them. */
size_t sd_unet_fused_order(const sd_unet *u, const sd_unet_graph *g, size_t *off, size_t *len);

#endif
