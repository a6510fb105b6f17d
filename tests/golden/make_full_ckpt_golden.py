#!/usr/bin/env python3
"""Check sdtk's full single-file checkpoints (sd-train --save-full,
libcore/models/full_ckpt.c) against diffusers, run by hand, not in CI:
    python3 tests/golden/make_full_ckpt_golden.py build/tests/full_ckpt_tool DIFFUSERS_SRC
(needs torch, diffusers, transformers from PyPI, safetensors; DIFFUSERS_SRC
is a diffusers source tree: the two convert_diffusers_to_original_* scripts
in its scripts folder are diffusers' own diffusers-to-original converters,
which the pip package does not ship).

For tiny SD 1.x, SD 2.x and SDXL folders (tests/e2e_sample.py's make_model:
the golden UNets and VAE, numpy-made CLIP encoders, the real tokenizer) it
  1. writes the full file with sdtk's writer (full_ckpt_tool write, fp32),
  2. loads it with diffusers' StableDiffusionPipeline /
     StableDiffusionXLPipeline.from_single_file with the folder as the LOCAL
     config (no hub), and checks that every tensor of the UNet, the VAE and
     each text encoder equals the one loaded from the folder with
     from_pretrained (the state dicts' keys the same, max abs difference 0),
  3. converts the folder's VAE and text encoders with diffusers' own
     scripts (convert_diffusers_to_original_stable_diffusion.py for SD 1.x
     and 2.x, convert_diffusers_to_original_sdxl.py for SDXL) and checks
     that the file holds exactly those names and shapes (besides the
     CLIP-L position_ids sdtk adds, as the original releases hold them);
     the UNet's names are checked by feeding them to diffusers' single-file
     converter (convert_ldm_unet_checkpoint), which must give back every
     diffusers name and shape exactly (the scripts' UNet maps hard-code
     SD 1.5's block layout, which the tiny UNets do not have),
and writes tests/golden/full_ckpt/<family>.txt (those names and shapes,
one "name shape" line each; tests/e2e_save_full.py compares the C
writer's files with them) and tests/golden/full_ckpt/check.txt (this
script's output)."""
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import redirect_stdout

import torch
from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline
from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import e2e_save_full  # noqa: E402
import e2e_sample  # noqa: E402

PIPE = {"sd1": StableDiffusionPipeline, "sd2": StableDiffusionPipeline, "sdxl": StableDiffusionXLPipeline}


def script(src, name):
    """One of diffusers' conversion scripts as a module (its main is guarded)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(src, "scripts", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    with redirect_stdout(io.StringIO()):
        spec.loader.exec_module(mod)
    return mod


def model_index(d, fam):
    """model_index.json, so the folder is a pipeline config for from_single_file."""
    idx = {"_class_name": PIPE[fam].__name__, "_diffusers_version": "0.42.1",
           "scheduler": ["diffusers", "PNDMScheduler"], "text_encoder": ["transformers", "CLIPTextModel"],
           "tokenizer": ["transformers", "CLIPTokenizer"], "unet": ["diffusers", "UNet2DConditionModel"],
           "vae": ["diffusers", "AutoencoderKL"]}
    if fam == "sdxl":
        idx.update(text_encoder_2=["transformers", "CLIPTextModelWithProjection"],
                   tokenizer_2=["transformers", "CLIPTokenizer"], scheduler=["diffusers", "EulerDiscreteScheduler"])
    else:
        idx.update(safety_checker=[None, None], feature_extractor=[None, None], requires_safety_checker=False)
    with open(os.path.join(d, "model_index.json"), "w") as f:
        json.dump(idx, f)


def same_state(name, a, b):
    """Two modules' state dicts: the same keys, every tensor equal."""
    sa, sb = a.state_dict(), b.state_dict()
    if set(sa) != set(sb):
        raise SystemExit("%s: keys differ: %s" % (name, sorted(set(sa) ^ set(sb))[:8]))
    worst = max(float((sa[k].double() - sb[k].double()).abs().max()) if sa[k].numel() else 0.0 for k in sa)
    print("  %-15s %4d tensors, max abs difference %g" % (name, len(sa), worst))
    if worst != 0:
        for k in sa:
            if sa[k].numel() and float((sa[k].double() - sb[k].double()).abs().max()):
                print("    differs:", k)
        raise SystemExit("%s: not equal" % name)


