/* conv2d on cuDNN (legacy convolution API): forward, backward data,
 * backward filter, bias through cudnnAddTensor / ConvolutionBackwardBias.
 *
 * cuDNN pads symmetrically; the engine's conv pads each side on its own
 * (the VAE downsample is pad (t, b, l, r) = (0, 1, 0, 1)). Asymmetric
 * shapes get an explicitly zero-padded copy of the input in scratch and
 * run with no cuDNN padding; their input gradient is computed into a
 * padded scratch and its interior added to dx.
 *
 * Per shape a plan keeps the descriptors and, per direction, the algorithm
 * chosen once from cuDNN's heuristics (cudnnGet*Algorithm_v7: no trial
 * runs, so nothing is written while choosing): the first one whose math is
 * allowed (strict fp32 = FMA math unless TF32 is on), whose workspace fits
 * the context's limit, and, for the backward passes, deterministic when
 * such an algorithm exists. Backward adds into dx/dw/db (beta = 1).
 *
 * Mixed precision (opts.mixed): the plan's x, w and y descriptors are
 * 16-bit and NHWC (cuDNN's legacy API takes x, w and y of one type, with
 * fp32 accumulation, and its 16-bit tensor-core kernels run channels-last:
 * with NCHW the VAE encoded 4x slower than with TF32 on an H100). Every
 * call runs on 16-bit NHWC copies of its inputs, made by one transposing
 * kernel each, and writes its result into a 16-bit NHWC scratch that is
 * then transposed back and widened into the fp32 NCHW output, set
 * (forward) or added (gradients). Bias and its gradient stay fp32. The
 * copies are scratch on top of strict mode's: about half the input and
 * half the output again (an asymmetrically padded input has its fp32
 * padded copy and the 16-bit one alive together for a moment). */
#include <stdlib.h>
#include <string.h>

#include "cuda_int.h"
#include "dev_ws.h"
#include "dtype.h"

struct sdc_conv_plan {
    sd_conv2d_shape s;
    int padded; /* explicit padding copy */
    int hp, wp; /* input size cuDNN sees */
    cudnnTensorDescriptor_t xd, yd, bd, yfd; /* yfd: y in fp32 (bias and its gradient) */
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    int have_fwd, have_bwd_data, have_bwd_filter;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    cudnnMathType_t fwd_math, bwd_data_math, bwd_filter_math;
    size_t fwd_ws, bwd_data_ws, bwd_filter_ws;
};

/* Field-by-field shape equality (the plan cache key). */
static int same_shape(const sd_conv2d_shape *a, const sd_conv2d_shape *b)
{
    return a->n == b->n && a->cin == b->cin && a->h == b->h && a->w == b->w && a->cout == b->cout &&
           a->kh == b->kh && a->kw == b->kw && a->stride == b->stride && a->pad_t == b->pad_t &&
           a->pad_b == b->pad_b && a->pad_l == b->pad_l && a->pad_r == b->pad_r;
}

/* Descriptors of one plan (NULL handles are skipped by cuDNN's destroy). */
static void plan_free(sdc_conv_plan *p)
{
    if (!p) return;
    if (p->xd) cudnnDestroyTensorDescriptor(p->xd);
    if (p->yd) cudnnDestroyTensorDescriptor(p->yd);
    if (p->bd) cudnnDestroyTensorDescriptor(p->bd);
    if (p->yfd) cudnnDestroyTensorDescriptor(p->yfd);
    if (p->wd) cudnnDestroyFilterDescriptor(p->wd);
    if (p->cd) cudnnDestroyConvolutionDescriptor(p->cd);
    free(p);
}

/* Every plan of the context (called by sd_cuda_destroy, cuda_backend.c). */
void sdc_conv_plans_free(sd_cuda *c)
{
    for (size_t i = 0; i < c->nplans; i++) plan_free(c->plans[i]);
    free(c->plans);
    c->plans = NULL;
    c->nplans = c->capplans = 0;
}

