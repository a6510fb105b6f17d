/* sd-latents' device and numerics, shared by the run (latents_run.c) and
 * --text-only (latents_attach.c): the stored dtype's name, the numerics
 * part of a record key, and the CUDA context of --device cuda:K. */
#include <string.h>

#include "latents.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif

/* The stored dtype from its name (see latents.h). */
int latents_dtype(const char *s)
{
    if (!s || !strcmp(s, "fp16")) return SD_DT_F16;
    if (!strcmp(s, "bf16")) return SD_DT_BF16;
    if (!strcmp(s, "fp32")) return SD_DT_F32;
    return 0;
}

/* The device's numerics as a key suffix: "" for the CPU and strict fp32
 * (so keys made before these modes existed still match), else the mode. */
const char *latents_numerics(const latents_opts *o)
{
    if (o->cuda_device < 0) return "";
    if (o->mixed) return o->mixed == SD_DT_BF16 ? "|mixed-bf16" : "|mixed-fp16";
    return o->tf32 ? "|tf32" : "";
}

/* The CUDA context of --device cuda:K with the run's GPU options (TF32,
 * mixed precision, cuDNN search, memory limit) and its backend; an error
 * naming the device when this build has no CUDA. */
sd_status latents_cuda_open(const latents_opts *o, void **cuda, const sd_backend **be, sd_error *err)
{
#ifdef SDTK_HAVE_CUDA
    sd_cuda *c = NULL;
    sd_cuda_opts co = {.allow_tf32 = o->tf32, .mixed = o->mixed, .conv_search = o->cudnn_search,
                       .mem_limit = o->gpu_mem_limit};
    sd_status st = sd_cuda_create(&c, o->cuda_device, &co, err);
    if (st) return st;
    *cuda = c;
    *be = sd_backend_cuda();
    return SD_OK;
#else
    (void)cuda;
    (void)be;
    return sd_err_set(err, SD_EUNSUPPORTED, "--device cuda:%d: this sd-latents was built without CUDA "
                      "(nvcc was not found at build time)", o->cuda_device);
#endif
}

/* Free a context of latents_cuda_open (NULL: nothing to do). */
void latents_cuda_close(void *cuda)
{
#ifdef SDTK_HAVE_CUDA
    if (cuda) sd_cuda_destroy(cuda);
#else
    (void)cuda;
#endif
}
