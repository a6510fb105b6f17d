/* sd-selftest: runs every engine op on a device backend and on the CPU
 * reference with the same random inputs and compares outputs and
 * gradients, runs the tiny golden VAE on the device against diffusers'
 * values, and probes throughput. The one command a user with a GPU runs to
 * check the CUDA path, which the project itself could not run. The checks,
 * the probe and --plan live in tools/selftest/; this file is the command
 * line.
 *
 * Exit codes: 0 every check passed, 1 a check failed, 2 usage, 3 fatal
 * error, 4 no usable GPU or no CUDA backend in this build (ctest reports
 * that as skipped). --plan prints the VAE's memory plan (no GPU needed). */
#include <stdio.h>

#include "backend.h"
#include "cli.h"
#include "dtype.h"
#include "err.h"
#include "pool.h"
#include "selftest.h"
#ifdef SDTK_HAVE_CUDA
#include "sd_cuda.h"
#endif

#ifndef SDTK_GOLDEN_VAE
#define SDTK_GOLDEN_VAE "tests/golden/vae/sd"
#endif
#ifndef SDTK_GOLDEN_UNET
#define SDTK_GOLDEN_UNET "tests/golden/unet"
#endif

enum { EXIT_NO_GPU = 4 };

/* Options, the device context, then each check in turn (the op cases, attention in blocks and on
 * the flash kernel, AdamW with bf16 moments, the golden VAE, the tiny UNets) and the probe; the
 * exit code says whether one failed or an error stopped the run. */
