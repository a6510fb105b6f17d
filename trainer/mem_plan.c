/* The memory plan (mem_plan.h): sizes from the trainer's own allocation
 * arithmetic, the step's op scratch from a walk on the planning backend. */
#include "mem_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev_ws.h"
#include "dist.h"
#include "plan_backend.h"
#include "train_int.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif

/* One "Key:   N kB" line of a /proc file, in bytes; 0 when absent. */
static size_t proc_kb(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    char line[256];
    size_t len = strlen(key), kb = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, len) == 0 && line[len] == ':') {
            unsigned long long v = 0;
            if (sscanf(line + len + 1, "%llu", &v) == 1) kb = (size_t)v;
            break;
        }
    fclose(f);
    return kb * 1024;
}

/* What the process and the host hold now. */
void sd_host_mem_read(sd_host_mem *h)
{
    h->rss = proc_kb("/proc/self/status", "VmRSS");
    h->available = proc_kb("/proc/meminfo", "MemAvailable");
}

/* The bucket of most pixels that has records (the trainer's batches come
 * from one bucket each, so it makes the largest step). */
static int largest_bucket(const sd_data *d, int *w, int *h, size_t *which)
{
    size_t best = 0;
    for (size_t i = 0; i < d->nbuckets; i++) {
        size_t px = (size_t)d->buckets[i].w * d->buckets[i].h;
        if (d->buckets[i].n && px > best) {
            best = px;
            *w = (int)d->buckets[i].w;
            *h = (int)d->buckets[i].h;
            *which = i;
        }
    }
    return best > 0;
}

/* The backend buffers of a step, in the order the run allocates them:
 * weights, gradients, optimizer state, EMA (not on the device with
 * --ema-on-cpu), activations, their gradients, the output gradient. */
enum { NBUF = 7 };
static void step_buffers(const sd_mem_plan *p, int device, int ema_host, size_t out[NBUF])
{
    out[0] = p->weights;
    out[1] = p->gradients;
    out[2] = p->optimizer;
    out[3] = device && ema_host ? 0 : p->ema;
    out[4] = p->graph_act;
    out[5] = p->graph_dact;
    out[6] = p->io;
}

/* The planning walk's stand-in for the fused update: nothing to do. */
static int plan_done(void *ctx, size_t off, const float *grad, size_t n)
{
    (void)ctx, (void)off, (void)grad, (void)n;
    return 0;
}

/* Walk the step's forward and backward on the planning backend over
 * buffers it hands out; the peak is the allocator's arithmetic. */
static sd_status walk_step(const sd_train_opts *o, const sd_unet *u, const sd_unet_graph *g, sd_mem_plan *p,
                           size_t *peak, sd_error *err)
{
    size_t want[NBUF], span = 0;
    int device = o->device >= 0;
    step_buffers(p, device, o->ema_host, want);
    for (int i = 0; i < NBUF; i++) span += sd_plan_round(want[i] ? want[i] : 1);
    sd_plan_exec x;
    sd_status rc = sd_plan_exec_init(&x, span, o->threads, err);
    if (rc) return rc;
    x.device = device;
    x.attn_flash = o->attn_flash;
    x.attn_block = o->attn_block;
    const sd_backend *be = sd_backend_plan();
    void *buf[NBUF];
    for (int i = 0; i < NBUF; i++) buf[i] = be->alloc(&x, want[i]);
    float *w = buf[0], *grad = buf[1], *act = buf[4], *dact = buf[5], *dout = buf[6];
    if (!w || !grad || !act || !dact || !dout) {
        sd_plan_exec_free(&x);
        return sd_err_set(err, SD_ENOMEM, "memory plan: the reserved range is too small");
    }
    sd_unet_forward(u, g, be, &x, w, act);
    if (o->fused_backward || o->zero2 || o->grad_dtype == SD_DT_BF16) { /* the parameter gradients into a per-op scratch */
        sd_unet_wts wts = {w, NULL, NULL};
        sd_unet_fuse f = {grad, plan_done, NULL};
        (void)sd_unet_backward_fused(u, g, be, &x, &wts, act, dact, dout, NULL, &f);
    } else {
        sd_unet_backward(u, g, be, &x, w, act, dact, dout, grad);
    }
    p->op_scratch = x.scratch;
    *peak = x.peak_total;
    sd_plan_exec_free(&x);
    return SD_OK;
}

