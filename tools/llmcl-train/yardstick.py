#!/usr/bin/env python3
"""yardstick.py: the PyTorch eager run that llmcl-train's benchmark is measured against.

The same Llama-style model as `llmcl-train --preset llama-1b` (Llama-3.2-1B's shape: width 2048,
16 layers, 32/8 heads, MLP 8192, vocabulary 128256, tied embeddings, Llama 3 RoPE scaling) as
transformers' LlamaForCausalLM with f32 parameters, bf16 autocast, SDPA attention and the fused
AdamW, trained on random tokens at batch B x T. Prints tokens/s, MFU with llmcl-train's FLOP count
(6 x multiplying parameters + 6 x layers x T x width per token) against the given peak, and the
peak device memory. A yardstick where PyTorch and a CUDA GPU exist, never a dependency.

    python3 tools/llmcl-train/yardstick.py --batch 4 --seq 2048 --steps 10
"""
import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    args = ap.parse_args()
    cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                      num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=args.seq, rms_norm_eps=1e-5, rope_theta=500000.0,
                      rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192},
                      tie_word_embeddings=True, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    n_params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * n_params + 6 * cfg.num_hidden_layers * args.seq * cfg.hidden_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), device="cuda",
                        generator=gen)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids[:, :-1], labels=ids[:, 1:].contiguous()).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
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
    tps = args.batch * args.seq / dt
    print(f"pytorch eager: {n_params / 1e9:.3f}B parameters, batch {args.batch}x{args.seq}, "
          f"{dt * 1e3:.1f} ms/step, {tps / 1e3:.1f}k tokens/s, "
          f"MFU {100 * tps * flops_per_token / (args.peak_tflops * 1e12):.1f}% of "
          f"{args.peak_tflops:g} TFLOP/s, peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB, "
          f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
