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
};

/* The table every caller uses until a device backend is chosen. */
const sd_backend *sd_backend_cpu(void)
{
    return &cpu_backend;
}
