#!/usr/bin/env python3
"""yardstick.py: the PyTorch runs that llmcl-train's benchmark is measured against.

The same Llama-style model as `llmcl-train --preset llama-1b` (Llama-3.2-1B's shape: width 2048,
16 layers, 32/8 heads, MLP 8192, vocabulary 128256, tied embeddings, Llama 3 RoPE scaling) or
`--preset llama-8b` (Llama-3-8B's: width 4096, 32 layers, 32/8 heads, MLP 14336, untied) as
transformers' LlamaForCausalLM with f32 parameters, bf16 autocast, SDPA attention and the fused
AdamW, trained on random tokens at batch B x T a GPU (by default the preset's, as llmcl-train's:
4 x 2048 for llama-1b, 1 x 8192 for llama-8b). Options: --compile (torch.compile),
--recompute (activation checkpointing of every layer), --lora R (the base frozen and adapters of
rank R on q, k, v, o, gate, up and down, as `llmcl-train --lora R`: PEFT's where the peft package
is installed, else the same layer written out, y = x W^T + alpha / R (x A^T) B^T; --bf16-base
holds the frozen base in bf16, as a model loaded with torch_dtype=torch.bfloat16, the adapters
f32), and under
torchrun --fsdp (FSDP2: fully_shard on every decoder layer and the root, bf16 parameters for
compute, f32 reduction). --teacher adds a frozen teacher of the same preset and the loss of
`llmcl-train --teacher`, (1 - A) CE + A T^2 D (hf_check.py's divergence, compiled with the model
under --compile), whose logits of both models PyTorch holds whole. --preference LOSS trains on
pairs as `llmcl-train --preference LOSS` does (TRL's DPOTrainer step): B pairs of T-token rows,
the B chosen then the B rejected, each a prompt of T / 8 tokens (unscored) and a completion; the
sequences' log-probabilities summed (dpo, cpo) or averaged (ipo, simpo, orpo) over the completion
from f32 log-softmax of the logits (compiled with the model under --compile), hf_check.py's
terms, and the chosen completions' cross-entropy at --pref-nll-weight; DPO and IPO against a
frozen bf16 copy of the starting model, or with --lora the model with its adapters off (TRL's
reference for a PEFT model). Tokens count both rows of a pair, as llmcl-train counts them.
Prints tokens/s over every GPU, MFU with llmcl-train's FLOP count (6 x multiplying parameters,
4 x frozen ones, + 6 x layers x T x width per token) against the given peak, and the peak device
memory of a GPU. A yardstick where PyTorch and a CUDA GPU exist, never a dependency.

    python3 tools/llmcl-train/yardstick.py --batch 4 --seq 2048 --steps 10
    python3 tools/llmcl-train/yardstick.py --lora 16 --compile
    python3 tools/llmcl-train/yardstick.py --teacher --compile --distill-beta 0.5
    python3 tools/llmcl-train/yardstick.py --preference dpo --batch 2 --compile
    torchrun --nproc_per_node 2 tools/llmcl-train/yardstick.py --fsdp --batch 4
"""
import argparse
import contextlib
import os
import time
from types import SimpleNamespace

import torch
from hf_check import divergence, pair_terms
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

# llmcl-train's batch and sequence for each preset, the defaults of --batch and --seq, so that a
# run without them sets the same shape against `llmcl-train --preset P`: the 8B model's 1 x 8192
# holds four times the attention work of 4 x 2048 in the same tokens
PRESET_SHAPES = {"llama-1b": (4, 2048), "llama-8b": (1, 8192)}

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraLinear(torch.nn.Module):
    """PEFT's LoRA layer without dropout: y = x W^T + scale (x A^T) B^T, A random and B zero;
    off (the base alone) while `adapters_off` is set on the class, as PEFT's disable_adapter."""
    adapters_off = False

    def __init__(self, base, rank, scale):
        super().__init__()
        self.base, self.scale = base, scale
        dev = base.weight.device
        self.lora_a = torch.nn.Parameter(torch.empty(rank, base.in_features, device=dev))
        self.lora_b = torch.nn.Parameter(torch.zeros(base.out_features, rank, device=dev))
        torch.nn.init.kaiming_uniform_(self.lora_a, a=5 ** 0.5)

    def forward(self, x):
        if LoraLinear.adapters_off:
            return self.base(x)
        return self.base(x) + self.scale * ((x @ self.lora_a.t()) @ self.lora_b.t())


@contextlib.contextmanager
def adapters_disabled(model):
    """The model with its adapters off: PEFT's context, or the written-out layer's flag."""
    if hasattr(model, "disable_adapter"):
        with model.disable_adapter():
            yield
        return
    LoraLinear.adapters_off = True
    try:
        yield
    finally:
        LoraLinear.adapters_off = False


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


def pair_batch(args, vocab, gen):
    """B pairs as llmcl-train's rows: ids [2B, T] and labels [2B, T] (-100 on the prompt)."""
    rows, t, prompt = 2 * args.batch, args.seq, args.seq // 8
    ids = torch.randint(0, vocab, (rows, t), device="cuda", generator=gen)
    ids[args.batch:, :prompt] = ids[:args.batch, :prompt]  # a pair shares its prompt
    labels = torch.full_like(ids, -100)
    labels[:, prompt - 1:-1] = ids[:, prompt:]
    return ids, labels


