#!/usr/bin/env python3
"""reference.py: llmcl-train's model written independently in PyTorch (float64), for the fixture
that tests/test_train.c checks llmcl-train against (as llm.c's test_gpt2 does).

From fixed weights and a fixed batch it records the logits, the mean cross-entropy, every
parameter's gradient and the losses of ten AdamW steps (global-norm clipping, decoupled weight
decay, no decay on norm weights) into a safetensors file, written with the standard library only
(an 8-byte little-endian header length, a JSON header, raw little-endian data). The weights use
Hugging Face LlamaForCausalLM names and layout.

    python3 tools/llmcl-train/reference.py tests/data/train_fixture_tied.safetensors --tied
    python3 tools/llmcl-train/reference.py tests/data/train_fixture_untied.safetensors
    python3 tools/llmcl-train/reference.py tests/data/train_fixture_qwen3.safetensors --qwen3

--qwen3 adds what the other architectures bring to Llama's layers, all at once: biases on q, k, v
and o (Qwen3's attention_bias), an RMSNorm per head of q and of k before RoPE, a head dimension
other than dim / heads, and a sliding window shorter than the sequence.

Needs PyTorch (the device machine has it); never a dependency of the library or of CI.
"""
import argparse
import json
import math
import struct

import torch

CONFIG = dict(vocab=64, dim=64, layers=2, heads=2, kv_heads=1, ffn=96, batch=2, seq=16,
              norm_eps=1e-5, rope_theta=500000.0, rope_llama3_factor=32.0,
              lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip=0.5, steps=10)


def inv_freq_llama3(d, theta, factor, low=1.0, high=4.0, original=8192):
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_mid, mid, scaled)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def project(h, p, name):
    y = h @ p[name + ".weight"].T
    return y + p[name + ".bias"] if name + ".bias" in p else y


