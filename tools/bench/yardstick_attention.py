#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention (the FlashAttention-2 and cuDNN backends) on
llmcl-bench's attention shapes: a yardstick to run beside llmcl-bench in the same session on a
CUDA machine, never a dependency of llmcl.

usage: python3 tools/bench/yardstick_attention.py [--settle S]
Prints one line per shape and backend: forward and forward+backward median ms and TFLOP/s in
FlashAttention's convention (4 B Hq T^2 D, halved for causal; the backward 2.5x the forward).
Grouped-query shapes repeat K and V per query head, outside the timed region."""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from yardstick_timing import add_settle_argument, apply_settle, median_ms

SHAPES = [  # B, Hq, Hkv, T, D, causal: llmcl-bench's rows, in its order
    (4, 32, 8, 4096, 128, True), (16, 32, 8, 1024, 128, True), (8, 32, 8, 2048, 128, True),
    (2, 32, 8, 8192, 128, True), (1, 32, 8, 16384, 128, True), (4, 32, 8, 4096, 64, True),
    (2, 16, 4, 4096, 256, True), (4, 32, 8, 4096, 128, False),
]
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def run(b, hq, hkv, t, d, causal, backend):
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(b, hq, t, d, device=dev, dtype=bf, requires_grad=True)
    k = torch.randn(b, hkv, t, d, device=dev, dtype=bf)
    v = torch.randn(b, hkv, t, d, device=dev, dtype=bf)
    # The backends take K and V per query head: the repeat is outside the timed region.
    k = k.repeat_interleave(hq // hkv, dim=1).requires_grad_()
    v = v.repeat_interleave(hq // hkv, dim=1).requires_grad_()
    dout = torch.randn_like(q)
    with sdpa_kernel(BACKENDS[backend]):
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        both = lambda: torch.autograd.grad(fwd(), (q, k, v), dout)
        return median_ms(fwd, 10, 100, 10), median_ms(both, 10, 100, 10)


def main():
    ap = argparse.ArgumentParser(description="SDPA's backends on llmcl-bench's attention shapes")
    add_settle_argument(ap)
    apply_settle(ap.parse_args())
    for b, hq, hkv, t, d, causal in SHAPES:
        flops = 4.0 * b * hq * t * t * d / (2 if causal else 1)
        for name in BACKENDS:
            try:
                f, fb = run(b, hq, hkv, t, d, causal, name)
            except RuntimeError as e:
                print(f"sdpa {name:5s} {b}x{hq}/{hkv}x{t}x{d}{' causal' if causal else ''}: "
                      f"not run ({str(e).splitlines()[0][:80]})", flush=True)
                continue
            print(f"sdpa {name:5s} {b}x{hq}/{hkv}x{t}x{d}{' causal' if causal else ''}: "
                  f"fwd {f:.3f} ms {flops / f / 1e9:.1f} TFLOP/s, fwd+bwd {fb:.3f} ms "
                  f"{3.5 * flops / fb / 1e9:.1f} TFLOP/s", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