/* Descriptors for shape s: NCHW tensors of the context's input type,
 * cross-correlation (torch's conv), fp32 compute; padding in cuDNN when
 * symmetric, else explicit. */
static sdc_conv_plan *plan_new(sd_cuda *c, const sd_conv2d_shape *s)
{
    sdc_conv_plan *p = calloc(1, sizeof *p);
    if (!p) {
        sdc_fail(c, SD_ENOMEM, "out of host memory for a convolution plan");
        return NULL;
    }
    p->s = *s;
    p->padded = s->pad_t != s->pad_b || s->pad_l != s->pad_r;
    p->hp = p->padded ? s->h + s->pad_t + s->pad_b : s->h;
    p->wp = p->padded ? s->w + s->pad_l + s->pad_r : s->w;
    int ph = p->padded ? 0 : s->pad_t, pw = p->padded ? 0 : s->pad_l;
    int oh = sd_conv2d_out_h(s), ow = sd_conv2d_out_w(s);
    cudnnDataType_t dt = c->opts.mixed == SD_DT_BF16 ? CUDNN_DATA_BFLOAT16
                         : c->opts.mixed == SD_DT_F16 ? CUDNN_DATA_HALF
                                                      : CUDNN_DATA_FLOAT;
    cudnnTensorFormat_t fmt = c->opts.mixed ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    int ok = sdc_dnn_ok(c, cudnnCreateTensorDescriptor(&p->xd), "descriptor") &&
             sdc_dnn_ok(c, cudnnCreateTensorDescriptor(&p->yfd), "descriptor") &&
             sdc_dnn_ok(c, cudnnCreateTensorDescriptor(&p->yd), "descriptor") &&
             sdc_dnn_ok(c, cudnnCreateTensorDescriptor(&p->bd), "descriptor") &&
             sdc_dnn_ok(c, cudnnCreateFilterDescriptor(&p->wd), "descriptor") &&
             sdc_dnn_ok(c, cudnnCreateConvolutionDescriptor(&p->cd), "descriptor") &&
             sdc_dnn_ok(c,
                        cudnnSetTensor4dDescriptor(p->xd, fmt, dt, s->n, s->cin, p->hp, p->wp),
                        "conv2d input descriptor") &&
             sdc_dnn_ok(c,
                        cudnnSetTensor4dDescriptor(p->yd, fmt, dt, s->n, s->cout, oh, ow),
                        "conv2d output descriptor") &&
             sdc_dnn_ok(c,
                        cudnnSetTensor4dDescriptor(p->yfd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s->n, s->cout, oh,
                                                   ow),
                        "conv2d output descriptor") &&
             sdc_dnn_ok(c, cudnnSetTensor4dDescriptor(p->bd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, s->cout, 1, 1),
                        "conv2d bias descriptor") &&
             sdc_dnn_ok(c,
                        cudnnSetFilter4dDescriptor(p->wd, dt, fmt, s->cout, s->cin, s->kh, s->kw),
                        "conv2d filter descriptor") &&
             sdc_dnn_ok(c,
                        cudnnSetConvolution2dDescriptor(p->cd, ph, pw, s->stride, s->stride, 1, 1,
                                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                        "conv2d descriptor");
    if (ok) {
        int n, ch, h, w;
        ok = sdc_dnn_ok(c, cudnnGetConvolution2dForwardOutputDim(p->cd, p->xd, p->wd, &n, &ch, &h, &w),
                        "conv2d output size");
        if (ok && (n != s->n || ch != s->cout || h != oh || w != ow)) {
            sdc_fail(c, SD_EINVAL, "conv2d: cuDNN output %dx%dx%dx%d, engine expects %dx%dx%dx%d", n, ch, h, w, s->n,
                     s->cout, oh, ow);
            ok = 0;
        }
    }
    if (!ok) {
        plan_free(p);
        return NULL;
    }
    return p;
}

/* The plan for s, made on first use. */
static sdc_conv_plan *plan_get(sd_cuda *c, const sd_conv2d_shape *s)
{
    for (size_t i = 0; i < c->nplans; i++)
        if (same_shape(&c->plans[i]->s, s)) return c->plans[i];
    if (c->nplans == c->capplans) {
        size_t cap = c->capplans ? 2 * c->capplans : 16;
        sdc_conv_plan **np = realloc(c->plans, cap * sizeof *np);
        if (!np) {
            sdc_fail(c, SD_ENOMEM, "out of host memory for convolution plans");
            return NULL;
        }
        c->plans = np;
        c->capplans = cap;
    }
    sdc_conv_plan *p = plan_new(c, s);
    if (p) c->plans[c->nplans++] = p;
    return p;
}

/* Tensor cores are allowed: TF32 is on, or the inputs are 16-bit. */
static int tensor_ok(const sd_cuda *c)
{
    return c->opts.allow_tf32 || c->opts.mixed;
}

/* The math type to ask the heuristics with and to fall back on: tensor
 * ops for 16-bit inputs (default math leaves them on slow non-tensor-core
 * kernels: 25 TFLOP/s forward, under 1 backward, for a 128-channel 3x3
 * convolution on an H100), default (TF32 allowed) with TF32, else FMA. */
static cudnnMathType_t ask_math(const sd_cuda *c)
{
    return c->opts.mixed ? CUDNN_TENSOR_OP_MATH : c->opts.allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

/* The math type of the fallback algorithms: tensor ops for 16-bit inputs,
 * else FMA (also with TF32, as before mixed precision existed). */
static cudnnMathType_t fallback_math(const sd_cuda *c)
{
    return c->opts.mixed ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

/* The math type to run an algorithm with: its own when tensor cores are
 * allowed, else FMA (no tensor-core TF32 rounding of fp32 inputs). */
static cudnnMathType_t run_math(const sd_cuda *c, cudnnMathType_t offered)
{
    return tensor_ok(c) ? offered : CUDNN_FMA_MATH;
}

/* Forward algorithm: heuristic order, first that runs with our math
 * within the workspace limit; IMPLICIT_GEMM (no workspace) otherwise. */
static int choose_fwd(sd_cuda *c, sdc_conv_plan *p)
{
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0;
    cudnnSetConvolutionMathType(p->cd, ask_math(c));
    if (!sdc_dnn_ok(c,
                    cudnnGetConvolutionForwardAlgorithm_v7(c->dnn, p->xd, p->wd, p->cd, p->yd,
                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf),
                    "conv2d forward heuristics"))
        return 0;
    for (int i = 0; i < got; i++) {
        size_t ws = 0;
        cudnnMathType_t m = run_math(c, perf[i].mathType);
        if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
        if (cudnnSetConvolutionMathType(p->cd, m) != CUDNN_STATUS_SUCCESS) continue;
        if (cudnnGetConvolutionForwardWorkspaceSize(c->dnn, p->xd, p->wd, p->cd, p->yd, perf[i].algo, &ws) !=
                CUDNN_STATUS_SUCCESS ||
            ws > c->opts.conv_workspace)
            continue;
        p->fwd = perf[i].algo;
        p->fwd_math = m;
        p->fwd_ws = ws;
        return p->have_fwd = 1;
    }
    p->fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    p->fwd_math = fallback_math(c);
    cudnnSetConvolutionMathType(p->cd, p->fwd_math);
    if (!sdc_dnn_ok(c, cudnnGetConvolutionForwardWorkspaceSize(c->dnn, p->xd, p->wd, p->cd, p->yd, p->fwd, &p->fwd_ws),
                    "conv2d forward workspace"))
        return 0;
    return p->have_fwd = 1;
}

/* With opts.conv_search: the forward algorithms timed on this shape by
 * cuDNN (cudnnFindConvolutionForwardAlgorithmEx, on the op's own input,
 * weights and output, which the real call then overwrites), the fastest
 * one with our math within the workspace limit. 0 when none qualified
 * (the heuristic choice follows). */
static int search_fwd(sd_cuda *c, sdc_conv_plan *p, const void *x, const void *w, void *y)
{
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0;
    size_t wsb = c->opts.conv_workspace;
    void *ws = NULL;
    while (wsb >= ((size_t)1 << 20) && !(ws = sdc_alloc(c, wsb))) {
        /* forget only this allocation's failure (the op was live on entry), try half */
        c->failed = 0;
        memset(&c->err, 0, sizeof c->err);
        wsb /= 2;
    }
    if (!ws) wsb = 0;
    cudnnSetConvolutionMathType(p->cd, ask_math(c));
    cudnnStatus_t st = cudnnFindConvolutionForwardAlgorithmEx(c->dnn, p->xd, x, p->wd, w, p->cd, p->yd, y,
                                                              CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf, ws, wsb);
    sdc_release(c, ws);
    if (st != CUDNN_STATUS_SUCCESS) return 0;
    for (int i = 0; i < got; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > wsb) continue;
        if (!tensor_ok(c) && perf[i].mathType != CUDNN_FMA_MATH) continue;
        p->fwd = perf[i].algo;
        p->fwd_math = perf[i].mathType;
        p->fwd_ws = perf[i].memory;
        return p->have_fwd = 1;
    }
    return 0;
}

/* Backward-data algorithm: deterministic ones first, then any; ALGO_1
 * (deterministic) as the fallback. */
static int choose_bwd_data(sd_cuda *c, sdc_conv_plan *p)
{
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int got = 0;
    cudnnSetConvolutionMathType(p->cd, ask_math(c));
    if (!sdc_dnn_ok(c,
                    cudnnGetConvolutionBackwardDataAlgorithm_v7(c->dnn, p->wd, p->yd, p->cd, p->xd,
                                                                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, perf),
                    "conv2d backward-data heuristics"))
        return 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < got; i++) {
            size_t ws = 0;
            cudnnMathType_t m = run_math(c, perf[i].mathType);
            if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
            if (pass == 0 && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
            if (cudnnSetConvolutionMathType(p->cd, m) != CUDNN_STATUS_SUCCESS) continue;
            if (cudnnGetConvolutionBackwardDataWorkspaceSize(c->dnn, p->wd, p->yd, p->cd, p->xd, perf[i].algo, &ws) !=
                    CUDNN_STATUS_SUCCESS ||
                ws > c->opts.conv_workspace)
                continue;
            p->bwd_data = perf[i].algo;
            p->bwd_data_math = m;
            p->bwd_data_ws = ws;
            return p->have_bwd_data = 1;
        }
    }
    p->bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    p->bwd_data_math = fallback_math(c);
    cudnnSetConvolutionMathType(p->cd, p->bwd_data_math);
    if (!sdc_dnn_ok(c,
                    cudnnGetConvolutionBackwardDataWorkspaceSize(c->dnn, p->wd, p->yd, p->cd, p->xd, p->bwd_data,
                                                                 &p->bwd_data_ws),
                    "conv2d backward-data workspace"))
        return 0;
    return p->have_bwd_data = 1;
}

/* Backward-filter algorithm: as backward data. */
static int choose_bwd_filter(sd_cuda *c, sdc_conv_plan *p)
{
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int got = 0;
    cudnnSetConvolutionMathType(p->cd, ask_math(c));
    if (!sdc_dnn_ok(c,
                    cudnnGetConvolutionBackwardFilterAlgorithm_v7(c->dnn, p->xd, p->yd, p->cd, p->wd,
                                                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, perf),
                    "conv2d backward-filter heuristics"))
        return 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < got; i++) {
            size_t ws = 0;
            cudnnMathType_t m = run_math(c, perf[i].mathType);
            if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
            if (pass == 0 && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
            if (cudnnSetConvolutionMathType(p->cd, m) != CUDNN_STATUS_SUCCESS) continue;
            if (cudnnGetConvolutionBackwardFilterWorkspaceSize(c->dnn, p->xd, p->yd, p->cd, p->wd, perf[i].algo,
                                                               &ws) != CUDNN_STATUS_SUCCESS ||
                ws > c->opts.conv_workspace)
                continue;
            p->bwd_filter = perf[i].algo;
            p->bwd_filter_math = m;
            p->bwd_filter_ws = ws;
            return p->have_bwd_filter = 1;
        }
    }
    p->bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    p->bwd_filter_math = fallback_math(c);
    cudnnSetConvolutionMathType(p->cd, p->bwd_filter_math);
    if (!sdc_dnn_ok(c,
                    cudnnGetConvolutionBackwardFilterWorkspaceSize(c->dnn, p->xd, p->yd, p->cd, p->wd, p->bwd_filter,
                                                                   &p->bwd_filter_ws),
                    "conv2d backward-filter workspace"))
        return 0;
    return p->have_bwd_filter = 1;
}

