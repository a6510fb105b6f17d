/* sd-train's memory plan: the bytes one training step holds at its peak,
 * by category, for the largest bucket of the shards at the run's batch,
 * and whether that fits the limit (--gpu-memory-limit, the device, or
 * for the CPU --host-memory-limit or the host's available memory).
 *
 * The numbers are the allocator's own arithmetic, not an estimate: the
 * weights, gradients, optimizer state and EMA come from
 * sd_train_state_sizes (what sd_trainer_open allocates), the activations
 * from sd_unet_plan's buffers and sd_train_io_host_bytes (what
 * sd_train_prepare allocates), and the workspace from running the real
 * forward and backward of the step on the planning backend
 * (plan_backend.h), whose ops ask each op's scratch of the function that
 * allocates it. Nothing of the model's size is allocated. */
#ifndef SDTK_MEM_PLAN_H
#define SDTK_MEM_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "data.h"
#include "train.h"

/* The process itself, read before the trainer allocates anything. */
typedef struct {
    size_t rss;       /* VmRSS: code, libraries and what the process holds so far */
    size_t available; /* the host's MemAvailable */
} sd_host_mem;

typedef struct {
    char device[16]; /* "cpu" or "cuda:K" */
    int batch, width, height, latent_h, latent_w, tokens;
    size_t weights, gradients, optimizer, ema, activations, workspace;
    size_t process;  /* CPU: sd_host_mem.rss (code, libraries, the shards' index) */
    size_t total;    /* the categories plus process (and samples) */
    size_t ema_host; /* a GPU run with --ema-on-cpu: the EMA's bytes in host memory (not in total) */
    size_t graph_act, graph_dact, io; /* activations: the graph's buffers and the per-pass inputs */
    size_t op_scratch, conv_workspace; /* workspace: the largest op's scratch; cuDNN's cap (GPU) */
    /* several CPU ranks: the gradient reduction's receive buffer (in
     * workspace); --zero2: this rank's share of the gradient (gradients is
     * the share plus the per-op scratch); the rank the plan is for */
    size_t dist_recv, grad_share;
    int rank, world;
    /* ZeRO on rank 0: the whole AdamW moments it gathers for each
     * checkpoint (train_moments.c), held beside everything else for the
     * time of the save (in total) */
    size_t save_gather;
    /* --sample-prompts (rank 0): what a sample step holds on top of the
     * training buffers, in total (mem_plan_samples.c); its parts */
    size_t samples;
    size_t sample_vae, sample_cond, sample_unet, sample_decode;
    int sample_w, sample_h; /* the largest image */
    size_t limit;
    char limit_from[40];
    int fits; /* 1 fits, 0 does not, -1 unknown: no limit to hold it against (no device to ask) */
} sd_mem_plan;

/* Read VmRSS and MemAvailable (0 where /proc has none). */
void sd_host_mem_read(sd_host_mem *h);
/* Plan a step of o's run for the model u (its layout: sd_unet_build_names
 * is enough) over the buckets of d on this rank of world; device_total
 * is the GPU's memory when known (0: not). */
sd_status sd_mem_plan_make(const sd_train_opts *o, const sd_unet *u, const sd_data *d, int rank, int world,
                           const sd_host_mem *host, size_t device_total, sd_mem_plan *p, sd_error *err);
/* The plan of an open trainer (its model, shards and, on a GPU, its
 * device's memory), checked before the first step. */
sd_status sd_mem_plan_trainer(const sd_trainer *tr, const sd_host_mem *host, sd_mem_plan *p, sd_error *err);
/* The samples' part of the plan (--sample-prompts; nothing on a rank
 * other than 0, or without a VAE to decode with): p->samples and its
 * parts, for the shards d (their caption length). */
sd_status sd_mem_plan_samples(const sd_train_opts *o, const sd_unet *u, const sd_data *d, int rank, sd_mem_plan *p,
                              sd_error *err);
/* The plan as one JSON object and a newline. */
void sd_mem_plan_json(const sd_mem_plan *p, const sd_train_opts *o, FILE *f);
/* The plan from the options alone, before anything of the model's size is
 * allocated: the model's layout from --unet-config (or loaded from --unet),
 * the shards opened for their buckets. */
sd_status sd_mem_plan_from_opts(const sd_train_opts *o, const sd_host_mem *host, sd_mem_plan *p, sd_error *err);

#endif
