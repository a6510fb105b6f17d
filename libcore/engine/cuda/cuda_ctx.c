/* The CUDA context: device, stream, cuBLAS and cuDNN handles, the first
 * error since the last sync, and a caching device allocator (freed blocks
 * are kept and handed out again, so steady-state steps never call
 * cudaMalloc/cudaFree, which synchronise the device). All work runs in
 * order on the one stream, so a block released by one op can be reused by
 * the next without waiting: the stream orders the two uses. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_int.h"
#include "dev_ws.h"
#include "dtype.h"

enum { SMALL_LIMIT = 1 << 20, SMALL_ROUND = 512, LARGE_ROUND = 2 << 20 };

/* The first failure wins: later ones are usually its consequences. */
void sdc_fail(sd_cuda *c, sd_status code, const char *fmt, ...)
{
    if (c->failed) return;
    c->failed = 1;
    c->err.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err.msg, sizeof c->err.msg, fmt, ap);
    va_end(ap);
}

/* CUDA runtime status check; out-of-memory maps to SD_ENOMEM. */
int sdc_cuda_ok(sd_cuda *c, cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 1;
    sdc_fail(c, e == cudaErrorMemoryAllocation ? SD_ENOMEM : SD_EIO, "CUDA %s: %s (%s)", what, cudaGetErrorString(e),
             cudaGetErrorName(e));
    return 0;
}

/* cuDNN status check, with cuDNN's own last error text when it has one. */
int sdc_dnn_ok(sd_cuda *c, cudnnStatus_t e, const char *what)
{
    if (e == CUDNN_STATUS_SUCCESS) return 1;
    char detail[160];
    cudnnGetLastErrorString(detail, sizeof detail);
    sdc_fail(c, e == CUDNN_STATUS_ALLOC_FAILED ? SD_ENOMEM : SD_EIO, "cuDNN %s: %s %s", what, cudnnGetErrorString(e),
             detail);
    return 0;
}

/* cuBLAS status check. */
int sdc_blas_ok(sd_cuda *c, cublasStatus_t e, const char *what)
{
    if (e == CUBLAS_STATUS_SUCCESS) return 1;
    sdc_fail(c, e == CUBLAS_STATUS_ALLOC_FAILED ? SD_ENOMEM : SD_EIO, "cuBLAS %s: %s", what,
             cublasGetStatusString(e));
    return 0;
}

/* How many devices the runtime sees; the runtime's reason when none. */
int sd_cuda_device_count(sd_error *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        sd_err_set(err, SD_EUNSUPPORTED, "no usable CUDA device: %s (%s)", cudaGetErrorString(e),
                   cudaGetErrorName(e));
        cudaGetLastError(); /* not sticky; leave the runtime clean */
        return 0;
    }
    if (n == 0) sd_err_set(err, SD_EUNSUPPORTED, "no CUDA device found");
    return n;
}

/* An eighth of the free device memory, between 1 and 8 GiB: on an H100 a
 * 1 GiB cap kept cuDNN off its fast algorithms for batches of 512x512 VAE
 * activations (batch 8 with TF32: 28 images/s at 1 GiB, 71 at 8 GiB).
 * Under a memory limit no more than an eighth of the limit. */
static size_t default_conv_workspace(size_t mem_limit)
{
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) {
        cudaGetLastError();
        free_b = 0;
    }
    return sd_dev_conv_workspace(free_b, mem_limit); /* dev_ws.h: the memory plan's arithmetic too */
}

#ifndef SDTK_CUDA_ARCHS
#define SDTK_CUDA_ARCHS "?"
#endif

/* The current device (device) can run this build: compute capability 8.0
 * or newer (the kernels are built for Ampere, Ada and Hopper; a Volta or
 * Turing GPU would fail only at its first kernel, with "no kernel image"),
 * and a kernel image for it in the build (a build for fewer architectures
 * than the default may lack one). */
