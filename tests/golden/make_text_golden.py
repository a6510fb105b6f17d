#!/usr/bin/env python3
"""Golden files for the CLIP text encoders (libcore/models/clip_text*.c), run by
hand, not in CI:
    python3 tests/golden/make_text_golden.py
(needs torch, transformers, safetensors, numpy from PyPI).

Tiny random text encoders of each kind Stable Diffusion uses, under
tests/golden/clip_text/<name>/:
  sd1   CLIP ViT-L/14-like (quick_gelu), CLIPTextModel:
          text_encoder/ (config.json + model.safetensors, fp32)
          single.safetensors: cond_stage_model.transformer.text_model.* (fp16,
          with the position_ids buffer old checkpoints carry)
  sd2   OpenCLIP ViT-H/14-like (gelu):
          single.safetensors: cond_stage_model.model.* in the OpenCLIP layout
          (3 resblocks, fused attn.in_proj, text_projection [width, proj],
          logit_scale; bf16)
          text_encoder/: what diffusers makes of it, a CLIPTextModel with the
          last layer dropped (2 layers, num_hidden_layers 2, as SD 2's 23 of
          24), fp16 as model.fp16.safetensors
  sdxl  text_encoder/: CLIP ViT-L-like CLIPTextModel (fp32)
        text_encoder_2/: OpenCLIP bigG-like CLIPTextModelWithProjection
          (gelu, projection_dim != width so a missed transpose shows; fp16)
        single.safetensors: conditioner.embedders.0.transformer.text_model.*
          and conditioner.embedders.1.model.* (OpenCLIP layout), fp16
  expected.safetensors per name: the int32 ids [3, 77] and the outputs
  transformers computes in float64 from the same weights.

Weights are rounded to 8 significant bits (values fp16 and bf16 both hold
exactly), so every file of a model holds the same weights.

Ids: vocabulary 500 with BOS 496 and EOS 497; 498 and 499 play tokens added
after EOS (textual inversion), where transformers' two pooling rules differ.
Row 0 is padded with EOS (CLIP-L's tokenizer), rows 1 and 2 with 0 (the
OpenCLIP tokenizers' "!"); row 2 holds 498 and 499 before its EOS. Every
config keeps SD's legacy eos_token_id 2 (pool at argmax of the ids) except
sdxl's text_encoder, which says 497 (pool at the first EOS) so both rules are
tested. About 1.3 MB in all."""
import json
import os
import shutil

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clip_text")
VOCAB, BOS, EOS, T = 500, 496, 497, 77


def make_ids():
    """Three 77-token rows: short + EOS padding, longer + 0 padding, and one
    with 'added' ids above EOS."""
    g = np.random.default_rng(11)
    rows = []
    for n, pad, extra in ((12, EOS, []), (40, 0, []), (20, 0, [VOCAB - 2, VOCAB - 1])):
        body = list(g.integers(1, 490, size=n))
        for i, e in enumerate(extra):
            body[3 + 5 * i] = e
        r = [BOS] + body + [EOS]
        rows.append(r + [pad] * (T - len(r)))
    return np.array(rows, dtype=np.int32)


def round_weights(sd):
    """8 significant bits, nothing below fp16's smallest normal."""
    out = {}
    for k, v in sd.items():
        if not v.is_floating_point():
            continue
        b = v.float().to(torch.bfloat16).float()
        b = torch.where(b.abs() < 2.0 ** -14, torch.zeros_like(b), b)
        assert torch.equal(b.half().float(), b), k
        out[k] = b.contiguous()
    return out


def make_model(seed, cls, **cfg):
    """A model with random weights of a realistic spread (the init's norms
    are 1/0, which would hide a swapped gamma and beta)."""
    torch.manual_seed(seed)
    conf = CLIPTextConfig(vocab_size=VOCAB, max_position_embeddings=T, bos_token_id=BOS, pad_token_id=1,
                          attn_implementation="eager", **cfg)
    model = cls(conf)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.5 if "embedding" in name else 0.1
            p.add_(torch.randn_like(p) * scale)
    state = round_weights(model.state_dict())
    model.load_state_dict(state, strict=False)
    return model.double().eval(), state