/* Elements of the input as cuDNN sees it (padded), of the weights, of
 * the output. */
static size_t x_count(const sdc_conv_plan *p)
{
    return (size_t)p->s.n * (size_t)p->s.cin * (size_t)p->hp * (size_t)p->wp;
}

static size_t w_count(const sd_conv2d_shape *s)
{
    return (size_t)s->cout * (size_t)s->cin * (size_t)s->kh * (size_t)s->kw;
}

static size_t y_count(const sd_conv2d_shape *s)
{
    return (size_t)s->n * (size_t)s->cout * (size_t)sd_conv2d_out_h(s) * (size_t)sd_conv2d_out_w(s);
}

/* n images of ch x hw fp32 as cuDNN takes them: x itself, or in mixed
 * precision a 16-bit NHWC copy left in *tmp for the caller to release.
 * NULL when out of memory (recorded). */
static const void *as_operand(sd_cuda *c, const float *x, int n, int ch, int hw, void **tmp, const char *what)
{
    *tmp = NULL;
    if (!c->opts.mixed) return x;
    void *h = sdc_alloc(c, (size_t)n * (size_t)ch * (size_t)hw * 2);
    if (!h) return NULL;
    if (!sdc_cuda_ok(c, sdk_to_half_t(c, c->opts.mixed, n, ch, hw, h, x), what)) {
        sdc_release(c, h);
        return NULL;
    }
    return *tmp = h;
}

