/* Sinusoidal timestep embedding (diffusers' get_timestep_embedding), the
 * input of the UNet's time MLP, forward and backward. The arithmetic is
 * diffusers' own in fp32 (exponent, exp, t * freq, scale, then sin/cos),
 * so values agree with it to the rounding of fp32 arguments (about 6e-5
 * for t near 1000). Each thread owns whole rows (timesteps). */
#include <math.h>

#include "ops_cpu.h"
#include "ops_math.h"

/* dim >= 2 so there is at least one frequency; the exponent's divisor
 * half - freq_shift must be positive; max_period and scale finite. */
sd_status sd_timestep_emb_check(const sd_temb_shape *s, sd_error *err)
{
    if (s->n <= 0 || s->dim < 2) return sd_err_set(err, SD_EINVAL, "timestep_emb: need n >= 1 and dim >= 2");
    if (!((float)(s->dim / 2) - s->freq_shift > 0.0f) || !isfinite(s->freq_shift))
        return sd_err_set(err, SD_EINVAL, "timestep_emb: dim / 2 - freq_shift must be positive");
    if (!(s->max_period > 0.0f) || !isfinite(s->max_period) || !isfinite(s->scale))
        return sd_err_set(err, SD_EINVAL, "timestep_emb: bad max_period or scale");
    return SD_OK;
}

typedef struct {
    const sd_temb_shape *s;
    float *y, *dt;
    const float *t, *dy;
} temb_ctx;

/* freq_i = exp(-ln(max_period) * i / (half - freq_shift)), the formula
 * shared with the CUDA kernel (ops_math.h). */
static float temb_freq(const sd_temb_shape *s, int i)
{
    return sdm_temb_freq(s->dim, s->freq_shift, s->max_period, i);
}

/* Forward: one row per timestep, [sin | cos] or [cos | sin], zero pad. */
static void temb_fwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const temb_ctx *c = vctx;
    const sd_temb_shape *s = c->s;
    int half = s->dim / 2;
    (void)worker;
    for (size_t r = begin; r < end; r++) {
        float *yr = c->y + r * (size_t)s->dim;
        float *ysin = s->flip_sin_to_cos ? yr + half : yr, *ycos = s->flip_sin_to_cos ? yr : yr + half;
        for (int i = 0; i < half; i++) {
            float arg = s->scale * (c->t[r] * temb_freq(s, i));
            ysin[i] = sinf(arg);
            ycos[i] = cosf(arg);
        }
        if (s->dim % 2) yr[s->dim - 1] = 0.0f;
    }
}

/* y [n, dim] from t [n]; SD's UNet: flip_sin_to_cos 1, freq_shift 0. */
void sd_timestep_emb_fwd(sd_pool *pool, const sd_temb_shape *s, float *y, const float *t)
{
    temb_ctx c = {.s = s, .y = y, .t = t};
    sd_pool_for(pool, (size_t)s->n, temb_fwd_range, &c);
}

/* Backward per row: d sin(arg)/dt = scale * freq * cos(arg) and
 * d cos(arg)/dt = -scale * freq * sin(arg), summed over the row in order. */
static void temb_bwd_range(void *vctx, int worker, size_t begin, size_t end)
{
    const temb_ctx *c = vctx;
    const sd_temb_shape *s = c->s;
    int half = s->dim / 2;
    (void)worker;
    for (size_t r = begin; r < end; r++) {
        const float *gr = c->dy + r * (size_t)s->dim;
        const float *gsin = s->flip_sin_to_cos ? gr + half : gr, *gcos = s->flip_sin_to_cos ? gr : gr + half;
        float acc = 0.0f;
        for (int i = 0; i < half; i++) {
            float f = temb_freq(s, i), arg = s->scale * (c->t[r] * f);
            acc += s->scale * f * (gsin[i] * cosf(arg) - gcos[i] * sinf(arg));
        }
        c->dt[r] += acc;
    }
}

/* The embedding is smooth in t, so a real gradient exists (fractional
 * timesteps, learned-time schemes); with integer timesteps from a sampler
 * the caller just passes dt = NULL and nothing runs. */
void sd_timestep_emb_bwd(sd_pool *pool, const sd_temb_shape *s, float *dt, const float *dy, const float *t)
{
    temb_ctx c = {.s = s, .dt = dt, .t = t, .dy = dy};
    if (dt) sd_pool_for(pool, (size_t)s->n, temb_bwd_range, &c);
}
