/* sd-selftest's UNet check (selftest_unet.c). */
#ifndef SDTK_SELFTEST_UNET_H
#define SDTK_SELFTEST_UNET_H

/* One training micro-batch of the tiny golden UNet `name` (sd1, sdxl) under
 * dir, through the trainer on cuda:device (without and with gradient
 * checkpointing) and on the CPU with the same inputs: prints the loss and
 * the gradient error; then three AdamW steps on the device with the EMA on
 * the device and in host memory (--ema-on-cpu), the two EMAs compared; 1
 * passed, 0 failed, -1 error. tf32 and mixed: the device's numerics
 * (sd_cuda_opts). */
int selftest_unet(const char *dir, const char *name, int device, int tf32, int mixed, double tol);

#endif