def forward(p, ids, c, tied):
    b, t = ids.shape
    d = c["head_dim"]
    rep = c["heads"] // c["kv_heads"]
    inv = inv_freq_llama3(d, c["rope_theta"], c["rope_llama3_factor"])
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1), torch.cat((ang.sin(), ang.sin()), -1)
    x = p["model.embed_tokens.weight"][ids]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    if c["sliding_window"]:  # query i sees keys i - window + 1 .. i
        mask &= torch.ones(t, t, dtype=torch.bool).triu(1 - c["sliding_window"])
    for l in range(c["layers"]):
        pre = f"model.layers.{l}."
        h = rmsnorm(x, p[pre + "input_layernorm.weight"], c["norm_eps"])
        q = project(h, p, pre + "self_attn.q_proj").view(b, t, c["heads"], d)
        k = project(h, p, pre + "self_attn.k_proj").view(b, t, c["kv_heads"], d)
        v = project(h, p, pre + "self_attn.v_proj").view(b, t, c["kv_heads"], d).transpose(1, 2)
        if c["qk_norm"]:
            q = rmsnorm(q, p[pre + "self_attn.q_norm.weight"], c["norm_eps"])
            k = rmsnorm(k, p[pre + "self_attn.k_norm.weight"], c["norm_eps"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        att = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
        x = x + project(att.transpose(1, 2).reshape(b, t, -1), p, pre + "self_attn.o_proj")
        h = rmsnorm(x, p[pre + "post_attention_layernorm.weight"], c["norm_eps"])
        g = torch.nn.functional.silu(h @ p[pre + "mlp.gate_proj.weight"].T)
        x = x + (g * (h @ p[pre + "mlp.up_proj.weight"].T)) @ p[pre + "mlp.down_proj.weight"].T
    h = rmsnorm(x, p["model.norm.weight"], c["norm_eps"])
    head = p["model.embed_tokens.weight"] if tied else p["lm_head.weight"]
    return (h @ head.T).reshape(b * t, -1)


def make_params(c, tied, gen):
    d = c["head_dim"]
    shapes = {"model.embed_tokens.weight": (c["vocab"], c["dim"])}
    for l in range(c["layers"]):
        pre = f"model.layers.{l}."
        if c["qkv_bias"]:
            shapes.update({pre + "self_attn.q_proj.bias": (c["heads"] * d,),
                           pre + "self_attn.k_proj.bias": (c["kv_heads"] * d,),
                           pre + "self_attn.v_proj.bias": (c["kv_heads"] * d,)})
        if c["o_bias"]:
            shapes[pre + "self_attn.o_proj.bias"] = (c["dim"],)
        if c["qk_norm"]:
            shapes.update({pre + "self_attn.q_norm.weight": (d,),
                           pre + "self_attn.k_norm.weight": (d,)})
        shapes.update({
            pre + "input_layernorm.weight": (c["dim"],),
            pre + "self_attn.q_proj.weight": (c["heads"] * d, c["dim"]),
            pre + "self_attn.k_proj.weight": (c["kv_heads"] * d, c["dim"]),
            pre + "self_attn.v_proj.weight": (c["kv_heads"] * d, c["dim"]),
            pre + "self_attn.o_proj.weight": (c["dim"], c["heads"] * d),
            pre + "post_attention_layernorm.weight": (c["dim"],),
            pre + "mlp.gate_proj.weight": (c["ffn"], c["dim"]),
            pre + "mlp.up_proj.weight": (c["ffn"], c["dim"]),
            pre + "mlp.down_proj.weight": (c["dim"], c["ffn"]),
        })
    shapes["model.norm.weight"] = (c["dim"],)
    if not tied:
        shapes["lm_head.weight"] = (c["vocab"], c["dim"])
    params = {}
    for name, shape in shapes.items():
        if name.endswith(".bias"):  # away from 0, so that they change the forward
            w = 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif len(shape) == 1:  # norms away from 1, so that their gradients matter
            w = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:  # wider than Llama's 0.02, so that a tiny model has a loss landscape worth checking
            w = 0.15 * torch.randn(shape, generator=gen, dtype=torch.float64)
        params[name] = w.float().double().requires_grad_(True)  # values exact in f32
    return params


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    codes = {torch.float32: "F32", torch.int32: "I32"}
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("output")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--qwen3", action="store_true",
                    help="biases on q, k, v and o, q and k norms, head_dim 48, a window of 6")
    args = ap.parse_args()
    c = dict(CONFIG, head_dim=CONFIG["dim"] // CONFIG["heads"], qkv_bias=0, o_bias=0, qk_norm=0,
             sliding_window=0)
    if args.qwen3:
        c.update(arch="qwen3", head_dim=48, qkv_bias=1, o_bias=1, qk_norm=1, sliding_window=6)
    gen = torch.Generator().manual_seed(20261124 + args.tied)
    params = make_params(c, args.tied, gen)
    ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"] + 1), generator=gen)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    out = {name: w.float() for name, w in params.items()}
    out["input_ids"] = inputs.int()
    out["targets"] = targets.int()

    logits = forward(params, inputs, c, args.tied)
    loss = torch.nn.functional.cross_entropy(logits, targets.reshape(-1))
    loss.backward()
    out["logits"] = logits.float()
    out["loss"] = loss.reshape(1).float()
    for name, w in params.items():
        out["grad." + name] = w.grad.float()

    norms = [w for n, w in params.items() if w.dim() == 1]
    mats = [w for n, w in params.items() if w.dim() == 2]
    opt = torch.optim.AdamW([{"params": mats}, {"params": norms, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"],
                            weight_decay=c["weight_decay"])
    losses = []
    for _ in range(c["steps"]):
        opt.zero_grad()
        step_loss = torch.nn.functional.cross_entropy(forward(params, inputs, c, args.tied),
                                                      targets.reshape(-1))
        step_loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), c["clip"])
        opt.step()
        losses.append(step_loss.item())
    out["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    metadata = {k: str(v) for k, v in c.items()}
    metadata["tied"] = str(int(args.tied))
    write_safetensors(args.output, out, metadata)
    print(f"{args.output}: loss {loss.item():.6f}, after {c['steps']} AdamW steps "
          f"{losses[-1]:.6f}")


if __name__ == "__main__":
    main()