def expected_names(src, d, fam, unet_names):
    """diffusers' conversion of the folder's VAE and encoders (names and
    shapes) plus the UNet names the single-file converter maps onto every
    diffusers UNet name; the UNet's check happens here."""
    st = lambda sub, f: load_file(os.path.join(d, sub, f))  # noqa: E731
    out = {}
    if fam == "sdxl":
        m = script(src, "convert_diffusers_to_original_sdxl")
        with redirect_stdout(io.StringIO()):
            vae = m.convert_vae_state_dict(st("vae", "diffusion_pytorch_model.safetensors"))
        out.update({"first_stage_model." + k: v for k, v in vae.items()})
        t1 = m.convert_openai_text_enc_state_dict(st("text_encoder", "model.safetensors"))
        out.update({"conditioner.embedders.0.transformer." + k: v for k, v in t1.items()})
        t2 = m.convert_openclip_text_enc_state_dict(st("text_encoder_2", "model.safetensors"))
        t2 = {"conditioner.embedders.1.model." + k: v for k, v in t2.items()}
        t2["conditioner.embedders.1.model.text_projection"] = t2.pop(
            "conditioner.embedders.1.model.text_projection.weight").T.contiguous()
        out.update(t2)
    else:
        m = script(src, "convert_diffusers_to_original_stable_diffusion")
        with redirect_stdout(io.StringIO()):
            vae = m.convert_vae_state_dict(st("vae", "diffusion_pytorch_model.safetensors"))
        out.update({"first_stage_model." + k: v for k, v in vae.items()})
        te = st("text_encoder", "model.safetensors")
        if fam == "sd2":  # the script tells v2 by layer 22; the tiny encoder is OpenCLIP-style by its config
            te = m.convert_text_enc_state_dict_v20({"transformer." + k: v for k, v in te.items()})
            out.update({"cond_stage_model.model." + k: v for k, v in te.items()})
        else:
            out.update({"cond_stage_model.transformer." + k: v for k, v in te.items()})
    lines = {"%s %s" % (k, ",".join(map(str, v.shape))) for k, v in out.items()}
    # the UNet: diffusers' single-file converter must map the file's UNet names onto every diffusers name
    with open(os.path.join(d, "unet", "config.json")) as f:
        cfg = json.load(f)
    ref = load_file(os.path.join(d, "unet", "diffusion_pytorch_model.safetensors"))
    conv = convert_ldm_unet_checkpoint(unet_names, cfg)
    if set(conv) != set(ref) or any(tuple(conv[k].shape) != tuple(ref[k].shape) for k in ref):
        raise SystemExit("%s: diffusers' UNet converter does not map the file's names onto the UNet's" % fam)
    print("  unet names: diffusers' converter maps all %d onto the UNet's %d" % (len(unet_names), len(ref)))
    lines |= {"%s %s" % (k, ",".join(map(str, v.shape))) for k, v in unet_names.items()}
    return lines


def main():
    tool, src = sys.argv[1], sys.argv[2]
    e2e_sample.GOLDEN = HERE
    outdir = os.path.join(HERE, "full_ckpt")
    os.makedirs(outdir, exist_ok=True)
    log = io.StringIO()
    real = sys.stdout
    sys.stdout = log
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for fam, (unet, enc) in e2e_save_full.FAMILIES.items():
                d = os.path.join(tmp, fam)
                e2e_sample.make_model(d, unet, "sd", enc)
                model_index(d, fam)
                f = os.path.join(tmp, fam + ".safetensors")
                subprocess.run([tool, "write", f, d, d, "fp32"], check=True, capture_output=True)
                print("%s: %s written by sdtk (full_ckpt_tool write), %d tensors" % (fam, os.path.basename(f),
                                                                                   len(load_file(f))))
                pipe = PIPE[fam].from_single_file(f, config=d, local_files_only=True, torch_dtype=torch.float32)
                ref = PIPE[fam].from_pretrained(d, local_files_only=True, torch_dtype=torch.float32)
                parts = ["unet", "vae", "text_encoder"] + (["text_encoder_2"] if fam == "sdxl" else [])
                for p in parts:
                    same_state(p, getattr(pipe, p), getattr(ref, p))
                tensors = load_file(f)
                unet_names = {k: v for k, v in tensors.items() if k.startswith("model.diffusion_model.")}
                want = expected_names(src, d, fam, unet_names)
                got = {"%s %s" % (k, ",".join(map(str, v.shape))) for k, v in tensors.items()}
                extra = {x.rsplit(" ", 1)[0] for x in got - want}
                missing = sorted(want - got)
                allowed = {x.split(" ")[0] for x in e2e_save_full.EXTRA[fam]}
                if missing or extra - allowed:
                    raise SystemExit("%s: names differ from diffusers' conversion: missing %s, extra %s" %
                                     (fam, missing[:5], sorted(extra - allowed)[:5]))
                print("  names: the %d of diffusers' conversion, plus %s" % (len(want), sorted(extra) or "nothing"))
                with open(os.path.join(outdir, fam + ".txt"), "w") as g:
                    g.write("".join(x + "\n" for x in sorted(want)))
        import diffusers
        import transformers
        print("diffusers %s, transformers %s, torch %s" % (diffusers.__version__, transformers.__version__,
                                                            torch.__version__))
    finally:
        sys.stdout = real
        print(log.getvalue(), end="")
    with open(os.path.join(outdir, "check.txt"), "w") as g:
        g.write(log.getvalue())


if __name__ == "__main__":
    main()
