/* Whether the device can run this build's kernels, for sd_cuda_create's
 * check (cuda_ctx.c): a kernel of its own, compiled for the same
 * architectures as every other, so the context depends on no launcher. */
#include "cuda_kernels.h"

/* Never launched: its attributes exist only when the runtime finds an
 * image of it for the current device. */
__global__ static void probe_kernel(int *p)
{
    if (p) *p = 0;
}

/* cudaSuccess when the runtime finds an image for the current device
 * (machine code of its architecture, or PTX it can compile). */
extern "C" cudaError_t sdk_kernel_image(void)
{
    cudaFuncAttributes a;
    cudaError_t e = cudaFuncGetAttributes(&a, (const void *)probe_kernel);
    if (e != cudaSuccess) cudaGetLastError(); /* not sticky; leave the runtime clean */
    return e;
}
