/* The memory plan as JSON (mem_plan.h): one object, bytes as integers. */
#include "mem_plan.h"

#include "dtype.h"

/* The setup the plan is for: what changes its numbers. */
static void setup_json(const sd_train_opts *o, FILE *f)
{
    fprintf(f, "\"setup\": {\"optimizer\": \"%s\", \"adam_moments\": \"%s\", \"gradient_checkpointing\": %s, "
               "\"ema\": %s, \"ema_on_cpu\": %s, \"threads\": %d, \"zero1\": %s, \"zero2\": %s, "
               "\"fused_backward\": %s, \"weight_dtype\": \"%s\", \"grad_dtype\": \"%s\"}",
            sd_optimizer_name(o->optimizer), o->moments == SD_DT_BF16 ? "bf16" : "fp32",
            o->checkpointing ? "true" : "false", o->ema_decay > 0 ? "true" : "false",
            o->ema_host && o->device >= 0 ? "true" : "false", o->threads, o->zero1 || o->zero2 ? "true" : "false",
            o->zero2 ? "true" : "false", o->fused_backward ? "true" : "false",
            o->weight_dtype == SD_DT_BF16 ? "bf16" : "fp32", o->grad_dtype == SD_DT_BF16 ? "bf16" : "fp32");
}

/* One line of JSON; the categories first, then their parts and the limit. */
void sd_mem_plan_json(const sd_mem_plan *p, const sd_train_opts *o, FILE *f)
{
    fprintf(f, "{\"device\": \"%s\", \"weights\": %zu, \"gradients\": %zu, \"optimizer\": %zu, \"ema\": %zu, "
               "\"activations\": %zu, \"workspace\": %zu, \"process\": %zu, \"samples\": %zu, \"total\": %zu, ",
            p->device, p->weights, p->gradients, p->optimizer, p->ema, p->activations, p->workspace, p->process,
            p->samples, p->total);
    fprintf(f, "\"bucket\": {\"width\": %d, \"height\": %d, \"latent\": [%d, %d], \"batch\": %d, \"tokens\": %d}, ",
            p->width, p->height, p->latent_h, p->latent_w, p->batch, p->tokens);
    fprintf(f, "\"detail\": {\"graph_activations\": %zu, \"graph_activation_gradients\": %zu, \"output_gradient\": %zu, "
               "\"op_scratch\": %zu, \"cudnn_workspace\": %zu, \"ema_on_host\": %zu, "
               "\"reduction_buffer\": %zu, \"gradient_share\": %zu, \"rank\": %d, \"ranks\": %d, \"save_gather\": %zu, "
               "\"sample_vae_weights\": %zu, \"sample_conditioning\": %zu, \"sample_unet\": %zu, "
               "\"sample_decode\": %zu, \"sample_size\": [%d, %d]}, ",
            p->graph_act, p->graph_dact, p->io, p->op_scratch, p->conv_workspace, p->ema_host, p->dist_recv,
            p->grad_share, p->rank, p->world, p->save_gather, p->sample_vae, p->sample_cond, p->sample_unet,
            p->sample_decode, p->sample_w, p->sample_h);
    setup_json(o, f);
    fprintf(f, ", \"limit\": %zu, \"limit_from\": \"%s\", \"fits\": %s}\n", p->limit, p->limit_from,
            p->fits < 0 ? "null" : p->fits ? "true" : "false");
}
