/* Inside sdtrain only: what the trainer's files share (train_open.c: the
 * trainer and its options; train_pass.c: one UNet pass; train_update.c:
 * the optimizer update; train_step.c: one step from the shards;
 * train_shared.c: the draws and stop notice those three and the loop use;
 * train_val.c, train_tally.c, train_world.c, train_loop.c: validation,
 * skip counts, the ranks' start check and the run). */
#ifndef SDTK_TRAIN_INT_H
#define SDTK_TRAIN_INT_H

#include <stddef.h>
#include <stdint.h>

#include "train.h"

/* What the UNet expects of each record (data.h); training adds the
 * dropout and flip options, validation uses neither. */
sd_load_opts sd_train_load_opts(const sd_trainer *tr, int training);
/* What a record must give the UNet of config c: latent channels, context
 * width, SDXL's pooled width; no dropout, flips or masks (train_shared.c). */
sd_load_opts sd_train_unet_load_opts(const sd_unet_config *c);
/* A timestep in the run's range [t_min, t_max). */
int sd_train_draw_timestep(const sd_train_opts *o, sd_rng *rng);
/* splitmix64's finaliser: a well-mixed 64-bit hash of x. */
uint64_t sd_train_mix64(uint64_t x);

/* The host bytes sd_train_prepare allocates beside the graph's buffers
 * for io latent values (train_pass.c). */
size_t sd_train_io_host_bytes(const sd_train_opts *o, size_t io, int cuda);
/* Plan the graph for a new input shape and size the buffers (nothing while
 * the shape repeats). */
sd_status sd_train_prepare(sd_trainer *tr, int n, int h, int w, int tctx, sd_error *err);
/* Host floats into the backend's buffer; nothing when they are the same
 * buffer (the CPU). */
void sd_train_put(sd_trainer *tr, float *dst, const float *src, size_t floats);
/* The host's weights, moments and EMA onto the device when they changed
 * there (a new run, a resume); nothing on the CPU. */
void sd_train_push_state(sd_trainer *tr);
/* Noise the latents (with noise_in when given, else with noise), predict,
 * compare with the target (made from noise), each squared error weighted by
 * mask [n, h, w] (all channels of a latent pixel alike) when not NULL; with
 * backward, add the gradient of loss * grad_scale into the backend's
 * gradient (with --fused-backward only the output's gradient is set: the
 * step then runs sd_train_fused_pass). */
sd_status sd_train_pass(sd_trainer *tr, int n, int h, int w, int tctx, const float *x0, const float *ctx,
                        const float *text, const float *tids, const float *noise, const float *noise_in, const int *t,
                        const float *mask, double grad_scale, int backward, double *loss, sd_error *err);

/* Zero the gradients on the backend. */
void sd_train_zero_grad(sd_trainer *tr);
/* The gradient's norm from the chunked sum of squares of the whole buffer. */
sd_status sd_train_grad_norm_local(sd_trainer *tr, double *norm, sd_error *err);
/* AdamW at the scheduled rate, clipped for norm, then the gradients zeroed,
 * the step counted and the EMA updated. */
void sd_train_apply_norm(sd_trainer *tr, double norm);
/* After every tensor's update: the step counted, the EMA. */
void sd_train_after_update(sd_trainer *tr);
/* Slot t's update with its gradient g read times gscale at rate lr (the
 * fused and the per-tensor-clipped paths). */
void sd_train_update_tensor(sd_trainer *tr, size_t t, const float *g, double lr, double gscale);
/* --fused-backward (train_fused.c): the scratch, descriptors and flags
 * (open); the fused backward of one pass; the step's end: tensors no op
 * reached updated with a zero gradient, *gnorm from the per-tensor sums
 * (NaN when a gradient was not finite: tr->fused_broken then says the
 * model is half-updated), the step counted. */
sd_status sd_train_fused_open(sd_trainer *tr, sd_error *err);
void sd_train_fused_pass(sd_trainer *tr);
void sd_train_fused_finish(sd_trainer *tr, double *gnorm);
/* --zero2 (train_zero2.c): the order, scratch and gradient share (open); one pass's
 * backward with each tensor reduce-scattered, or zeros for each (idle);
 * the idle passes a round's end owes. */
sd_status sd_train_zero2_open(sd_trainer *tr, sd_error *err);
sd_status sd_train_zero2_pass(sd_trainer *tr, int idle, sd_error *err);
sd_status sd_train_zero2_round(sd_trainer *tr, int need, int passes, sd_error *err);
/* ZeRO by whole tensors for --optimizer adamw8bit and adafactor
 * (train_zero_tensors.c): rank r's run of tensors and its floats; a run
 * as a model of its own (free sub->slots); the state bytes of rank's run
 * (the whole model's with rank < 0); --zero2's share in floats (AdamW's
 * too); the owner of a float offset; the own state allocated; the update
 * of the own run from its gradient g and the runs' weights broadcast; the
 * whole state gathered on rank 0 for a checkpoint (tr->opt_save) and
 * dropped after; where the run starts in state buffer i and its whole
 * count (a resume). */