/* The weights as cuDNN takes them (KCRS fp32, or KRSC 16-bit). */
static const void *weight_operand(sd_cuda *c, const sd_conv2d_shape *s, const float *w, void **tmp)
{
    return as_operand(c, w, s->cout, s->cin, s->kh * s->kw, tmp, "conv2d weight");
}

/* The input as cuDNN sees it: x itself, or a zero-padded copy, in the
 * context's input type and layout (as_operand); scratch made for it is
 * left in *tmp for the caller to release. NULL on failure. (One stream: a
 * scratch released here is reused only by later work.) */
static const void *conv_input(sd_cuda *c, const sdc_conv_plan *p, const float *x, void **tmp)
{
    *tmp = NULL;
    const sd_conv2d_shape *s = &p->s;
    float *xp = NULL;
    if (p->padded) {
        size_t planes = (size_t)s->n * (size_t)s->cin;
        xp = sdc_alloc(c, sd_dev_conv_pad_bytes(s)); /* x_count(p) floats (dev_ws.h: the memory plan's too) */
        if (!xp) return NULL;
        if (!sdc_cuda_ok(c, sdk_pad(c, planes, s->h, s->w, s->pad_t, s->pad_b, s->pad_l, s->pad_r, xp, x),
                         "conv2d pad")) {
            sdc_release(c, xp);
            return NULL;
        }
    }
    void *h;
    const void *in = as_operand(c, xp ? xp : x, s->n, s->cin, p->hp * p->wp, &h, "conv2d input");
    if (h || !in) sdc_release(c, xp); /* copied on, or failed: the padded fp32 copy is done with */
    *tmp = h ? h : in ? xp : NULL;
    return in;
}