def run(model, ids):
    """transformers' outputs in float64 (hidden states of every layer); the
    default dtype is float64 meanwhile, as transformers builds the causal
    mask's fill value in it."""
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            return model(torch.tensor(ids, dtype=torch.long), output_hidden_states=True)
    finally:
        torch.set_default_dtype(torch.float32)


def final_ln(model, h):
    """The model's final layer norm applied to a hidden state."""
    with torch.no_grad():
        return model.text_model.final_layer_norm(h)


def save_folder(d, model, state, fp16=False):
    """config.json + model(.fp16).safetensors as diffusers stores an encoder."""
    os.makedirs(d)
    conf = model.config.to_dict()
    conf["architectures"] = [type(model).__name__]
    conf["torch_dtype"] = "float16" if fp16 else "float32"
    conf.pop("attn_implementation", None)
    conf.pop("_attn_implementation_autoset", None)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(conf, f, indent=2, sort_keys=True)
    tensors = {k: (v.half() if fp16 else v).contiguous() for k, v in state.items()}
    save_file(tensors, os.path.join(d, "model.fp16.safetensors" if fp16 else "model.safetensors"))


def openclip_names(state, prefix, dtype):
    """A transformers CLIP text state dict in OpenCLIP's layout: q/k/v fused
    into attn.in_proj_* (q rows, then k, then v), text_projection stored as
    the [width, proj] matrix x is multiplied by."""
    out = {}
    layers = 1 + max(int(k.split(".")[3]) for k in state if k.startswith("text_model.encoder.layers."))
    tm = "text_model."
    out["token_embedding.weight"] = state[tm + "embeddings.token_embedding.weight"]
    out["positional_embedding"] = state[tm + "embeddings.position_embedding.weight"]
    for i in range(layers):
        s, r = f"{tm}encoder.layers.{i}.", f"transformer.resblocks.{i}."
        for part in ("weight", "bias"):
            out[r + "attn.in_proj_" + part] = torch.cat(
                [state[s + f"self_attn.{p}_proj.{part}"] for p in ("q", "k", "v")], dim=0)
            out[r + "attn.out_proj." + part] = state[s + "self_attn.out_proj." + part]
            out[r + "ln_1." + part] = state[s + "layer_norm1." + part]
            out[r + "ln_2." + part] = state[s + "layer_norm2." + part]
            out[r + "mlp.c_fc." + part] = state[s + "mlp.fc1." + part]
            out[r + "mlp.c_proj." + part] = state[s + "mlp.fc2." + part]
    out["ln_final.weight"] = state[tm + "final_layer_norm.weight"]
    out["ln_final.bias"] = state[tm + "final_layer_norm.bias"]
    if "text_projection.weight" in state:
        out["text_projection"] = state["text_projection.weight"].t()
    out["logit_scale"] = torch.tensor(4.6052)
    return {prefix + k: v.to(dtype).contiguous() for k, v in out.items()}


def hf_names(state, prefix, dtype):
    """A transformers state dict under a single-file prefix."""
    return {prefix + k: v.to(dtype).contiguous() for k, v in state.items()}


def f32(t):
    return t.float().contiguous()


def make_sd1(ids):
    model, state = make_model(1, CLIPTextModel, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=2, hidden_act="quick_gelu", eos_token_id=2)
    out = run(model, ids)
    d = os.path.join(HERE, "sd1")
    save_folder(os.path.join(d, "text_encoder"), model, state)
    single = hf_names(state, "cond_stage_model.transformer.", torch.float16)
    single["cond_stage_model.transformer.text_model.embeddings.position_ids"] = torch.arange(T)[None]
    single["model.diffusion_model.conv_in.weight"] = torch.zeros(4, 4, 3, 3, dtype=torch.float16)
    save_file(single, os.path.join(d, "single.safetensors"))
    return d, {"hidden": f32(out.last_hidden_state),
               "hidden_skip1": f32(final_ln(model, out.hidden_states[-2])),  # kohya clip_skip 2
               "pooled": f32(out.pooler_output)}


