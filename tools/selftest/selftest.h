/* sd-selftest internals: the comparison harness (the numerics modes, the
 * tolerances and the judging of a case in selftest_compare.c, the
 * deterministic inputs in selftest_inputs.c), the op cases by family
 * (selftest_conv.c, selftest_norm.c, selftest_linear.c, selftest_attn.c,
 * selftest_elem.c, selftest_optim.c, selftest_optim8.c) and their table and run
 * (selftest_ops.c), the model-level checks (the golden VAE in
 * selftest_vae.c, the tiny UNets in selftest_unet.c), the throughput probe
 * (selftest_probe.c) and --plan (selftest_plan.c). tools/sd_selftest.c is
 * only the command line. */
#ifndef SDTK_SELFTEST_H
#define SDTK_SELFTEST_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "safetensors.h"
#include "train.h"
#include "vae.h"

enum { MAXB = 12 };

/* A backend and its exec context. */
typedef struct {
    const sd_backend *be;
    void *ex;
} target;

/* Buffer roles: inputs (random), forward outputs (pre-filled with a
 * sentinel that differs between the two runs, so an unwritten element
 * shows), gradients (random: backward must add into them), token ids. */
enum { IN, OUT, GRAD, IDS };

typedef struct {
    const char *name;
    size_t n;
    int role;
    float lo, hi; /* IN and GRAD values; IDS: ids in [0, hi) */
} buf_spec;

/* Op classes, each with its own tolerances (op_tols). */
enum { OC_CONV, OC_LINEAR, OC_ATTN, OC_NORM, OC_ELEM, OC_TEMB, OC_OPTIM, OC_N };

typedef struct {
    const char *name;
    int nb;
    buf_spec b[MAXB];
    void (*fwd)(const target *t, float **p);
    void (*bwd)(const target *t, float **p);
    int cls; /* OC_* */
} op_case;

#define SZ(x) ((size_t)(x))

/* The numerics of a run, each with its own tolerances: strict fp32, TF32
 * tensor cores, mixed precision with bf16 or fp16 products. */
enum { SELFTEST_STRICT, SELFTEST_TF32, SELFTEST_BF16, SELFTEST_FP16, SELFTEST_NMODES };

/* Sizes of the element-wise, shape and optimizer cases. */
enum { ELEM_N = 10007, GEGLU_M = 33, GEGLU_N = 50, UP_P = 6, UP_H = 7, UP_W = 9, BC_N = 2, BC_C = 8, BC_HW = 300,
       TR_N = 2, TR_R = 70, TR_C = 45 };

/* The forward or backward call of one op case on a target. */
typedef void op_fn(const target *t, float **p);

/* The modes (selftest_compare.c): the mode of a device run from its
 * sd_cuda_opts (allow_tf32, mixed); "strict", "tf32", "bf16", "fp16". */
int selftest_mode(int tf32, int mixed);
const char *selftest_mode_name(int mode);

/* The comparison harness (selftest_compare.c, selftest_inputs.c). */
void selftest_fill(float *p, size_t n, uint64_t seed, float lo, float hi);
void selftest_fill_ids(float *p, size_t n, uint64_t seed, int vocab);
double selftest_tensor_error(const float *a, const float *b, size_t n);
double selftest_tol_of(int cls, int role, int mode);
double selftest_worst_of(const op_case *oc, int role, float *const *a, float *const *b, int *which);
int selftest_mutations_missed(const op_case *oc, float *const *init, float **a, float *const *b);

/* The op cases' shapes and calls, by family. */
extern const sd_conv2d_shape selftest_conv_same, selftest_conv_down, selftest_conv_1x1;
op_fn selftest_conv_same_fwd, selftest_conv_same_bwd, selftest_conv_down_fwd, selftest_conv_down_bwd,
    selftest_conv_1x1_fwd, selftest_conv_1x1_bwd, selftest_conv_nodx_bwd, selftest_conv_nob_fwd, selftest_conv_nob_bwd;
extern const sd_gn_shape selftest_gn_small, selftest_gn_chunked, selftest_gn_1x1;
extern const sd_ln_shape selftest_ln_shape;
op_fn selftest_gn_small_fwd, selftest_gn_small_bwd, selftest_gn_chunked_fwd, selftest_gn_chunked_bwd,
    selftest_gn_1x1_fwd, selftest_gn_1x1_bwd, selftest_gn_plain_fwd, selftest_gn_plain_bwd, selftest_ln_fwd,
    selftest_ln_bwd;
extern const sd_linear_shape selftest_lin_bias, selftest_lin_nobias;
op_fn selftest_lin_bias_fwd, selftest_lin_bias_bwd, selftest_lin_nobias_fwd, selftest_lin_nobias_bwd,
    selftest_lin_nodx_bwd;
extern const sd_attn_shape selftest_at_cross, selftest_at_causal, selftest_at_causal_long, selftest_at_cross_long,
    selftest_at_cross_227, selftest_at_vae, selftest_at_vae_odd, selftest_at_narrow, selftest_at_wide;