/* The bytes the reduction keeps for receiving (dist_mpi.c's buffer): for
 * ZeRO-2 the largest part of a tensor this rank owns, from every rank (by
 * whole tensors: the largest tensor, or a piece of it); else one block's
 * segments; nothing in a world of one. */
static size_t dist_recv_bytes(const sd_train_opts *o, const sd_unet *u, const sd_unet_graph *g, int rank, int world)
{
    if (world <= 1) return 0;
    if (!o->zero2) return sd_dist_sum_recv_floats(world) * sizeof(float);
    if (o->optimizer != SD_OPT_ADAMW) { /* whole tensors to their owner: the largest, in pieces */
        size_t most = 0;
        for (size_t t = 0; t < u->w.nslots; t++)
            if (u->w.slots[t].n > most) most = u->w.slots[t].n;
        return (most < SD_DIST_PIECE ? most : SD_DIST_PIECE) * (size_t)world * sizeof(float);
    }
    size_t cap = 2 * (g->nops ? g->nops : 1), most = 0;
    size_t *off = malloc(2 * cap * sizeof(size_t));
    if (!off) return sd_dist_sum_recv_floats(world) * sizeof(float); /* the bound: no part exceeds a block */
    size_t k = sd_unet_fused_order(u, g, off, off + cap);
    for (size_t i = 0; i < k; i++) {
        size_t r = sd_dist_range_recv_floats(u->w.total, off[i], off[cap + i], rank, world);
        if (r > most) most = r;
    }
    free(off);
    return most * sizeof(float);
}

/* The limit the plan is held against, and whether it fits. */
static void judge(const sd_train_opts *o, const sd_host_mem *host, size_t device_total, sd_mem_plan *p)
{
    if (o->device >= 0) {
        p->limit = o->gpu_mem_limit ? o->gpu_mem_limit : device_total;
        snprintf(p->limit_from, sizeof p->limit_from, "%s", o->gpu_mem_limit ? "--gpu-memory-limit"
                                                            : device_total ? "device memory" : "none (no device to ask)");
    } else {
        p->limit = o->host_mem_limit ? o->host_mem_limit : host->rss + host->available;
        snprintf(p->limit_from, sizeof p->limit_from, "%s",
                 o->host_mem_limit ? "--host-memory-limit" : "host MemAvailable + process");
    }
    p->fits = !p->limit ? -1 : p->total <= p->limit;
}

