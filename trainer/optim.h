/* The optimizer over the flat parameter buffer: AdamW with fp32 master
 * weights and moments exactly as torch.optim.AdamW applies it (decoupled
 * weight decay first, then the bias-corrected Adam step), torch's
 * clip_grad_norm_ over all parameters, and diffusers' learning-rate
 * schedules (get_scheduler: constant, constant_with_warmup, cosine,
 * linear). The constants live here; the element-wise work is the backend
 * table's sum_squares / adamw / ema, and adamw8 / adafactor for the other
 * optimizers (ops_optim.c on the CPU: fixed chunks, bit-identical for any
 * thread count). */
#ifndef SDTK_TRAIN_OPTIM_H
#define SDTK_TRAIN_OPTIM_H

#include <stddef.h>

#include "backend.h"
#include "err.h"
#include "ops_cpu.h"
#include "weights.h"

typedef struct {
    double beta1, beta2, eps, weight_decay;
} sd_adamw_opts;

/* The constants of AdamW step number `step` (1-based, as torch counts) at
 * rate lr for a backend's adamw op: p *= 1 - lr wd; m, v updated; p -= lr
 * / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps), the gradient
 * scaled by gscale (the clipping factor) as it is read. */
sd_adamw_args sd_adamw_args_at(const sd_adamw_opts *o, double lr, long step, double gscale);
/* torch's clip_grad_norm_ factor: min(1, max_norm / (norm + 1e-6)); 1
 * without clipping (max_norm <= 0) or for a non-finite norm. */
double sd_clip_factor(double norm, double max_norm);

/* diffusers' EMAModel decay for its n-th update (1-based): 0 for the first,
 * then min(max_decay, (1 + k) / (10 + k)) with k = n - 1. */
double sd_ema_decay(double max_decay, long n);

typedef enum { SD_LR_CONSTANT = 0, SD_LR_CONSTANT_WARMUP, SD_LR_COSINE, SD_LR_LINEAR } sd_lr_kind;

typedef struct {
    sd_lr_kind kind;
    double base;
    long warmup, total; /* optimizer steps */
} sd_lr_sched;

/* The rate of optimizer step s (0-based: diffusers' LambdaLR at
 * last_epoch s, so warmup starts at 0). */
double sd_lr_at(const sd_lr_sched *l, long s);
/* Parse "constant", "constant_with_warmup", "cosine", "linear". */
int sd_lr_kind_parse(const char *name, sd_lr_kind *out);

/* --optimizer: torch's AdamW (fp32 or bf16 moments, the flat moment
 * buffers of the trainer), bitsandbytes' AdamW8bit, transformers'
 * Adafactor (relative_step, scale_parameter, warmup_init off). */
typedef enum { SD_OPT_ADAMW = 0, SD_OPT_ADAMW8BIT, SD_OPT_ADAFACTOR } sd_optimizer;
/* "adamw", "adamw8bit", "adafactor". */
const char *sd_optimizer_name(sd_optimizer o);
/* Parse one of those names; 0 for anything else. */
int sd_optimizer_parse(const char *name, sd_optimizer *out);

/* One flat buffer of optimizer state as the state file stores it. */
typedef struct {
    const char *name;
    int st_dtype; /* SD_ST_U8 or SD_ST_F32 */
    size_t count;
    void *data;
} sd_opt_buf;

enum { SD_OPT_MAX_BUFS = 6 };

/* The per-tensor state of 8-bit AdamW or Adafactor (optim_state.c): the
 * tensors' views into a few flat buffers (bufs, in the state file under
 * their names), made from the model's slots in order. */
typedef struct {
    sd_optimizer kind;
    size_t ntensors;
    sd_q8_tensor *q8;        /* adamw8bit: per tensor */
    sd_q8_tables *tables;    /* adamw8bit: the maps and their tables */
    sd_adafactor_tensor *af; /* adafactor: per tensor */
    size_t nbufs;
    sd_opt_buf bufs[SD_OPT_MAX_BUFS];
    /* on a device backend (optim_dev.c): each buffer's twin in device
     * memory and the per-tensor views into them, which the steps use;
     * NULL on the CPU (the steps use q8 and af) */
    void *dev[SD_OPT_MAX_BUFS];
    sd_q8_tensor *dq8;
    sd_adafactor_tensor *daf;
} sd_opt_state;

/* The zeroed state of optimizer kind (adamw8bit or adafactor; with_m:
 * Adafactor's first moment) for the tensors of w. */
sd_status sd_opt_state_init(sd_opt_state *s, sd_optimizer kind, int with_m, const sd_weights *w, sd_error *err);
void sd_opt_state_free(sd_opt_state *s);
/* Only the layout sd_opt_state_init allocates (buffer names and counts, no
 * data): sd_opt_state_bytes of it is what init will hold. sd_opt_state_free
 * releases it. */
void sd_opt_state_layout(sd_opt_state *s, sd_optimizer kind, int with_m, const sd_weights *w);
/* The bytes the state holds (buffers, tables, per-tensor views). */
size_t sd_opt_state_bytes(const sd_opt_state *s);
/* The state's buffer of this name, NULL when it has none. */
sd_opt_buf *sd_opt_state_buf(sd_opt_state *s, const char *name);

/* The step number `step` (1-based) at rate lr over the flat weights p
 * with gradients g read times gscale: AdamW8bit with o's betas, eps and
 * weight decay, or Adafactor with o's weight decay and beta1 (< 0: no
 * first moment). */
void sd_opt_state_step(sd_opt_state *s, const sd_backend *be, void *exec, const sd_adamw_opts *o,
                       double adafactor_beta1, double lr, long step, double gscale, float *p, const float *g);

/* For --weight-dtype bf16 (train_w16.c): tensor t's offset and size; the
 * scratch bytes of a group's descriptors; one step of tensors [t0, t1)
 * with p and g starting at tensor t0's offset. */
void sd_opt_state_tensor(const sd_opt_state *s, size_t t, size_t *off, size_t *n);
size_t sd_opt_state_group_bytes(const sd_opt_state *s);
void sd_opt_state_step_group(sd_opt_state *s, const sd_backend *be, void *exec, const sd_adamw_opts *o,
                             double adafactor_beta1, double lr, long step, double gscale, size_t t0, size_t t1,
                             void *tmp, float *p, const float *g);

/* The state on a device backend (optim_dev.c): its buffers allocated in
 * be's memory with per-tensor views into them (SD_ENOMEM naming the
 * bytes), the host buffers copied up (push) or down (pull: the caller
 * syncs), and the device buffers released. The steps then run on the
 * device views; the host buffers are what checkpoints read and resumes
 * write. */
sd_status sd_opt_state_device(sd_opt_state *s, const sd_backend *be, void *exec, sd_error *err);
void sd_opt_state_push(sd_opt_state *s, const sd_backend *be, void *exec);
void sd_opt_state_pull(sd_opt_state *s, const sd_backend *be, void *exec);
void sd_opt_state_release(sd_opt_state *s, const sd_backend *be, void *exec);

#endif