op_fn selftest_at_cross_fwd, selftest_at_cross_bwd, selftest_at_causal_fwd, selftest_at_causal_bwd,
    selftest_at_causal_long_fwd, selftest_at_causal_long_bwd, selftest_at_cross_long_fwd, selftest_at_cross_long_bwd,
    selftest_at_cross_227_fwd, selftest_at_cross_227_bwd, selftest_at_vae_fwd, selftest_at_vae_bwd, selftest_at_vae_odd_fwd, selftest_at_vae_odd_bwd, selftest_at_narrow_fwd,
    selftest_at_narrow_bwd, selftest_at_wide_fwd, selftest_at_wide_bwd, selftest_at_dv_bwd;
extern const sd_concat_shape selftest_cat_shape;
extern const sd_temb_shape selftest_temb_shape;
extern const sd_embedding_shape selftest_emb_shape, selftest_emb_nopos;
op_fn selftest_silu_f, selftest_silu_b, selftest_gelu_f, selftest_gelu_b, selftest_qgelu_f, selftest_qgelu_b,
    selftest_gstd_f, selftest_gstd_b, selftest_scale_f, selftest_scale_b, selftest_add_f, selftest_add_b,
    selftest_mul_f, selftest_mul_b, selftest_cat_f, selftest_cat_b, selftest_geglu_f, selftest_geglu_b, selftest_up_f,
    selftest_up_b, selftest_tr_f, selftest_tr_b, selftest_temb_f, selftest_temb_b, selftest_bc_f, selftest_bc_b,
    selftest_emb_f, selftest_emb_b, selftest_emb_np_f, selftest_emb_np_b;
op_fn selftest_opt_f, selftest_opt_b;

/* Every op case on dev against the CPU (ref), or those whose name starts
 * with `only`, printed with `tag`, judged with mode's tolerances (mutate:
 * also the check of the check); failures, or -1 on an error
 * (selftest_ops.c). With CUDA, the attention cases in a context limited to
 * 4 MiB (selftest_check_capped). */
int selftest_check_ops(const target *dev, const target *ref, int mode, const char *only, const char *tag, int mutate);
#ifdef SDTK_HAVE_CUDA
int selftest_check_capped(int dev, int tf32, int mixed, const target *ref);
#endif
/* AdamW with bf16 moments, bit for bit against the CPU (selftest_optim.c). */
int selftest_check_adamw_bf16(const target *dev, const target *ref, int mode);
/* 8-bit AdamW, Adafactor (three steps each: state and weights) and the
 * bf16 weights' widening and keyed store on dev against the CPU
 * (selftest_optim8.c); mutate: also the check of each check. Failures,
 * or -1 on an error. */
int selftest_check_adamw8(const target *dev, const target *ref, int mutate);
int selftest_check_adafactor(const target *dev, const target *ref, int mutate);
int selftest_check_bf16w(const target *dev, const target *ref, int mutate);

/* The model-level checks: the golden VAE encoded on t (selftest_vae.c),
 * 1 pass, 0 fail, -1 error; and one training micro-batch of the tiny golden
 * UNet `name` (sd1, sdxl) under dir, through the trainer on cuda:device
 * (without and with gradient checkpointing) and on the CPU with the same
 * inputs: the loss and every parameter tensor's gradient compared, each
 * tensor normwise against the mode's tolerance; then three AdamW steps on
 * the device with the EMA on the device and in host memory (--ema-on-cpu),
 * the two EMAs compared, and bf16 against fp32 moments. 1 passed, 0
 * failed, -1 error. tf32 and mixed: the device's numerics (sd_cuda_opts).
 * mutate (the CPU against itself): also zero each tensor's gradient in turn
 * and judge it with every mode's tolerances, failing when a tensor above
 * the floor is not caught (selftest_unet.c). */
int selftest_check_vae(const target *t, const char *dir, int mode);
/* The golden VAE's decoder on t, the same way (selftest_vae.c). */
int selftest_check_vae_decode(const target *t, const char *dir, int mode);
int selftest_unet(const char *dir, const char *name, int device, int tf32, int mixed, int mutate);

/* The golden inputs of one tiny UNet (dir/name/expected.safetensors),
 * opened (0 on success; close st), and one training micro-batch of them on
 * an open trainer (selftest_unet.c). */
typedef struct {
    sd_safetensors *st;
    const sd_st_tensor *x, *t, *ctx, *text, *tids, *target;
} selftest_in;
int selftest_inputs_open(selftest_in *in, const char *path);
sd_status selftest_micro(sd_trainer *tr, const selftest_in *in, double *loss, sd_error *err);
/* The optimizers through the trainer (selftest_train.c): on the tiny UNet
 * `name` under dir, three steps of 8-bit AdamW, Adafactor and AdamW and
 * Adafactor on bf16 weights on cuda:device (-1: the CPU) against the CPU
 * from the same gradients (the CPU's, uploaded), the weights and
 * optimizer state compared; then --fused-backward against the unfused
 * update with per-tensor clipping, both on the device. mutate: also the
 * check of each verdict. 1 passed, 0 failed, -1 error. */
int selftest_train_optim(const char *dir, const char *name, int device, int tf32, int mixed, int mutate);

/* The SD VAE encoder architecture (selftest_vae.c), the throughput probe
 * (selftest_probe.c), --plan and bytes as MiB (selftest_plan.c). */
sd_vae_config selftest_vae_arch(void);
int selftest_probe(const target *t, const target *flash);
int selftest_plan(size_t conv_ws_cap);
double selftest_mib(size_t b);

#endif
