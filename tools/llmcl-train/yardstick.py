#!/usr/bin/env python3
"""yardstick.py: the PyTorch runs that llmcl-train's benchmark is measured against.

The same Llama-style model as `llmcl-train --preset llama-1b` (Llama-3.2-1B's shape: width 2048,
16 layers, 32/8 heads, MLP 8192, vocabulary 128256, tied embeddings, Llama 3 RoPE scaling) or
`--preset llama-8b` (Llama-3-8B's: width 4096, 32 layers, 32/8 heads, MLP 14336, untied) as
transformers' LlamaForCausalLM with f32 parameters, bf16 autocast, SDPA attention and the fused
AdamW, trained on random tokens at batch B x T a GPU. Options: --compile (torch.compile),
--recompute (activation checkpointing of every layer), --lora R (the base frozen and adapters of
rank R on q, k, v, o, gate, up and down, as `llmcl-train --lora R`: PEFT's where the peft package
is installed, else the same layer written out, y = x W^T + alpha / R (x A^T) B^T), and under
torchrun --fsdp (FSDP2: fully_shard on every decoder layer and the root, bf16 parameters for
compute, f32 reduction). --teacher adds a frozen teacher of the same preset and the loss of
`llmcl-train --teacher`, (1 - A) CE + A T^2 D (hf_check.py's divergence, compiled with the model
under --compile), whose logits of both models PyTorch holds whole.
Prints tokens/s over every GPU, MFU with llmcl-train's FLOP count (6 x multiplying parameters,
4 x frozen ones, + 6 x layers x T x width per token) against the given peak, and the peak device
memory of a GPU. A yardstick where PyTorch and a CUDA GPU exist, never a dependency.

    python3 tools/llmcl-train/yardstick.py --batch 4 --seq 2048 --steps 10
    python3 tools/llmcl-train/yardstick.py --lora 16 --compile
    python3 tools/llmcl-train/yardstick.py --teacher --compile --distill-beta 0.5
    torchrun --nproc_per_node 2 tools/llmcl-train/yardstick.py --fsdp --batch 4
"""
import argparse
import os
import time

import torch
from hf_check import divergence
from transformers import LlamaConfig, LlamaForCausalLM

PRESETS = {
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True,
                     rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192}),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
}

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraLinear(torch.nn.Module):
    """PEFT's LoRA layer without dropout: y = x W^T + scale (x A^T) B^T, A random and B zero."""

    def __init__(self, base, rank, scale):
        super().__init__()
        self.base, self.scale = base, scale
        dev = base.weight.device
        self.lora_a = torch.nn.Parameter(torch.empty(rank, base.in_features, device=dev))
        self.lora_b = torch.nn.Parameter(torch.zeros(base.out_features, rank, device=dev))
        torch.nn.init.kaiming_uniform_(self.lora_a, a=5 ** 0.5)

    def forward(self, x):
        return self.base(x) + self.scale * ((x @ self.lora_a.t()) @ self.lora_b.t())


def add_lora(model, rank, alpha):
    """Freezes the model and adds adapters; returns the model and which LoRA it runs."""
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        for layer in model.model.layers:
            for parent in (layer.self_attn, layer.mlp):
                for name, child in list(parent.named_children()):
                    if name in LORA_TARGETS:
                        setattr(parent, name, LoraLinear(child, rank, alpha / rank))
        return model, "LoRA written out (no peft)"
    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=LORA_TARGETS,
                     bias="none")
    return get_peft_model(model, cfg), "PEFT's LoRA"


def config(args):
    return LlamaConfig(vocab_size=128256, max_position_embeddings=max(args.seq, 8192),
                       rms_norm_eps=1e-5, rope_theta=500000.0, attn_implementation="sdpa",
                       **PRESETS[args.preset])


def build_teacher(args, device):
    """A frozen model of the preset's shape, in bf16 as llmcl-train's teacher computes."""
    with torch.device(device):
        teacher = LlamaForCausalLM(config(args)).to(torch.bfloat16).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return torch.compile(teacher) if args.compile else teacher


def distill_loss(args):
    """(1 - A) CE + A T^2 D over every target, on the student's and teacher's logits."""
    a, t = args.distill_alpha, args.distill_temperature

    def loss(student, teacher, targets):
        s, v = student.float().reshape(-1, student.shape[-1]), teacher.float()
        ce = torch.nn.functional.cross_entropy(s, targets.reshape(-1))
        d = divergence(s, v.reshape(s.shape), args.distill_beta, t).mean()
        return (1 - a) * ce + a * t * t * d
    return torch.compile(loss) if args.compile else loss


def build(args, device):
    cfg = config(args)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    lora = ""
    if args.lora:
        model, how = add_lora(model, args.lora, args.lora_alpha or args.lora)
        lora = f" + {how} of rank {args.lora}"
    n_frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    n_trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if args.recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    if args.compile:
        model = torch.compile(model)
    return cfg, model, n_params, (n_trained, n_frozen), lora


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama-1b")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 under torchrun")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--recompute", action="store_true", help="checkpoint every layer")
    ap.add_argument("--lora", type=int, default=0, help="LoRA adapters of rank R, base frozen")
    ap.add_argument("--lora-alpha", type=float, default=0.0, help="scale alpha / R (default R)")
    ap.add_argument("--teacher", action="store_true", help="distil from a frozen teacher")
    ap.add_argument("--distill-alpha", type=float, default=0.5)
    ap.add_argument("--distill-beta", type=float, default=0.0)
    ap.add_argument("--distill-temperature", type=float, default=1.0)
    args = ap.parse_args()
    world, rank = 1, 0
    if args.fsdp:
        torch.distributed.init_process_group("nccl")
        world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    cfg, model, n_params, (n_trained, n_frozen), lora = build(args, "cuda")
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    flops_per_token = 6 * n_trained + 4 * n_frozen + \
        6 * cfg.num_hidden_layers * args.seq * cfg.hidden_size
    gen = torch.Generator(device="cuda").manual_seed(rank)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), device="cuda",
                        generator=gen)

    teacher = build_teacher(args, "cuda") if args.teacher else None
    kd = distill_loss(args) if args.teacher else None

    def forward():
        x, y = ids[:, :-1], ids[:, 1:].contiguous()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if teacher is None:
                return model(input_ids=x, labels=y).loss
            with torch.no_grad():
                t_logits = teacher(input_ids=x).logits
            return kd(model(input_ids=x).logits, t_logits, y)

    def step():
        loss = forward()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / args.steps
    tps = world * args.batch * args.seq / dt
    what = ("fsdp2" if args.fsdp else "eager") + (" + compile" if args.compile else "") + \
        (" + recompute" if args.recompute else "") + lora + \
        (f" + a teacher (alpha {args.distill_alpha:g}, beta {args.distill_beta:g}, temperature "
         f"{args.distill_temperature:g}; MFU counts the student's FLOPs)" if args.teacher else "")
    if rank == 0:
        print(f"pytorch {what}, {args.preset} on {world} GPU(s): {n_params / 1e9:.3f}B parameters, "
              f"batch {args.batch}x{args.seq} a GPU, {dt * 1e3:.1f} ms/step, "
              f"{tps / 1e3:.1f}k tokens/s, MFU "
              f"{100 * tps / world * flops_per_token / (args.peak_tflops * 1e12):.1f}% of "
              f"{args.peak_tflops:g} TFLOP/s, peak {torch.cuda.max_memory_allocated() / 2**30:.1f} "
              f"GiB a GPU, loss {loss.item():.3f}", flush=True)
    if args.fsdp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
