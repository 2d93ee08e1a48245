#!/usr/bin/env python3
"""PyTorch eager, torch.compile and Liger Kernel on llmcl-bench's distillation rows: a yardstick
to run beside `llmcl-bench --only distill` in the same session on a CUDA machine, never a
dependency of llmcl.

usage: python3 tools/bench/yardstick_distill.py
Prints one line per row: implementation, op, median ms, and GB/s (logits rows: the student's and
the teacher's bf16 logits read once and the gradient written once, as llmcl-bench counts them) or
TFLOP/s (linear rows: 8 N V H, both logits products and the two gradient products). Every row is
the loss and the student's gradients (torch.autograd.grad). The divergence is the generalised JSD
of llmcl.h (Liger's): mean over the rows, at temperature 1. The `+ce` rows add the student's
cross-entropy on random labels to the forward KL, as llmcl-bench's `+ce` rows and
`llmcl-train --teacher` do (PyTorch only). Liger's rows are skipped, with the reason, where
liger_kernel does not import."""
import math

import torch
import torch.nn.functional as F

from yardstick_timing import median_ms

DEV, BF = "cuda", torch.bfloat16
N, V, H = 8192, 128256, 4096


def jsd(s, t, beta):
    """The divergence of f32 log-probabilities of the student's and the teacher's logits."""
    x, y = F.log_softmax(s.float(), -1), F.log_softmax(t.float(), -1)
    if beta == 0.0:
        return F.kl_div(x, y, reduction="batchmean", log_target=True)
    if beta == 1.0:
        return F.kl_div(y, x, reduction="batchmean", log_target=True)
    m = torch.logsumexp(torch.stack([y + math.log(beta), x + math.log1p(-beta)]), 0)
    d = beta * (y.exp() * (y - m)).sum() + (1 - beta) * (x.exp() * (x - m)).sum()
    return d / s.shape[0]


def kd_ce(s, t, y):
    """The forward KL with the student's cross-entropy on the labels y beside it."""
    return jsd(s, t, 0.0) + F.cross_entropy(s.float(), y)


def row(impl, op, fn, nbytes=0, flops=0):
    try:
        ms = median_ms(fn, warmup=5, rep=50)
    except Exception as e:  # an implementation without this op: say so, keep going
        print(f"{impl:8s} {op:28s}: n/a ({type(e).__name__}: {e})", flush=True)
        return
    rate = f"{nbytes / ms / 1e6:.0f} GB/s" if nbytes else f"{flops / ms / 1e9:.1f} TFLOP/s"
    print(f"{impl:8s} {op:28s}: {ms:.4f} ms, {rate}", flush=True)


def logits_rows(impl, f, fce):
    s = torch.rand(N, V, device=DEV, dtype=BF).mul_(2).sub_(1).requires_grad_()
    t = torch.rand(N, V, device=DEV, dtype=BF).mul_(2).sub_(1)
    y = torch.randint(0, V, (N,), device=DEV)
    nbytes = 3 * N * V * 2
    for beta in (0.5, 0.0):
        row(impl, f"distill beta {beta} fwd+bwd", lambda: torch.autograd.grad(f(s, t, beta), s),
            nbytes)
    row(impl, "distill beta 0 +ce fwd+bwd", lambda: torch.autograd.grad(fce(s, t, y), s), nbytes)
    del s, t, y
    torch.cuda.empty_cache()


def linear_rows(impl, f, fce=None):
    h = (torch.randn(N, H, device=DEV, dtype=BF) * 0.5).requires_grad_()
    w = (torch.randn(V, H, device=DEV, dtype=BF) * 0.02).requires_grad_()
    th = torch.randn(N, H, device=DEV, dtype=BF) * 0.5
    tw = torch.randn(V, H, device=DEV, dtype=BF) * 0.02
    row(impl, "linear_distill beta 0.5", lambda: torch.autograd.grad(f(h, w, th, tw), (h, w)),
        flops=8 * N * V * H)
    if fce:
        y = torch.randint(0, V, (N,), device=DEV)
        row(impl, "linear_distill beta 0 +ce",
            lambda: torch.autograd.grad(fce(h, w, th, tw, y), (h, w)), flops=8 * N * V * H)
    torch.cuda.reset_peak_memory_stats()
    torch.autograd.grad(f(h, w, th, tw), (h, w))
    print(f"{impl:8s} {'linear_distill peak':28s}: "
          f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB", flush=True)
    del h, w, th, tw
    torch.cuda.empty_cache()


def linear_eager(h, w, th, tw):
    return jsd(h @ w.T, th @ tw.T, 0.5)


def linear_eager_ce(h, w, th, tw, y):
    return kd_ce(h @ w.T, th @ tw.T, y)


def liger():
    try:
        from liger_kernel.transformers import LigerJSD, LigerFusedLinearJSD
    except Exception as e:
        print(f"liger: n/a ({type(e).__name__}: {e})", flush=True)
        return
    for beta in (0.5, 0.0):
        loss = LigerJSD(beta=beta)
        s = torch.rand(N, V, device=DEV, dtype=BF).mul_(2).sub_(1).requires_grad_()
        t = torch.rand(N, V, device=DEV, dtype=BF).mul_(2).sub_(1)
        # LigerJSD takes log-probabilities: the log-softmax is part of the row
        f = lambda: torch.autograd.grad(
            loss(F.log_softmax(s.float(), -1), F.log_softmax(t.float(), -1)), s)
        row("liger", f"distill beta {beta} fwd+bwd", f, 3 * N * V * 2)
        del s, t
        torch.cuda.empty_cache()
    lin = LigerFusedLinearJSD(jsd_beta=0.5, temperature=1.0)
    linear_rows("liger", lambda h, w, th, tw: lin(h, w, th, tw))


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    logits_rows("eager", jsd, kd_ce)
    logits_rows("compile", torch.compile(jsd, dynamic=False), torch.compile(kd_ce, dynamic=False))
    linear_rows("eager", linear_eager, linear_eager_ce)
    linear_rows("compile", torch.compile(linear_eager, dynamic=False),
                torch.compile(linear_eager_ce, dynamic=False))
    liger()


if __name__ == "__main__":
    main()