static sd_status check_arch(int device, sd_error *err)
{
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (major < 8)
        return sd_err_set(err, SD_EUNSUPPORTED,
                          "CUDA device %d has compute capability %d.%d: sdtk's CUDA backend needs 8.0 or newer "
                          "(Ampere, Ada, Hopper and later; this build's kernels: architectures %s)",
                          device, major, minor, SDTK_CUDA_ARCHS);
    cudaError_t e = sdk_kernel_image();
    if (e != cudaSuccess)
        return sd_err_set(err, SD_EUNSUPPORTED,
                          "CUDA device %d (compute capability %d.%d): this build has no kernel image for it "
                          "(architectures %s; rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%d): %s",
                          device, major, minor, SDTK_CUDA_ARCHS, major, minor, cudaGetErrorString(e));
    return SD_OK;
}

/* Device, stream and library handles; strict fp32 unless opts say TF32. */
sd_status sd_cuda_create(sd_cuda **out, int device, const sd_cuda_opts *opts, sd_error *err)
{
    *out = NULL;
    int n = sd_cuda_device_count(err);
    if (n == 0) return SD_EUNSUPPORTED;
    if (device < 0 || device >= n)
        return sd_err_set(err, SD_EINVAL, "CUDA device %d does not exist (%d device%s)", device, n, n == 1 ? "" : "s");
    sd_cuda *c = calloc(1, sizeof *c);
    if (!c) return sd_err_set(err, SD_ENOMEM, "out of memory");
    c->device = device;
    if (opts) c->opts = *opts;
    const char *stage = "cudaSetDevice";
    cudaError_t ce = cudaSetDevice(device);
    int optin = 0;
    if (ce == cudaSuccess) {
        stage = "cudaDeviceGetAttribute";
        ce = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    }
    if (ce == cudaSuccess) {
        stage = "cudaStreamCreate";
        ce = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    }
    if (ce != cudaSuccess) {
        sd_err_set(err, SD_EIO, "CUDA device %d: %s: %s", device, stage, cudaGetErrorString(ce));
        sdc_ctx_free(c);
        return SD_EIO;
    }
    c->smem_optin = (size_t)optin;
    sd_status st = check_arch(device, err);
    if (!st && c->opts.mixed && c->opts.mixed != SD_DT_BF16 && c->opts.mixed != SD_DT_F16)
        st = sd_err_set(err, SD_EUNSUPPORTED, "CUDA device %d: mixed precision %s: unknown type", device,
                        sd_dtype_name(c->opts.mixed));
    if (st) {
        sdc_ctx_free(c);
        return st;
    }
    if (!c->opts.conv_workspace) c->opts.conv_workspace = default_conv_workspace(c->opts.mem_limit);
    cublasStatus_t be = cublasCreate(&c->blas);
    if (be == CUBLAS_STATUS_SUCCESS) be = cublasSetStream(c->blas, c->stream);
    if (be == CUBLAS_STATUS_SUCCESS)
        be = cublasSetMathMode(c->blas, c->opts.allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (be != CUBLAS_STATUS_SUCCESS) {
        sd_err_set(err, SD_EIO, "cuBLAS on device %d: %s", device, cublasGetStatusString(be));
        sdc_ctx_free(c);
        return SD_EIO;
    }
    cudnnStatus_t de = cudnnCreate(&c->dnn);
    if (de == CUDNN_STATUS_SUCCESS) de = cudnnSetStream(c->dnn, c->stream);
    if (de != CUDNN_STATUS_SUCCESS) {
        sd_err_set(err, SD_EIO, "cuDNN on device %d: %s", device, cudnnGetErrorString(de));
        sdc_ctx_free(c);
        return SD_EIO;
    }
    *out = c;
    return SD_OK;
}

/* Everything the context itself owns (allocations, library handles, the
 * stream), after the queued work has finished; sd_cuda_destroy
 * (cuda_backend.c) frees what the ops cached first. */
void sdc_ctx_free(sd_cuda *c)
{
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    for (size_t i = 0; i < c->nblk; i++) cudaFree(c->blk[i].p);
    free(c->blk);
    if (c->dnn) cudnnDestroy(c->dnn);
    if (c->blas) cublasDestroy(c->blas);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

/* Name, compute capability, memory and library versions, for reports. */
void sd_cuda_get_info(sd_cuda *c, sd_cuda_info *info)
{
    memset(info, 0, sizeof *info);
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, c->device) == cudaSuccess) {
        snprintf(info->name, sizeof info->name, "%s", p.name);
        info->cc_major = p.major;
        info->cc_minor = p.minor;
        info->sm_count = p.multiProcessorCount;
    }
    cudaMemGetInfo(&info->free_bytes, &info->total_bytes);
    cudaDriverGetVersion(&info->driver_version);
    cudaRuntimeGetVersion(&info->runtime_version);
    info->cudnn_version = (int)cudnnGetVersion();
    cublasGetVersion(c->blas, &info->cublas_version);
}