void sd_train_tensor_run(const sd_weights *w, int r, int world, size_t *t0, size_t *t1, size_t *w0, size_t *w1);
sd_status sd_train_sub_weights(const sd_weights *w, size_t t0, size_t t1, sd_weights *sub, sd_error *err);
size_t sd_train_tensor_state_bytes(const sd_train_opts *o, const sd_weights *w, int rank, int world);
size_t sd_train_zero2_own(const sd_train_opts *o, const sd_weights *w, int rank, int world);
int sd_train_tensor_owner(const sd_weights *w, size_t off, int world);
sd_status sd_train_tensor_state_open(sd_trainer *tr, sd_error *err);
sd_status sd_train_tensor_apply(sd_trainer *tr, double norm, const float *g, sd_error *err);
sd_status sd_train_tensor_state_full(sd_trainer *tr, sd_error *err);
void sd_train_tensor_state_shard(sd_trainer *tr);
sd_status sd_train_tensor_state_at(const sd_trainer *tr, size_t i, size_t *start, size_t *whole, sd_error *err);
/* --grad-dtype bf16 (train_g16.c): the scratch floats for plan g (NULL:
 * the largest tensor alone; the memory plan counts it); the buffer and
 * scratch (open); the backward of the pass just run forward, adding into
 * the buffer. Its norm and update are train_update.c's. */
size_t sd_train_g16_scratch(const sd_unet *u, const sd_unet_graph *g);
sd_status sd_train_g16_open(sd_trainer *tr, sd_error *err);
sd_status sd_train_g16_backward(sd_trainer *tr, sd_error *err);
/* Whether every weight is finite (*finite). */
sd_status sd_train_weights_finite(sd_trainer *tr, int *finite, sd_error *err);
/* ZeRO-1: the gradient's norm over every rank's own segments, and the
 * update of those segments followed by the weights' all-gather. */
sd_status sd_train_grad_norm_zero1(sd_trainer *tr, double *norm, sd_error *err);
sd_status sd_train_apply_zero1(sd_trainer *tr, double norm, sd_error *err);

/* --weight-dtype bf16 (train_w16.c): the update's scratch in floats and
 * the group descriptors' bytes (the memory plan counts both); the weights rounded into bf16 and the fp32 buffer freed
 * (open); an fp32 copy in unet.w.data (in the gradient buffer) while a
 * resume reads or --save-full writes, and its end (narrow: take its
 * values back, nearest even); the
 * parameters the UNet reads; AdamW and the EMA chunk by chunk; whether
 * every weight is finite. */
size_t sd_train_w16_chunk(const sd_train_opts *o, const sd_weights *w);
size_t sd_train_w16_desc_bytes(const sd_train_opts *o, const sd_weights *w);
void sd_train_w16_widen(float *dst, const uint16_t *src, size_t n);
void sd_train_w16_narrow(sd_trainer *tr, const float *src);
sd_status sd_train_w16_open(sd_trainer *tr, sd_error *err);
sd_status sd_train_w16_f32(sd_trainer *tr, sd_error *err);
void sd_train_w16_f32_done(sd_trainer *tr, int narrow);
sd_unet_wts sd_train_wts(const sd_trainer *tr);
/* tr->fgrad grown to at least need floats in the backend's memory (its
 * contents not kept); 0 when out of memory (train_shared.c). */
int sd_train_fgrad_reserve(sd_trainer *tr, size_t need);
void sd_train_w16_adamw(sd_trainer *tr, sd_adamw_args *a);
void sd_train_w16_adamw_range(sd_trainer *tr, sd_adamw_args *a, size_t lo, size_t n, const float *g);
void sd_train_w16_other(sd_trainer *tr, double lr, double gscale);
void sd_train_w16_other_group(sd_trainer *tr, double lr, double gscale, size_t t0, size_t t1, const float *g);
void sd_train_w16_ema(sd_trainer *tr, float rate);
int sd_train_w16_finite(sd_trainer *tr);
/* The training weights as fp32 on the backend for the samples (a device
 * widens them into its gradient buffer, or into *tmp with
 * --fused-backward), and the end of that view. */
const float *sd_train_w16_dev_f32(sd_trainer *tr, float **tmp, sd_error *err);
void sd_train_w16_dev_f32_done(sd_trainer *tr, const float *view);

/* The first stop request acknowledged in the log (rank 0 speaks). */
void sd_train_tell_stop(sd_trainer *tr);
/* A tally's summary over every rank, logged by rank 0 (collective). */
sd_status sd_train_log_tally_all(const sd_trainer *tr, const sd_tally *t, const char *what, sd_error *err);
/* Samples (train_samples.c), rank 0 only, nothing without
 * o.sample_prompts. Open: the prompts read (an unreadable file is the only
 * error), their conditioning made with the sample model's text encoders,
 * which are freed, and the VAE decoder loaded; an unusable model is a
 * warning and no samples. Render: every prompt at tr->step with the
 * weights and the EMA weights (only_missing: only the images whose file
 * is not there, for a run that took no step); failures are warned about
 * and counted, never returned. Summary: the counts by reason. */
sd_status sd_train_samples_open(sd_trainer *tr, sd_error *err);
void sd_train_samples_render(sd_trainer *tr, int only_missing);
void sd_train_samples_summary(const sd_trainer *tr);
void sd_train_samples_close(sd_trainer *tr);

/* Several ranks: every rank's state against rank 0's before the run. */
sd_status sd_train_check_world(const sd_trainer *tr, sd_error *err);

#endif