def make_sd2(ids):
    model, state = make_model(2, CLIPTextModelWithProjection, hidden_size=48, intermediate_size=96,
                              num_hidden_layers=3, num_attention_heads=3, hidden_act="gelu", projection_dim=40,
                              eos_token_id=2)
    out = run(model, ids)
    hidden = final_ln(model, out.hidden_states[-2])
    # diffusers' SD 2 text_encoder: the OpenCLIP model without its last layer
    # and without text_projection
    small, _ = make_model(2, CLIPTextModel, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=3, hidden_act="gelu", eos_token_id=2)
    sstate = {k: v for k, v in state.items() if k.startswith("text_model.") and ".layers.2." not in k}
    small.load_state_dict({k: v.double() for k, v in sstate.items()}, strict=True)
    sout = run(small, ids)
    assert torch.allclose(sout.last_hidden_state, hidden, atol=1e-12)
    d = os.path.join(HERE, "sd2")
    save_folder(os.path.join(d, "text_encoder"), small, sstate, fp16=True)
    single = openclip_names(state, "cond_stage_model.model.", torch.bfloat16)
    single["model.diffusion_model.conv_in.weight"] = torch.zeros(4, 4, 3, 3, dtype=torch.bfloat16)
    save_file(single, os.path.join(d, "single.safetensors"))
    return d, {"hidden": f32(hidden),
               "pooled_folder": f32(sout.pooler_output),  # 2-layer model, no projection
               "pooled_single": f32(out.text_embeds)}  # 3-layer OpenCLIP model, projected


def make_sdxl(ids):
    lmod, lstate = make_model(3, CLIPTextModel, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=2, hidden_act="quick_gelu", eos_token_id=EOS)
    gmod, gstate = make_model(4, CLIPTextModelWithProjection, hidden_size=48, intermediate_size=96,
                              num_hidden_layers=3, num_attention_heads=4, hidden_act="gelu", projection_dim=40,
                              eos_token_id=2)
    lout, gout = run(lmod, ids), run(gmod, ids)
    d = os.path.join(HERE, "sdxl")
    save_folder(os.path.join(d, "text_encoder"), lmod, lstate)
    save_folder(os.path.join(d, "text_encoder_2"), gmod, gstate, fp16=True)
    single = hf_names(lstate, "conditioner.embedders.0.transformer.", torch.float16)
    single.update(openclip_names(gstate, "conditioner.embedders.1.model.", torch.float16))
    single["model.diffusion_model.conv_in.weight"] = torch.zeros(4, 4, 3, 3, dtype=torch.float16)
    save_file(single, os.path.join(d, "single.safetensors"))
    # the two pooling rules really differ on row 2 for the legacy config
    assert int(np.argmax(ids[2])) != int(np.argmax(ids[2] == EOS))
    return d, {"l_hidden": f32(lout.hidden_states[-2]), "l_pooled": f32(lout.pooler_output),
               "g_hidden": f32(gout.hidden_states[-2]), "g_pooled": f32(gout.text_embeds)}


def main():
    shutil.rmtree(HERE, ignore_errors=True)
    ids = make_ids()
    total = 0
    for fn in (make_sd1, make_sd2, make_sdxl):
        d, exp = fn(ids)
        exp["ids"] = torch.tensor(ids)
        save_file(exp, os.path.join(d, "expected.safetensors"))
        size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
        total += size
        print(os.path.basename(d), {k: tuple(v.shape) for k, v in exp.items()}, size, "bytes")
    print("total", total, "bytes")


if __name__ == "__main__":
    main()
