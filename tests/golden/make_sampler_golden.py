#!/usr/bin/env python3
"""Golden files for the samplers' math (libcore/models/sampler*.c), run by
hand, not in CI:
    python3 tests/golden/make_sampler_golden.py
(needs torch, diffusers, safetensors, numpy from PyPI).

Each case runs one diffusers scheduler the way the SD / SDXL pipelines do
(StableDiffusionPipeline.__call__'s loop: latents = noise *
init_noise_sigma; per timestep t: scale_model_input, the model on the
unconditional and conditional inputs, guidance
u + cfg * (c - u), scheduler.step) for a fixed analytic "model" instead of a
UNet, the same in the C test:
    uncond(x, t) = 0.60 * x + 0.10 * t / 1000
    cond(x, t)   = 0.65 * x + 0.05 * t / 1000
with x the scaled model input and t the timestep the scheduler hands the
UNet. The scheduler comes from the family's scheduler_config.json (the
dicts below, as in the hub's runwayml/stable-diffusion-v1-5,
stabilityai/stable-diffusion-2-1 and stabilityai/stable-diffusion-xl-base-1.0)
through XScheduler.from_config, so keys the file lacks (timestep_spacing for
SD 1.x/2.x) take each scheduler's default, as in diffusers.

Writes tests/golden/sampler/expected.safetensors:
  noise [1, 4, 8, 8]            the initial noise (randn, seed 3)
  step_noise [25, 1, 4, 8, 8]   the ancestral sampler's per-step noise, passed
                                to step() through a generator replaying it
  <case>.latents                the final latents (fp32)
  <case>.timesteps (fp64), <case>.sigmas (fp32, Euler/DPM)  the schedule
Cases are <family>_<sampler>_<steps>; cfg 7.
"""
import os

import numpy as np
import torch
from diffusers import (DDIMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                       EulerDiscreteScheduler)
from safetensors.torch import save_file

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sampler")

BASE = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
            set_alpha_to_one=False, skip_prk_steps=True, steps_offset=1, trained_betas=None, clip_sample=False)
FAMILIES = {
    "sd15": dict(BASE),                                    # PNDMScheduler's file
    "sd21": dict(BASE, prediction_type="v_prediction"),     # DDIMScheduler's file
    "sdxl": dict(BASE, interpolation_type="linear", prediction_type="epsilon", sample_max_value=1.0,
                 timestep_spacing="leading", use_karras_sigmas=False),  # EulerDiscreteScheduler's file
}
SAMPLERS = {
    "ddim": (DDIMScheduler, {}),
    "euler": (EulerDiscreteScheduler, {}),
    "euler_a": (EulerAncestralDiscreteScheduler, {}),
    "dpmpp_2m": (DPMSolverMultistepScheduler, {}),
    "dpmpp_2m_karras": (DPMSolverMultistepScheduler, {"use_karras_sigmas": True}),
}
CFG = 7.0


def model(x, t):
    t = float(t)
    return 0.60 * x + 0.10 * t / 1000, 0.65 * x + 0.05 * t / 1000


def run(family, sampler, steps, noise, step_noise):
    cls, extra = SAMPLERS[sampler]
    sched = cls.from_config(dict(FAMILIES[family], **extra))
    sched.set_timesteps(steps)
    latents = noise * sched.init_noise_sigma
    # euler_a's step draws randn_tensor(shape, generator=...): replay ours
    drawn = iter(step_noise)
    import diffusers.schedulers.scheduling_euler_ancestral_discrete as ea
    saved = ea.randn_tensor
    ea.randn_tensor = lambda shape, **kw: next(drawn).reshape(shape).clone()
    try:
        for t in sched.timesteps:
            x = sched.scale_model_input(latents, t)
            u, c = model(x, t)
            pred = u + CFG * (c - u)
            latents = sched.step(pred, t, latents).prev_sample
    finally:
        ea.randn_tensor = saved
    out = {"latents": latents.float().contiguous(),
           "timesteps": sched.timesteps.double().contiguous()}
    if hasattr(sched, "sigmas") and sampler != "ddim":
        out["sigmas"] = sched.sigmas.float().contiguous()
    return out


def main():
    noise = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    step_noise = torch.randn(25, 1, 4, 8, 8, generator=torch.Generator().manual_seed(4))
    tensors = {"noise": noise.contiguous(), "step_noise": step_noise.contiguous()}
    for family in FAMILIES:
        for sampler in SAMPLERS:
            for steps in (10, 25):
                case = "%s_%s_%d" % (family, sampler, steps)
                for k, v in run(family, sampler, steps, noise, step_noise).items():
                    tensors[case + "." + k] = v
                lat = tensors[case + ".latents"]
                print("%-28s |latents| max %.3f  timesteps %s" % (
                    case, lat.abs().max(), tensors[case + ".timesteps"][:4].tolist()))
    os.makedirs(HERE, exist_ok=True)
    save_file(tensors, os.path.join(HERE, "expected.safetensors"))


if __name__ == "__main__":
    main()
