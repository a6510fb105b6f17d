/* The CUDA backend: the engine's ops on one NVIDIA GPU, behind the same
 * backend table as the CPU (backend.h). Convolutions run on cuDNN (legacy
 * convolution API, algorithm chosen once per shape), linear layers on
 * cuBLAS with fp32 accumulation, attention on cuBLAS (scores in blocks)
 * or a flash kernel, norms and element-wise ops on hand-written kernels
 * (the .cu files here, scalar formulas shared with the CPU in ops_math.h).
 *
 * One context per device and process is the tools' way (several are
 * independent: sd-selftest makes three); its exec pointer (sd_cuda *) goes
 * where the CPU table takes its sd_pool *. Everything runs in order on the
 * context's stream; device memory comes from the context's caching
 * allocator (be->alloc / be->release), so steady-state steps never call
 * cudaMalloc. Activations, weights and gradients are fp32; strict fp32
 * math by default, TF32 tensor cores or mixed precision (matrix products
 * on bf16/fp16 copies of their inputs, fp32 accumulation) when opts say.
 *
 * Compiled and linked in CI (no GPU there); `sd-selftest --device cuda:K`
 * checks it against the CPU on a user's GPU. What has run on which GPU:
 * docs/GPU.md. */
#ifndef SDTK_SD_CUDA_H
#define SDTK_SD_CUDA_H

#include <stddef.h>

#include "backend.h"
#include "err.h"

typedef struct sd_cuda sd_cuda;

typedef struct {
    int allow_tf32;        /* 1: TF32 tensor cores in cuDNN and cuBLAS (~1e-3 relative error) */
    int mixed;             /* SD_DT_BF16 or SD_DT_F16 (dtype.h): every matrix product (convolutions, linears,
                            * attention's GEMMs) takes its inputs rounded to that type and accumulates in fp32,
                            * as torch.autocast does (convolutions' outputs and gradients are rounded too:
                            * cuDNN writes them in that type); 0: fp32 inputs */
    size_t conv_workspace; /* largest cuDNN workspace one convolution may use, bytes; 0: an eighth of the
                            * free device memory, 1 to 8 GiB, and no more than an eighth of mem_limit */
    int conv_search;       /* 1: time cuDNN's forward algorithms per shape and take the fastest (as torch's
                            * cudnn.benchmark); the choice, and so the last bits, may vary from run to run */
    int attn_flash;        /* 1: attention always on the flash kernel (no score matrix, plain fp32 FMA); 0:
                            * through cuBLAS with scores in blocks of up to 256 MiB (512 MiB for the backward);
                            * the flash kernel from the first time that memory cannot be had (a warning) */
    size_t attn_block;     /* floats in one block of scores; 0: 2^26 (attn_blocks.h; small values are for tests) */
    size_t mem_limit;      /* most device bytes the context's caching allocator holds, in use and cached (the
                            * CUDA context, cuBLAS's and cuDNN's own memory and NCCL's buffers come on top);
                            * 0: what the device has. To see whether a run fits a smaller card, to share a
                            * GPU, and to check the paths taken when memory runs out */
} sd_cuda_opts;

typedef struct {
    char name[256];
    int cc_major, cc_minor, sm_count;
    size_t total_bytes, free_bytes;
    int driver_version, runtime_version, cudnn_version, cublas_version;
} sd_cuda_info;

/* The caching allocator's bytes: handed out, held for reuse, and the peak
 * of handed out since creation; attn_fallback: attention's blocks of
 * scores could not be allocated once, so it runs on the flash kernel. */
typedef struct {
    size_t in_use, cached, peak;
    int attn_fallback;
} sd_cuda_mem;

/* Devices the CUDA runtime sees; 0 with the runtime's reason in err when
 * there is no driver, no device, or the driver is too old. */
int sd_cuda_device_count(sd_error *err);
/* Context on device (0-based): stream, cuBLAS and cuDNN handles. Refuses
 * (SD_EUNSUPPORTED, the message naming the build's architectures) a GPU of
 * compute capability below 8.0 (Volta, Turing: V100, T4, RTX 20xx), for
 * which no kernels are built, and one this build has no kernel image for. */
sd_status sd_cuda_create(sd_cuda **out, int device, const sd_cuda_opts *opts, sd_error *err);
/* Waits for queued work, frees every device block, handle and plan. */
void sd_cuda_destroy(sd_cuda *c);
/* The backend table; its exec argument is an sd_cuda *. */
const sd_backend *sd_backend_cuda(void);

void sd_cuda_get_info(sd_cuda *c, sd_cuda_info *info);
void sd_cuda_get_mem(const sd_cuda *c, sd_cuda_mem *m);
/* The context's stream (a cudaStream_t), for libraries that queue work
 * behind the backend's ops (NCCL). */
void *sd_cuda_stream(sd_cuda *c);
/* Gives cached (unused) blocks back to the driver. */
void sd_cuda_trim(sd_cuda *c);

#endif