/* Workspace of `bytes` from the allocator (NULL and no error for 0);
 * *ok cleared on failure. */
static void *workspace(sd_cuda *c, size_t bytes, int *ok)
{
    if (!bytes) return NULL;
    void *w = sdc_alloc(c, bytes);
    if (!w) *ok = 0;
    return w;
}

/* y = conv(x, w) + b: in mixed precision cuDNN writes a 16-bit scratch,
 * widened into y before the bias is added. */
void sdc_conv2d_fwd(sd_cuda *c, const sd_conv2d_shape *s, float *y, const float *x, const float *w, const float *b)
{
    sdc_conv_plan *p = plan_get(c, s);
    if (!p) return;
    void *tx = NULL, *tw = NULL, *ty = NULL;
    const void *xa = conv_input(c, p, x, &tx);
    const void *wa = xa ? weight_operand(c, s, w, &tw) : NULL;
    void *ya = !wa ? NULL : c->opts.mixed ? (ty = sdc_alloc(c, y_count(s) * 2)) : (void *)y;
    if (ya && (p->have_fwd || (c->opts.conv_search && search_fwd(c, p, xa, wa, ya)) || choose_fwd(c, p))) {
        int ok = 1;
        void *ws = workspace(c, p->fwd_ws, &ok);
        const float one = 1.0f, zero = 0.0f;
        if (ok && sdc_dnn_ok(c, cudnnSetConvolutionMathType(p->cd, p->fwd_math), "conv2d math type") &&
            sdc_dnn_ok(c,
                       cudnnConvolutionForward(c->dnn, &one, p->xd, xa, p->wd, wa, p->cd, p->fwd, ws, p->fwd_ws, &zero,
                                               p->yd, ya),
                       "conv2d forward") &&
            (!ty || sdc_cuda_ok(c,
                                sdk_from_half_t(c, c->opts.mixed, s->n, sd_conv2d_out_h(s) * sd_conv2d_out_w(s),
                                                s->cout, y, ty, 0),
                                "conv2d output")) &&
            b)
            sdc_dnn_ok(c, cudnnAddTensor(c->dnn, &one, p->bd, b, &one, p->yfd, y), "conv2d bias");
        sdc_release(c, ws);
    }
    sdc_release(c, ty);
    sdc_release(c, tw);
    sdc_release(c, tx);
}