/* The plan of one set of shards (mem_plan.h). */
sd_status sd_mem_plan_make(const sd_train_opts *o, const sd_unet *u, const sd_data *d, int rank, int world,
                           const sd_host_mem *host, size_t device_total, sd_mem_plan *p, sd_error *err)
{
    memset(p, 0, sizeof *p);
    if (o->device >= 0) snprintf(p->device, sizeof p->device, "cuda:%d", o->device);
    else snprintf(p->device, sizeof p->device, "cpu");
    size_t bucket = 0;
    if (!largest_bucket(d, &p->width, &p->height, &bucket))
        return sd_err_set(err, SD_EINVAL, "memory plan: the shards have no records to plan a batch for");
    const sd_unet_config *c = &u->cfg;
    p->batch = o->batch;
    p->latent_h = p->height / 8; /* as sd_data_load cuts latents from a bucket */
    p->latent_w = p->width / 8;
    sd_load_opts lo = sd_train_unet_load_opts(c);
    sd_status rc = sd_data_bucket_tokens(d, bucket, &lo, &p->tokens, err);
    if (rc) return rc;
    if (!p->tokens) p->tokens = 77; /* no readable embedding among the first records: one CLIP chunk */
    sd_train_state_bytes sb = sd_train_state_sizes(o, &u->w, rank, world);
    p->weights = sb.weights;
    p->gradients = sb.gradients;
    p->optimizer = sb.optimizer;
    p->ema = sb.ema;
    sd_unet_graph g = {0};
    rc = sd_unet_plan(u, p->batch, p->latent_h, p->latent_w, p->tokens, o->checkpointing, &g, err);
    if (rc) return rc;
    size_t io = (size_t)p->batch * (size_t)c->in_channels * (size_t)p->latent_h * (size_t)p->latent_w;
    /* --fused-backward: the per-op scratch sd_train_fused_pass allocates;
     * --zero2: that scratch and this rank's share (sd_train_zero2_open) */
    if (o->fused_backward) p->gradients = sd_unet_fused_scratch(u, &g) * sizeof(float);
    /* --grad-dtype bf16: the bf16 buffer and the per-op scratch sd_train_g16_backward allocates */
    else if (o->grad_dtype == SD_DT_BF16) p->gradients += sd_train_g16_scratch(u, &g) * sizeof(float);
    p->rank = rank;
    p->world = world;
    if (o->zero2) {
        p->grad_share = p->gradients;
        p->gradients += sd_unet_fused_scratch(u, &g) * sizeof(float);
    }
    /* the reduction's receive buffer (dist_mpi.c) on CPU ranks: one block's
     * segments, or --zero2's largest tensor part */
    if (o->device < 0) p->dist_recv = dist_recv_bytes(o, u, &g, rank, world);
    p->graph_act = g.nact * sizeof(float);
    p->graph_dact = g.ndact * sizeof(float);
    /* the backend's output gradient: dout itself on the CPU, a device buffer on a GPU */
    p->io = io * sizeof(float);
    size_t peak = 0;
    rc = walk_step(o, u, &g, p, &peak, err);
    /* bf16 weights: the per-op widening scratch and the update's chunk
     * (train_w16.c, sd_train_prepare), as they are allocated */
    size_t w16_scratch = o->weight_dtype == SD_DT_BF16
                             ? (sd_unet_graph_wscratch(&g) + sd_train_w16_chunk(o, &u->w)) * sizeof(float) +
                                   sd_train_w16_desc_bytes(o, &u->w)
                             : 0;
    sd_unet_graph_free(&g);
    if (rc) return rc;
    int device = o->device >= 0;
    /* the host's other per-pass buffers (the CPU's dout is the io above) */
    size_t host_io = device ? 0 : sd_train_io_host_bytes(o, io, 0) - p->io;
    p->activations = p->graph_act + p->graph_dact + p->io + host_io;
    /* cuDNN's cap as the context sizes it from the free memory; with no
     * device to ask, a card of --gpu-memory-limit's size */
    p->conv_workspace = device ? sd_dev_conv_workspace(device_total ? device_total : o->gpu_mem_limit, o->gpu_mem_limit)
                               : 0;
    p->workspace = p->op_scratch + p->conv_workspace + w16_scratch + p->dist_recv;
    if (device && o->ema_host) {
        p->ema_host = p->ema;
        p->ema = 0;
    }
    p->process = device ? 0 : host->rss;
    /* the walk's peak is every buffer it was handed plus its largest op's
     * scratch, each rounded as the allocator rounds */
    p->total = peak + host_io + p->conv_workspace + w16_scratch + p->dist_recv + p->process;
    /* ZeRO: rank 0 gathers the whole moments for a checkpoint while the
     * step's buffers stay (sd_train_moments_full), the peak of its run */
    if (sd_train_sharded(o) && rank == 0 && o->device < 0) {
        p->save_gather = o->optimizer == SD_OPT_ADAMW ? 2 * u->w.total * (o->moments == SD_DT_BF16 ? 2 : 4)
                                                      : sd_train_tensor_state_bytes(o, &u->w, -1, world);
        p->total += p->save_gather;
    }
    /* a sample step renders while the step's buffers stay allocated: on top */
    rc = sd_mem_plan_samples(o, u, d, rank, p, err);
    if (rc) return rc;
    p->total += p->samples;
    /* bf16 weights need no term for the start: sd_trainer_open loads or
     * initialises them straight into bf16 (train_open.c), so the start
     * holds the bf16 weights (counted in the step) and at most one
     * tensor's pages of the file it reads (sd_weights_load_bf16) */
    judge(o, host, device_total, p);
    return SD_OK;
}

