/* The CPU backend table: the reference ops of ops_cpu.h. */
#include "backend.h"

static const sd_backend cpu_backend = {
    .name = "cpu",
    .conv2d_fwd = sd_conv2d_fwd,
    .conv2d_bwd = sd_conv2d_bwd,
    .group_norm_fwd = sd_group_norm_fwd,
    .group_norm_bwd = sd_group_norm_bwd,
    .linear_fwd = sd_linear_fwd,
    .linear_bwd = sd_linear_bwd,
    .silu_fwd = sd_silu_fwd,
    .silu_bwd = sd_silu_bwd,
    .add_fwd = sd_add_fwd,
    .add_bwd = sd_add_bwd,
    .upsample2x_fwd = sd_upsample2x_fwd,
    .upsample2x_bwd = sd_upsample2x_bwd,
    .attn_fwd = sd_attn_fwd,
    .attn_bwd = sd_attn_bwd,
    .layer_norm_fwd = sd_layer_norm_fwd,
    .layer_norm_bwd = sd_layer_norm_bwd,
    .gelu_fwd = sd_gelu_fwd,
    .gelu_bwd = sd_gelu_bwd,
    .quick_gelu_fwd = sd_quick_gelu_fwd,
    .quick_gelu_bwd = sd_quick_gelu_bwd,
    .geglu_fwd = sd_geglu_fwd,
    .geglu_bwd = sd_geglu_bwd,
    .scale_fwd = sd_scale_fwd,
    .scale_bwd = sd_scale_bwd,
    .mul_fwd = sd_mul_fwd,
    .mul_bwd = sd_mul_bwd,
    .concat_fwd = sd_concat_fwd,
    .concat_bwd = sd_concat_bwd,
    .add_bcast_channel_fwd = sd_add_bcast_channel_fwd,
    .add_bcast_channel_bwd = sd_add_bcast_channel_bwd,
    .timestep_emb_fwd = sd_timestep_emb_fwd,
    .timestep_emb_bwd = sd_timestep_emb_bwd,
    .embedding_fwd = sd_embedding_fwd,
    .embedding_bwd = sd_embedding_bwd,
};

/* The table every caller uses until a device backend is chosen. */
const sd_backend *sd_backend_cpu(void)
{
    return &cpu_backend;
}