/* dx += g, the input gradient cuDNN wrote into scratch (the input's type
 * and layout, padded size): widened to NCHW, and its interior taken when
 * padded. */
static void add_input_grad(sd_cuda *c, const sdc_conv_plan *p, float *dx, const void *g)
{
    const sd_conv2d_shape *s = &p->s;
    size_t planes = (size_t)s->n * (size_t)s->cin;
    int hw = p->hp * p->wp;
    if (c->opts.mixed && !p->padded) {
        sdc_cuda_ok(c, sdk_from_half_t(c, c->opts.mixed, s->n, hw, s->cin, dx, g, 1), "conv2d input gradient");
        return;
    }
    float *wide = NULL;
    if (c->opts.mixed) {
        wide = sdc_alloc(c, x_count(p) * sizeof(float));
        if (!wide || !sdc_cuda_ok(c, sdk_from_half_t(c, c->opts.mixed, s->n, hw, s->cin, wide, g, 0),
                                  "conv2d input gradient")) {
            sdc_release(c, wide);
            return;
        }
    }
    sdc_cuda_ok(c,
                sdk_crop_add(c, planes, s->h, s->w, s->pad_t, s->pad_b, s->pad_l, s->pad_r, dx,
                             wide ? wide : (const float *)g),
                "conv2d unpad");
    sdc_release(c, wide);
}

/* Input gradient from dya (dy as the products take it): straight into dx
 * with beta = 1 when fp32 and unpadded, else through a scratch that
 * add_input_grad adds to dx. */