int main(int argc, char **argv)
{
    const char *device = "cuda:0", *golden = SDTK_GOLDEN_VAE, *golden_unet = SDTK_GOLDEN_UNET;
    const char *mixed_name = "no";
    int no_probe = 0, tf32 = 0, do_plan = 0, mixed = 0, mutate = 0;
    long threads = 0;
    const sd_opt opts[] = {
        {"device", 'd', SD_OPT_STR, &device, "DEV", "cuda:K (default cuda:0), or cpu to check the harness itself"},
        {"golden", 0, SD_OPT_STR, &golden, "DIR",
         "tiny golden VAE folder (vae/ + expected.safetensors; default: the source tree's tests/golden/vae/sd)"},
        {"golden-unet", 0, SD_OPT_STR, &golden_unet, "DIR",
         "tiny golden UNets (sd1/, sdxl/; default: the source tree's tests/golden/unet)"},
        {"no-probe", 0, SD_OPT_FLAG, &no_probe, NULL, "skip the throughput probe"},
        {"tf32", 0, SD_OPT_FLAG, &tf32, NULL,
         "allow TF32 tensor cores (checked with TF32's tolerances, per op class, docs/GPU.md)"},
        {"mixed-precision", 0, SD_OPT_STR, &mixed_name, "T",
         "no (default), bf16 or fp16: matrix products on 16-bit copies of their inputs (checked with that mode's "
         "tolerances)"},
        {"mutate", 0, SD_OPT_FLAG, &mutate, NULL,
         "with --device cpu, a check of the check: every op case again with each output zeroed and each gradient "
         "dropped, and each tiny UNet with each tensor's gradient zeroed, judged with every mode's tolerances; "
         "fails when one of them would pass"},
        {"threads", 'j', SD_OPT_INT, &threads, "N", "CPU threads for the reference (default: all CPUs)"},
        {"plan", 0, SD_OPT_FLAG, &do_plan, NULL,
         "print the VAE encoder's memory per op at 512x512 and 1024x1024 and batch sizes for 24/80 GB cards, "
         "from the engine's own allocation plan (no GPU needed), and exit"},
        {NULL, 0, 0, NULL, NULL, NULL}};
    sd_cli cli = {"sd-selftest", "[OPTIONS]",
                  "Run every engine op (forward and backward) on a device and on the CPU reference with the same "
                  "random inputs and print, per op, the worst normwise error of its output and gradient tensors "
                  "(max |dev - cpu| / max |cpu| of each tensor) against the tolerance of its op class in this "
                  "numerics mode, with pass/fail; encode the tiny golden VAE on the device against diffusers' "
                  "values; one training micro-batch of the tiny golden SD and SDXL UNets through the trainer on the "
                  "device against the CPU (the loss and each parameter tensor's gradient); 8-bit AdamW, Adafactor and the "
                  "bf16 weights' widening and rounded store against the CPU, and those optimizers, bf16 weights and "
                  "the fused backward through the trainer on the tiny UNets (device against CPU from the same "
                  "gradients); then a short throughput "
                  "probe (a 512x512 convolution, a 4096^3 GEMM, the VAE's attention, VAE encodes). Exit 0 when "
                  "everything passed, 1 when a check failed, 4 when there is no usable GPU or this build has no "
                  "CUDA backend.",
                  opts,
                  "Examples:\n"
                  "  sd-selftest --device cuda:0\n"
                  "  for k in 0 1 2 3; do sd-selftest --device cuda:$k --no-probe; done\n"
                  "  sd-selftest --plan\n"
                  "  sd-selftest --device cpu --no-probe --mutate\n"
                  "  sd-selftest --device cuda:0 --no-probe | grep -E 'adamw8|adafactor|bf16|fused'\n",
        "0 every check passed, 1 a check failed, 2 usage error, 3 fatal error, 4 no usable GPU."};
    sd_strlist pos = {0};
    int rc = sd_cli_parse(&cli, argc, argv, &pos);
    if (rc >= 0) return rc;
    int npos = pos.n;
    sd_strlist_free(&pos);
    int dev = 0;
    if (npos) {
        sd_cli_usage_error(&cli, "no positional arguments expected");
        return SD_EXIT_USAGE;
    }
    if (sd_cli_parse_device(device, &dev)) {
        sd_cli_usage_error(&cli, "--device %s: expected cuda:K or cpu", device);
        return SD_EXIT_USAGE;
    }
    if (sd_cli_parse_mixed(mixed_name, &mixed)) {
        sd_cli_usage_error(&cli, "--mixed-precision %s: expected no, bf16 or fp16", mixed_name);
        return SD_EXIT_USAGE;
    }
    if ((mixed || tf32) && dev < 0) {
        sd_cli_usage_error(&cli, "--tf32 and --mixed-precision are GPU modes: not with --device cpu");
        return SD_EXIT_USAGE;
    }
    if (mutate && dev >= 0) {
        sd_cli_usage_error(&cli, "--mutate checks the harness: only with --device cpu");
        return SD_EXIT_USAGE;
    }
    if (threads < 0 || threads > 1024) {
        sd_cli_usage_error(&cli, "--threads must be 0..1024");
        return SD_EXIT_USAGE;
    }
    if (do_plan) return selftest_plan((size_t)1 << 30);
    sd_pool *pool = sd_pool_create(threads > 0 ? (int)threads : sd_default_threads());
    target ref = {sd_backend_cpu(), pool}, t = {sd_backend_cpu(), NULL};
    int mode = selftest_mode(tf32, mixed);
#ifdef SDTK_HAVE_CUDA
    sd_cuda *cu = NULL;
    if (dev >= 0) {
        sd_error err = {0};
        int n = sd_cuda_device_count(&err);
        if (n == 0) {
            printf("sd-selftest: %s; GPU checks skipped\n", err.msg);
            sd_pool_destroy(pool);
            return EXIT_NO_GPU;
        }
        sd_cuda_opts co = {.allow_tf32 = tf32, .mixed = mixed};
        if (sd_cuda_create(&cu, dev, &co, &err)) {
            fprintf(stderr, "sd-selftest: %s\n", err.msg);
            sd_pool_destroy(pool);
            return dev >= n ? SD_EXIT_USAGE : SD_EXIT_FATAL;
        }
        sd_cuda_info info;
        sd_cuda_get_info(cu, &info);
        printf("device cuda:%d: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f free); driver %d, runtime %d, "
               "cuDNN %d, cuBLAS %d; %s\n",
               dev, info.name, info.cc_major, info.cc_minor, info.sm_count, (double)info.total_bytes / (1 << 30),
               (double)info.free_bytes / (1 << 30), info.driver_version, info.runtime_version, info.cudnn_version,
               info.cublas_version,
               mixed == SD_DT_BF16 ? "mixed bf16" : mixed == SD_DT_F16 ? "mixed fp16" : tf32 ? "TF32" : "strict fp32");
        t = (target){sd_backend_cuda(), cu};
    }
#else
    if (dev >= 0) {
        printf("sd-selftest: this build has no CUDA backend (configure where nvcc, cuBLAS and cuDNN are installed); "
               "GPU checks skipped\n");
        sd_pool_destroy(pool);
        return EXIT_NO_GPU;
    }
#endif
    if (dev < 0) printf("device cpu: the CPU backend on one thread against the pool (a check of the harness)\n");
    int fails = selftest_check_ops(&t, &ref, mode, NULL, "", mutate);
    target flash = {0};
#ifdef SDTK_HAVE_CUDA
    /* attention goes through cuBLAS in blocks of scores: checked again with
     * blocks of 12600 scores (heads in groups of 4 and 2 for "cross"; the
     * others split into query rows, with the causal mask and with tq !=
     * tk), and on the flash kernel, the fallback when blocks do not fit */
    sd_cuda *cu_small = NULL, *cu_flash = NULL;
    if (cu && fails >= 0) {
        sd_error err = {0};
        sd_cuda_opts so = {.allow_tf32 = tf32, .mixed = mixed, .attn_block = 12600},
                     fo = {.allow_tf32 = tf32, .mixed = mixed, .attn_flash = 1};
        if (sd_cuda_create(&cu_small, dev, &so, &err) || sd_cuda_create(&cu_flash, dev, &fo, &err)) {
            fprintf(stderr, "sd-selftest: %s\n", err.msg);
            fails = -1;
        } else {
            target small = {sd_backend_cuda(), cu_small};
            flash = (target){sd_backend_cuda(), cu_flash};
            int f = selftest_check_ops(&small, &ref, mode, "attention", " [blocks]", 0);
            /* the flash kernel is fp32 FMA in every mode: strict tolerances */
            int g = f < 0 ? -1 : selftest_check_ops(&flash, &ref, SELFTEST_STRICT, "attention", " [flash]", 0);
            fails = f < 0 || g < 0 ? -1 : fails + f + g;
        }
    }
    if (cu && fails >= 0) {
        int f = selftest_check_capped(dev, tf32, mixed, &ref);
        fails = f < 0 ? -1 : fails + f;
    }
#endif
    if (fails >= 0) {
        int f = selftest_check_adamw_bf16(&t, &ref, mode);
        fails = f < 0 ? -1 : fails + f;
    }
    /* --optimizer adamw8bit and adafactor, --weight-dtype bf16: their kernels against the CPU */
    int (*const more[])(const target *, const target *, int) = {selftest_check_adamw8, selftest_check_adafactor,
                                                                 selftest_check_bf16w};
    for (size_t i = 0; i < sizeof more / sizeof more[0] && fails >= 0; i++) {
        int f = more[i](&t, &ref, mutate);
        fails = f < 0 ? -1 : fails + f;
    }
    int vae = fails < 0 ? -1 : selftest_check_vae(&t, golden, mode);
    if (vae >= 0) {
        int dec = selftest_check_vae_decode(&t, golden, mode);
        vae = dec < 0 ? -1 : vae && dec;
    }
    int unet = 1;
    const char *unets[] = {"sd1", "sdxl"};
    for (int i = 0; i < 2 && vae >= 0 && unet >= 0; i++) {
        int r = selftest_unet(golden_unet, unets[i], dev, tf32, mixed, mutate);
        unet = r < 0 ? -1 : unet && r;
    }
    /* the other optimizers, bf16 weights and the fused backward through the trainer (the harness, CPU
     * against CPU, on the SD model only: the update paths are the same for both) */
    for (int i = 0; i < (dev < 0 ? 1 : 2) && vae >= 0 && unet >= 0; i++) {
        int r = selftest_train_optim(golden_unet, unets[i], dev, tf32, mixed, mutate);
        unet = r < 0 ? -1 : unet && r;
    }
    int probe_rc = 0;
    if (fails >= 0 && vae >= 0 && unet >= 0 && !no_probe && dev >= 0)
        probe_rc = selftest_probe(&t, flash.be ? &flash : NULL);
#ifdef SDTK_HAVE_CUDA
    if (cu) {
        sd_cuda_mem m;
        sd_cuda_get_mem(cu, &m);
        printf("device memory: peak %.1f MiB handed out by the caching allocator, %.1f MiB cached at the end\n",
               selftest_mib(m.peak), selftest_mib(m.cached + m.in_use));
        sd_cuda_destroy(cu);
    }
    if (cu_small) sd_cuda_destroy(cu_small);
    if (cu_flash) sd_cuda_destroy(cu_flash);
#endif
    sd_pool_destroy(pool);
    if (fails < 0 || vae < 0 || unet < 0 || probe_rc) {
        printf("sd-selftest: stopped by an error (above)\n");
        return SD_EXIT_FATAL;
    }
    printf("sd-selftest: %d op case%s failed, golden VAE %s, tiny UNets %s\n", fails, fails == 1 ? "" : "s",
           vae ? "passed" : "FAILED", unet ? "passed" : "FAILED");
    return fails || !vae || !unet ? 1 : SD_EXIT_OK;
}
