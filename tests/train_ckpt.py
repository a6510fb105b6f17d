"""Reading sd-train's output directories in the end-to-end tests
(e2e_train.py, e2e_train_mpi.py): a checkpoint's bytes and the step that
`latest` names."""
import os


def ckpt_bytes(out, step, ema=True):
    """The bytes of checkpoint-<step>'s weights, EMA weights (unless ema is False) and state."""
    d = os.path.join(out, "checkpoint-%d" % step)
    got = []
    for name in ("unet/diffusion_pytorch_model.safetensors", "unet_ema/diffusion_pytorch_model.safetensors",
                 "state.safetensors"):
        if not ema and name.startswith("unet_ema/"):
            continue
        with open(os.path.join(d, name), "rb") as f:
            got.append(f.read())
    return got


def latest(out):
    """The step out/latest names, or -1."""
    try:
        with open(os.path.join(out, "latest")) as f:
            return int(f.read().strip().split("-")[1])
    except (OSError, ValueError, IndexError):
        return -1