/* The GPU's memory, when a CUDA device is there to ask; else 0. */
static size_t device_memory(const sd_train_opts *o)
{
#ifdef SDTK_HAVE_CUDA
    sd_error e = {0};
    sd_cuda *c = NULL;
    if (o->device < 0 || sd_cuda_device_count(&e) <= o->device) return 0;
    if (sd_cuda_create(&c, o->device, &(sd_cuda_opts){0}, &e)) return 0;
    sd_cuda_info info;
    sd_cuda_get_info(c, &info);
    sd_cuda_destroy(c);
    return info.total_bytes;
#else
    (void)o;
    return 0;
#endif
}

/* The model's layout only (no weights) from --unet-config, or from --unet
 * (its config may live in the file's metadata): every tensor checked as a
 * run loads it, none copied. */
static sd_status layout_model(const sd_train_opts *o, sd_unet *u, sd_error *err)
{
    if (o->unet) {
        sd_unet_opts uo = {.config_path = o->unet_config};
        return sd_unet_load_bf16(u, o->unet, &uo, NULL, err);
    }
    sd_unet_config c;
    sd_unet_config_default(&c);
    sd_status rc = sd_unet_config_read(o->unet_config, &c, err);
    return rc ? rc : sd_unet_build_names(u, &c, err);
}

/* Shards opened and checked against the model as sd_trainer_open does. */
static sd_status open_checked(const sd_train_opts *o, const sd_unet *u, const char *const *paths, int n, sd_data *d,
                              sd_error *err)
{
    sd_status rc = sd_data_open(d, paths, n, o->batch, o->seed, o->allow_mixed, err);
    if (rc) return rc;
    /* shards this model cannot train on are refused as a run refuses them */
    const sd_unet_config *c = &u->cfg;
    sd_load_opts lo = sd_train_unet_load_opts(c);
    rc = sd_data_check_model(d, &lo, err);
    /* --masked-loss on shards without a mask is refused here as the run refuses it */
    if (!rc && o->masked_loss) rc = sd_data_facts_report(d, paths, 1, 0, err);
    if (rc) sd_data_close(d);
    return rc;
}

/* The training shards' plan, or the validation shard's where its largest
 * bucket needs more (validation runs on the same buffers). */
static sd_status plan_both(const sd_train_opts *o, const sd_unet *u, const sd_data *train, const sd_data *val,
                           int rank, int world, const sd_host_mem *host, size_t device_total, sd_mem_plan *p,
                           sd_error *err)
{
    sd_status rc = sd_mem_plan_make(o, u, train, rank, world, host, device_total, p, err);
    if (rc || !val) return rc;
    sd_mem_plan q;
    rc = sd_mem_plan_make(o, u, val, rank, world, host, device_total, &q, err);
    if (!rc && q.total > p->total) *p = q;
    return rc;
}

/* --memory-plan (mem_plan.h): the layout, the shards, the plan. */
sd_status sd_mem_plan_from_opts(const sd_train_opts *o, const sd_host_mem *host, sd_mem_plan *p, sd_error *err)
{
    sd_unet u;
    memset(&u, 0, sizeof u);
    sd_status rc = layout_model(o, &u, err);
    if (rc) return rc;
    sd_data d, v;
    rc = open_checked(o, &u, o->shards, o->nshards, &d, err);
    if (!rc && o->val_shard && (rc = open_checked(o, &u, &o->val_shard, 1, &v, err))) sd_data_close(&d);
    if (!rc) {
        rc = plan_both(o, &u, &d, o->val_shard ? &v : NULL, sd_dist_rank(), sd_dist_world(), host, device_memory(o),
                       p, err);
        sd_data_close(&d);
        if (o->val_shard) sd_data_close(&v);
    }
    sd_unet_free(&u);
    return rc;
}

/* The plan of an open trainer (its model, shards and, on a GPU, its
 * device's memory), before its first step. */
sd_status sd_mem_plan_trainer(const sd_trainer *tr, const sd_host_mem *host, sd_mem_plan *p, sd_error *err)
{
    size_t device_total = 0;
#ifdef SDTK_HAVE_CUDA
    if (tr->cuda) {
        sd_cuda_info info;
        sd_cuda_get_info(tr->cuda, &info);
        device_total = info.total_bytes;
    }
#endif
    if (!tr->have_data) return sd_err_set(err, SD_EINVAL, "memory plan: no shards");
    return plan_both(&tr->o, &tr->unet, &tr->data, tr->have_val ? &tr->val : NULL, tr->rank, tr->world, host,
                     device_total, p, err);
}