static void conv_bwd_data(sd_cuda *c, sdc_conv_plan *p, float *dx, const void *dya, const float *w)
{
    if (!p->have_bwd_data && !choose_bwd_data(c, p)) return;
    int direct = !p->padded && !c->opts.mixed, ok = 1;
    void *tw = NULL;
    const void *wa = weight_operand(c, &p->s, w, &tw);
    void *g = !wa ? NULL : direct ? (void *)dx : workspace(c, x_count(p) * sdc_ab_size(c), &ok);
    void *ws = g ? workspace(c, p->bwd_data_ws, &ok) : NULL;
    const float one = 1.0f, zero = 0.0f;
    if (g && ok && sdc_dnn_ok(c, cudnnSetConvolutionMathType(p->cd, p->bwd_data_math), "conv2d math type") &&
        sdc_dnn_ok(c,
                   cudnnConvolutionBackwardData(c->dnn, &one, p->wd, wa, p->yd, dya, p->cd, p->bwd_data, ws,
                                                p->bwd_data_ws, direct ? &one : &zero, p->xd, g),
                   "conv2d backward data") &&
        !direct)
        add_input_grad(c, p, dx, g);
    sdc_release(c, ws);
    if (!direct) sdc_release(c, g);
    sdc_release(c, tw);
}

/* Weight gradient from dya, accumulated into dw (beta = 1), or in mixed
 * precision written into a 16-bit KRSC scratch and added widened. */
static void conv_bwd_filter(sd_cuda *c, sdc_conv_plan *p, float *dw, const void *dya, const float *x)
{
    if (!p->have_bwd_filter && !choose_bwd_filter(c, p)) return;
    void *tx = NULL, *tg = NULL;
    const void *xa = conv_input(c, p, x, &tx);
    if (!xa) return;
    int ok = 1;
    void *g = c->opts.mixed ? (tg = workspace(c, w_count(&p->s) * 2, &ok)) : (void *)dw;
    void *ws = ok ? workspace(c, p->bwd_filter_ws, &ok) : NULL;
    const float one = 1.0f, zero = 0.0f;
    if (ok && sdc_dnn_ok(c, cudnnSetConvolutionMathType(p->cd, p->bwd_filter_math), "conv2d math type") &&
        sdc_dnn_ok(c,
                   cudnnConvolutionBackwardFilter(c->dnn, &one, p->xd, xa, p->yd, dya, p->cd, p->bwd_filter, ws,
                                                  p->bwd_filter_ws, tg ? &zero : &one, p->wd, g),
                   "conv2d backward filter") &&
        tg)
        sdc_cuda_ok(c, sdk_from_half_t(c, c->opts.mixed, p->s.cout, p->s.kh * p->s.kw, p->s.cin, dw, tg, 1),
                    "conv2d weight gradient");
    sdc_release(c, ws);
    sdc_release(c, tg);
    sdc_release(c, tx);
}

/* dx, dw, db each added into when not NULL; dy taken in the products'
 * input type once for both. */
void sdc_conv2d_bwd(sd_cuda *c, const sd_conv2d_shape *s, float *dx, float *dw, float *db, const float *dy,
                    const float *x, const float *w)
{
    sdc_conv_plan *p = plan_get(c, s);
    if (!p) return;
    const float one = 1.0f;
    if (db)
        sdc_dnn_ok(c, cudnnConvolutionBackwardBias(c->dnn, &one, p->yfd, dy, &one, p->bd, db), "conv2d bias grad");
    if (!dw && !dx) return;
    void *tdy = NULL;
    const void *dya = as_operand(c, dy, s->n, s->cout, sd_conv2d_out_h(s) * sd_conv2d_out_w(s), &tdy,
                                 "conv2d output gradient");
    if (dya && dw) conv_bwd_filter(c, p, dw, dya, x);
    if (dya && dx) conv_bwd_data(c, p, dx, dya, w);
    sdc_release(c, tdy);
}
