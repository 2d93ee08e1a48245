#!/usr/bin/env python3
"""PyTorch's torch.matmul (cuBLAS) on llmcl-bench's matmul shapes: a yardstick to run beside
llmcl-bench in the same session on a CUDA machine, never a dependency of llmcl.

usage: python3 tools/bench/yardstick_matmul.py [--kernels] [--settle S]
Prints one line per row: direction, M x N x K, median ms and TFLOP/s (triton.testing.do_bench
when Triton is present, else CUDA events; with --settle, replays of a CUDA graph of 20 calls,
yardstick_timing.py says why); with --kernels, then the CUDA kernels the row runs
(torch.profiler over five calls), each with its mean time: cuBLAS's names appear to give its
tiles, stages and cluster shape. fwd, dX and dW are bf16 in and out (PyTorch's autograd
of a bf16 linear layer); dW32 is llmcl's dW row's own operation, dw += dy^T x into an f32 dw
(cuBLAS through torch.addmm's out_dtype, PyTorch 2.8 and later; a line says where it is missing).
Then LoRA's products at rank 16 on a 2048-wide projection and the three that a group's stacked
adapters share at rank 48, as llmcl-bench's lora rows (their f32 gradients through out_dtype), and
the rank-16 adapter's projection as PEFT runs it, the base product and then the adapter's added."""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from yardstick_timing import add_settle_argument, apply_settle, median_ms

SHOW_KERNELS = False


def kernels_of(fn):
    """The CUDA kernels that fn launches, each with its mean time over five calls."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    return [f"{e.key} {e.device_time_total / e.count:.2f} us" for e in prof.key_averages()
            if e.device_time_total > 0]


def row(direction, m, n, k, fn):
    ms = median_ms(fn, graph=True)
    print(f"torch {direction:7s} {m}x{n}x{k}: {ms:.4f} ms, {2 * m * n * k / ms / 1e9:.1f} TFLOP/s",
          flush=True)
    if SHOW_KERNELS:
        for kernel in kernels_of(fn):
            print(f"    kernel {kernel}", flush=True)


def addmm_f32(c, a, b):
    """c += a b into f32 c from 16-bit a and b."""
    return torch.addmm(c, a, b, out_dtype=torch.float32, out=c)


def has_f32_out(dev):
    """Whether this PyTorch writes f32 from 16-bit products (out_dtype, 2.8 and later)."""
    a = torch.ones(16, 16, device=dev, dtype=torch.bfloat16)
    try:
        addmm_f32(torch.zeros(16, 16, device=dev), a, a)
        return True
    except (TypeError, RuntimeError) as e:
        print(f"torch: no f32 output from 16-bit products, dW32 and LoRA's f32 rows not run ({e})",
              flush=True)
        return False


def lora_rows(dev, t, width, r, shared, f32):
    """LoRA's products (tools/llmcl-train/model.c), all six or with shared the stacked three; f32:
    those into f32 gradients too."""
    bf = torch.bfloat16
    x, dy = (torch.randn(t, width, device=dev, dtype=bf) for _ in range(2))
    a, b = torch.randn(r, width, device=dev, dtype=bf), torch.randn(width, r, device=dev, dtype=bf)
    u, du = (torch.randn(t, r, device=dev, dtype=bf) for _ in range(2))
    y, dx = (torch.zeros(t, width, device=dev, dtype=bf) for _ in range(2))
    db = torch.zeros(width, r, device=dev, dtype=torch.float32)
    da = torch.zeros(r, width, device=dev, dtype=torch.float32)
    row("lora u", t, r, width, lambda: x @ a.t())
    if not shared:
        row("lora up", t, width, r, lambda: torch.addmm(y, u, b.t(), out=y))
        if f32:
            row("lora dB", width, r, t, lambda: addmm_f32(db, dy.t(), u))
        row("lora du", t, r, width, lambda: dy @ b)
    if f32:
        row("lora dA", r, width, t, lambda: addmm_f32(da, du.t(), x))
    row("lora dx", t, width, r, lambda: torch.addmm(dx, du, a, out=dx))


def lora_inside_rows(dev, t, width, r):
    """The adapter's projection as PEFT runs it: the base product, then the rank-r product added
    (llmcl-bench's "lora fwd+up" and "lora dX+dx", which llmcl runs as one product each)."""
    bf = torch.bfloat16
    x, dy, y, dx = (torch.randn(t, width, device=dev, dtype=bf) for _ in range(4))
    w = torch.randn(width, width, device=dev, dtype=bf)
    a, b = torch.randn(r, width, device=dev, dtype=bf), torch.randn(width, r, device=dev, dtype=bf)
    u, du = (torch.randn(t, r, device=dev, dtype=bf) for _ in range(2))

    def forward():
        torch.mm(x, w.t(), out=y)
        torch.addmm(y, u, b.t(), out=y)

    def backward():
        torch.mm(dy, w, out=dx)
        torch.addmm(dx, du, a, out=dx)

    row("lora fwd+up", t, width, width + r, forward)
    row("lora dX+dx", t, width, width + r, backward)


def main():
    global SHOW_KERNELS
    ap = argparse.ArgumentParser(description="cuBLAS on llmcl-bench's matmul shapes")
    ap.add_argument("--kernels", action="store_true", help="print the CUDA kernels of each row")
    add_settle_argument(ap)
    args = ap.parse_args()
    SHOW_KERNELS = args.kernels
    apply_settle(args)
    dev, bf = "cuda", torch.bfloat16
    f32 = has_f32_out(dev)
    a = torch.randn(8192, 8192, device=dev, dtype=bf)
    b = torch.randn(8192, 8192, device=dev, dtype=bf)
    row("gemm", 8192, 8192, 8192, lambda: a @ b)
    t = 8192
    for d_in, d_out in ((4096, 4096), (4096, 14336), (14336, 4096), (2048, 2048), (2048, 512),
                        (2048, 8192), (8192, 2048), (2048, 3072), (2048, 16384), (4096, 6144),
                        (4096, 28672)):
        x = torch.randn(t, d_in, device=dev, dtype=bf)
        w = torch.randn(d_out, d_in, device=dev, dtype=bf)
        dy = torch.randn(t, d_out, device=dev, dtype=bf)
        row("fwd", t, d_out, d_in, lambda: x @ w.t())
        row("dX", t, d_in, d_out, lambda: dy @ w)
        row("dW", d_out, d_in, t, lambda: dy.t() @ x)
        dw = torch.zeros(d_out, d_in, device=dev, dtype=torch.float32)
        if f32:
            row("dW32", d_out, d_in, t, lambda: addmm_f32(dw, dy.t(), x))
    lora_rows(dev, t, 2048, 16, False, f32)
    lora_rows(dev, t, 2048, 48, True, f32)
    lora_inside_rows(dev, t, 2048, 16)


if __name__ == "__main__":
    main()
