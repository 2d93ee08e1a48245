#!/usr/bin/env python3
"""PyTorch's torch.matmul (cuBLAS) on llmcl-bench's matmul shapes: a yardstick to run beside
llmcl-bench in the same session on a CUDA machine, never a dependency of llmcl.

usage: python3 tools/bench/yardstick_matmul.py
Prints one line per row: direction, M x N x K, median ms and TFLOP/s (triton.testing.do_bench
when Triton is present, else CUDA events). fwd, dX and dW are bf16 in and out (PyTorch's autograd
of a bf16 linear layer); dW32 is llmcl's dW row's own operation, dw += dy^T x into an f32 dw
(cuBLAS through torch.addmm's out_dtype, PyTorch 2.8 and later; a line says where it is missing)."""
import torch

from yardstick_timing import median_ms


def row(direction, m, n, k, fn):
    ms = median_ms(fn)
    print(f"torch {direction:5s} {m}x{n}x{k}: {ms:.4f} ms, {2 * m * n * k / ms / 1e9:.1f} TFLOP/s",
          flush=True)


def main():
    dev, bf = "cuda", torch.bfloat16
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
        try:
            torch.addmm(dw, dy.t(), x, out_dtype=torch.float32, out=dw)
        except (TypeError, RuntimeError) as e:
            print(f"torch dW32  {d_out}x{d_in}x{t}: not run ({e})", flush=True)
            continue
        row("dW32", d_out, d_in, t,
            lambda: torch.addmm(dw, dy.t(), x, out_dtype=torch.float32, out=dw))


if __name__ == "__main__":
    main()