/* The allocator's counters. */
void sd_cuda_get_mem(const sd_cuda *c, sd_cuda_mem *m)
{
    m->in_use = c->in_use;
    m->cached = c->cached;
    m->peak = c->peak;
    m->attn_fallback = c->attn_no_blocks;
}

/* Frees every unused cached block (cudaFree waits for the device). */
void sd_cuda_trim(sd_cuda *c)
{
    size_t keep = 0;
    for (size_t i = 0; i < c->nblk; i++) {
        if (c->blk[i].used) {
            c->blk[keep++] = c->blk[i];
            continue;
        }
        cudaFree(c->blk[i].p);
        c->cached -= c->blk[i].size;
    }
    c->nblk = keep;
}

/* fp32 compute: on TF32 tensor cores when allowed, and always for 16-bit
 * inputs (tensor cores, fp32 accumulation). */
cublasComputeType_t sdc_blas_compute(const sd_cuda *c)
{
    return c->opts.allow_tf32 && !c->opts.mixed ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/* The matrix products' input type. */
cudaDataType_t sdc_ab_type(const sd_cuda *c)
{
    return c->opts.mixed == SD_DT_BF16 ? CUDA_R_16BF : c->opts.mixed == SD_DT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Bytes of one such input element. */
size_t sdc_ab_size(const sd_cuda *c)
{
    return c->opts.mixed ? 2 : 4;
}

/* The stream every launcher queues on. */
cudaStream_t sdc_stream(const sd_cuda *c)
{
    return c->stream;
}

/* Shared memory a block may opt in to (attention's tiles for wide heads). */
size_t sdc_smem_optin(const sd_cuda *c)
{
    return c->smem_optin;
}

/* Sizes are rounded so freed blocks fit later requests of similar size:
 * 512 bytes below 1 MiB, 2 MiB above. */
static size_t round_size(size_t bytes)
{
    if (bytes == 0) bytes = 1;
    size_t r = bytes < SMALL_LIMIT ? SMALL_ROUND : LARGE_ROUND;
    return (bytes + r - 1) / r * r;
}

/* Smallest free cached block that fits without wasting more than half. */
static sdc_block *find_free(sd_cuda *c, size_t size)
{
    sdc_block *best = NULL;
    for (size_t i = 0; i < c->nblk; i++) {
        sdc_block *b = &c->blk[i];
        if (b->used || b->size < size || b->size > 2 * size) continue;
        if (!best || b->size < best->size) best = b;
    }
    return best;
}

/* Room in the block list for one more block; -1 when the host is out of
 * memory. */
static int reserve_block(sd_cuda *c)
{
    if (c->nblk < c->capblk) return 0;
    size_t cap = c->capblk ? 2 * c->capblk : 64;
    sdc_block *nb = realloc(c->blk, cap * sizeof *nb);
    if (!nb) return -1;
    c->blk = nb;
    c->capblk = cap;
    return 0;
}

/* Device memory from the cache, else from cudaMalloc; when the device is
 * full (or the context's mem_limit reached), the unused cache goes back to
 * the driver and the call is retried.
 * NULL when even that fails, with nothing recorded: for callers that have
 * another way (attention falls back to its flash kernel); *why says why
 * (cudaErrorMemoryAllocation also when the host is out of memory). */
void *sdc_try_alloc(sd_cuda *c, size_t bytes, cudaError_t *why)
{
    size_t size = round_size(bytes);
    *why = cudaSuccess;
    sdc_block *b = find_free(c, size);
    if (b) {
        b->used = 1;
        c->cached -= b->size;
        c->in_use += b->size;
        if (c->in_use > c->peak) c->peak = c->in_use;
        return b->p;
    }
    if (reserve_block(c)) {
        *why = cudaErrorMemoryAllocation;
        return NULL;
    }
    size_t limit = c->opts.mem_limit;
    if (limit && c->in_use + c->cached + size > limit) sd_cuda_trim(c);
    if (limit && c->in_use + size > limit) {
        *why = cudaErrorMemoryAllocation; /* over the context's limit: as if the device were full */
        return NULL;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        sd_cuda_trim(c);
        e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        *why = e;
        return NULL;
    }
    c->blk[c->nblk++] = (sdc_block){.p = p, .size = size, .used = 1};
    c->in_use += size;
    if (c->in_use > c->peak) c->peak = c->in_use;
    return p;
}

/* sdc_try_alloc for callers with no other way: NULL with the error
 * recorded in the context. */
void *sdc_alloc(sd_cuda *c, size_t bytes)
{
    if (reserve_block(c)) {
        sdc_fail(c, SD_ENOMEM, "out of host memory for the device block list");
        return NULL;
    }
    cudaError_t e;
    void *p = sdc_try_alloc(c, bytes, &e);
    if (!p) {
        char lim[48] = "";
        if (c->opts.mem_limit) snprintf(lim, sizeof lim, ", its limit %zu", c->opts.mem_limit);
        sdc_fail(c, e == cudaErrorMemoryAllocation ? SD_ENOMEM : SD_EIO,
                 "CUDA allocation of %zu bytes failed: %s (%zu bytes in use by sdtk%s)", round_size(bytes),
                 cudaGetErrorString(e), c->in_use, lim);
    }
    return p;
}

/* Back into the cache; the stream orders its next user after this one. */
void sdc_release(sd_cuda *c, void *p)
{
    if (!p) return;
    for (size_t i = c->nblk; i-- > 0;) {
        if (c->blk[i].p != p) continue;
        if (!c->blk[i].used) break;
        c->blk[i].used = 0;
        c->in_use -= c->blk[i].size;
        c->cached += c->blk[i].size;
        return;
    }
    sdc_fail(c, SD_EINVAL, "CUDA release of %p: not a block in use from this context", p);
}

/* Table entry: allocation as the model sees it. */
void *sdc_mem_alloc(void *exec, size_t bytes)
{
    return sdc_alloc(exec, bytes);
}

/* Table entry: release. */
void sdc_mem_release(void *exec, void *p)
{
    sdc_release(exec, p);
}

/* Host to device; waits so the caller may reuse src at once (pinned and
 * pageable sources alike). Overlapping copies with compute needs pinned
 * staging buffers and events: not done yet. */
void sdc_mem_h2d(void *exec, void *dst, const void *src, size_t bytes)
{
    sd_cuda *c = exec;
    if (c->failed || !bytes) return;
    if (sdc_cuda_ok(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "copy to device"))
        sdc_cuda_ok(c, cudaStreamSynchronize(c->stream), "copy to device");
}

/* Device to host, after everything queued before it; dst is filled on
 * return. */
void sdc_mem_d2h(void *exec, void *dst, const void *src, size_t bytes)
{
    sd_cuda *c = exec;
    if (c->failed || !bytes) return;
    if (sdc_cuda_ok(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "copy to host"))
        sdc_cuda_ok(c, cudaStreamSynchronize(c->stream), "copy to host");
}

/* Device to device, queued like an op. */
void sdc_mem_d2d(void *exec, void *dst, const void *src, size_t bytes)
{
    sd_cuda *c = exec;
    if (c->failed || !bytes) return;
    sdc_cuda_ok(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream), "device copy");
}

/* Zero bytes, queued like an op. */
void sdc_mem_zero(void *exec, void *p, size_t bytes)
{
    sd_cuda *c = exec;
    if (c->failed || !bytes) return;
    sdc_cuda_ok(c, cudaMemsetAsync(p, 0, bytes, c->stream), "memset");
}

/* Waits for the stream, then reports and clears the first failure since
 * the last sync (a sticky device error stays: the context is unusable). */
sd_status sdc_sync(void *exec, sd_error *err)
{
    sd_cuda *c = exec;
    sdc_cuda_ok(c, cudaStreamSynchronize(c->stream), "stream synchronize");
    if (!c->failed) return SD_OK;
    sd_status st = c->err.code;
    if (err) *err = c->err;
    c->failed = 0;
    memset(&c->err, 0, sizeof c->err);
    return st;
}

/* The stream every op of the context runs on. */
void *sd_cuda_stream(sd_cuda *c)
{
    return (void *)c->stream;
}