def preference_loss(args):
    """The pairs' mean term plus the chosen completions' cross-entropy at the NLL weight, from the
    policy's logits and the reference's sequence logps (None: no reference)."""
    average = args.preference in ("ipo", "simpo", "orpo")
    terms = SimpleNamespace(loss=args.preference, beta=args.pref_beta, gamma=args.pref_gamma,
                            label_smoothing=0.0)
    nll_weight = args.pref_nll_weight

    def logps(logits, labels):
        mask = labels != -100
        logp = torch.log_softmax(logits.float(), -1)
        picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
        total, count = picked.sum(-1), mask.sum(-1).clamp(min=1)
        return (total / count if average else total), picked, mask

    def loss(logits, labels, ref):
        n = labels.shape[0] // 2
        pi, picked, mask = logps(logits, labels)
        ref = torch.zeros_like(pi) if ref is None else ref
        nll = -picked[:n].sum() / mask[:n].sum().clamp(min=1)
        return pair_terms(terms, pi[:n], pi[n:], ref[:n], ref[n:]).mean() + nll_weight * nll

    def seq_logps(logits, labels):
        return logps(logits, labels)[0]
    if args.compile:
        return torch.compile(loss), torch.compile(seq_logps)
    return loss, seq_logps


def build(args, device):
    cfg = config(args)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    lora = ""
    if args.lora:
        if args.bf16_base:
            model = model.to(torch.bfloat16)
        model, how = add_lora(model, args.lora, args.lora_alpha or args.lora)
        lora = f" + {how} of rank {args.lora}" + (" on a bf16 base" if args.bf16_base else "")
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
    ap.add_argument("--batch", type=int, help="rows (pairs with --preference) a GPU; default "
                    "the preset's, as llmcl-train's: 4 for llama-1b, 1 for llama-8b")
    ap.add_argument("--seq", type=int, help="default the preset's: 2048, or 8192 for llama-8b")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 under torchrun")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--recompute", action="store_true", help="checkpoint every layer")
    ap.add_argument("--lora", type=int, default=0, help="LoRA adapters of rank R, base frozen")
    ap.add_argument("--lora-alpha", type=float, default=0.0, help="scale alpha / R (default R)")
    ap.add_argument("--bf16-base", action="store_true",
                    help="with --lora, the frozen base in bf16 (the adapters f32)")
    ap.add_argument("--teacher", action="store_true", help="distil from a frozen teacher")
    ap.add_argument("--distill-alpha", type=float, default=0.5)
    ap.add_argument("--distill-beta", type=float, default=0.0)
    ap.add_argument("--distill-temperature", type=float, default=1.0)
    ap.add_argument("--preference", choices=("dpo", "ipo", "simpo", "cpo", "orpo"),
                    help="train on B pairs (2B rows) with this preference loss")
    ap.add_argument("--pref-beta", type=float, default=0.1)
    ap.add_argument("--pref-gamma", type=float, default=None, help="SimPO's (default 0.5)")
    ap.add_argument("--pref-nll-weight", type=float, default=None,
                    help="default 1 for orpo and cpo, else 0")
    args = ap.parse_args()
    batch, seq = PRESET_SHAPES[args.preset]
    args.batch = batch if args.batch is None else args.batch
    args.seq = seq if args.seq is None else args.seq
    if args.bf16_base and not args.lora:
        ap.error("--bf16-base needs --lora")
    if args.pref_gamma is None:
        args.pref_gamma = 0.5 if args.preference == "simpo" else 0.0
    if args.pref_nll_weight is None:
        args.pref_nll_weight = 1.0 if args.preference in ("orpo", "cpo") else 0.0
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
    rows = 2 * args.batch if args.preference else args.batch
    if args.preference:
        pair_ids, pair_labels = pair_batch(args, cfg.vocab_size, gen)
        pref, seq_logps = preference_loss(args)
    with_ref = args.preference in ("dpo", "ipo")

    teacher = build_teacher(args, "cuda") if args.teacher or (with_ref and not args.lora) \
        else None
    kd = distill_loss(args) if args.teacher else None

    def reference_logps():
        if not with_ref:
            return None
        with torch.no_grad():
            if teacher is not None:
                return seq_logps(teacher(input_ids=pair_ids).logits, pair_labels)
            with adapters_disabled(model):
                return seq_logps(model(input_ids=pair_ids).logits, pair_labels)

    def forward():
        x, y = ids[:, :-1], ids[:, 1:].contiguous()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if args.preference:
                ref = reference_logps()
                return pref(model(input_ids=pair_ids).logits, pair_labels, ref)
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
    tps = world * rows * args.seq / dt
    what = ("fsdp2" if args.fsdp else "eager") + (" + compile" if args.compile else "") + \
        (" + recompute" if args.recompute else "") + lora + \
        (f" + a teacher (alpha {args.distill_alpha:g}, beta {args.distill_beta:g}, temperature "
         f"{args.distill_temperature:g}; MFU counts the student's FLOPs)" if args.teacher else "")
    if args.preference:
        against = ", against the adapters off" if args.lora else ", against a bf16 reference"
        what += (f" + {args.preference} (beta {args.pref_beta:g}, NLL weight "
                 f"{args.pref_nll_weight:g}{against if with_ref else ''}; {args.batch} pairs a "
                 "step, MFU counts the policy's FLOPs)")
    if rank == 0:
        print(f"pytorch {what}, {args.preset} on {world} GPU(s): {n_params / 1e9:.3f}B parameters, "
              f"batch {rows}x{args.seq} a GPU, {dt * 1e3:.1f} ms/step, "
              f"{tps / 1e3:.1f}k tokens/s, MFU "
              f"{100 * tps / world * flops_per_token / (args.peak_tflops * 1e12):.1f}% of "
              f"{args.peak_tflops:g} TFLOP/s, peak {torch.cuda.max_memory_allocated() / 2**30:.1f} "
              f"GiB a GPU, loss {loss.item():.3f}", flush=True)
    if args.fsdp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
