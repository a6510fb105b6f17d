/* sd-selftest's UNet check (selftest_unet.c) and the numerics modes both
 * halves of sd-selftest judge by. */
#ifndef SDTK_SELFTEST_UNET_H
#define SDTK_SELFTEST_UNET_H

/* The numerics of a run, each with its own tolerances: strict fp32, TF32
 * tensor cores, mixed precision with bf16 or fp16 products. */
enum { SELFTEST_STRICT, SELFTEST_TF32, SELFTEST_BF16, SELFTEST_FP16, SELFTEST_NMODES };

/* The mode of a device run from its sd_cuda_opts (allow_tf32, mixed). */
int selftest_mode(int tf32, int mixed);
/* "strict", "tf32", "bf16", "fp16". */
const char *selftest_mode_name(int mode);

/* One training micro-batch of the tiny golden UNet `name` (sd1, sdxl) under
 * dir, through the trainer on cuda:device (without and with gradient
 * checkpointing) and on the CPU with the same inputs: the loss and every
 * parameter tensor's gradient compared, each tensor normwise against the
 * mode's tolerance; then three AdamW steps on the device with the EMA on
 * the device and in host memory (--ema-on-cpu), the two EMAs compared, and
 * bf16 against fp32 moments. 1 passed, 0 failed, -1 error. tf32 and mixed:
 * the device's numerics (sd_cuda_opts). mutate (the CPU against itself):
 * also zero each tensor's gradient in turn and judge it with every mode's
 * tolerances, failing when a tensor above the floor is not caught. */
int selftest_unet(const char *dir, const char *name, int device, int tf32, int mixed, int mutate);

#endif
