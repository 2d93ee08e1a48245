#!/usr/bin/env python3
"""PyTorch eager, torch.compile and Liger Kernel on llmcl-bench's preference rows: a yardstick to
run beside `llmcl-bench --only preference` in the same session on a CUDA machine, never a
dependency of llmcl.

usage: python3 tools/bench/yardstick_preference.py
The shapes are llmcl-bench's: B 4 pairs of T 1024 positions (hidden [2B, T, H] in bf16, the B
chosen sequences then their rejected ones), V 128256, H 2048 (a 1B model's head) and 4096 (8B's);
labels random, the first quarter of each sequence a prompt (ignore_index -100, not scored). The
losses are llmcl.h's: DPO on summed log-probabilities with random reference log-probabilities,
-log sigmoid(beta ((c - rc) - (r - rr))) averaged over the pairs, as TRL computes it; ORPO on
averaged log-probabilities, -beta log sigmoid(log odds(c) - log odds(r)) averaged over the pairs,
plus the chosen sequences' cross-entropy (nll_weight 1); beta 0.1. Logits are hidden @ W^T in
bf16, then log_softmax in f32. Prints one line per row: implementation, op, median ms, TFLOP/s
(6 N V H with the gradients: the logits, dhidden and dweight, whichever form recomputes the
logits; 2 N V H for the log-probabilities alone, on detached inputs, a reference model's pass;
llmcl-bench's counts, so that the rates compare as the times do) and peak memory beyond the inputs
(torch.cuda.max_memory_allocated less what was allocated before the call; the bf16 gradients it
returns count, llmcl's f32 ones are allocated beforehand and do not). Rows with gradients time
torch.autograd.grad of the loss with respect to hidden and W. Liger's rows:
LigerFusedLinearDPOLoss without a reference model (its reference log-probabilities 0: the same
work as llmcl's DPO row), with one (the reference's logits inside its chunks: 8 N V H, llmcl's
DPO and log-probability rows together) and LigerFusedLinearORPOLoss; skipped, with the reason,
where liger_kernel does not import."""
import torch
import torch.nn.functional as F

from yardstick_timing import median_ms

DEV, BF = "cuda", torch.bfloat16
B, T, V = 4, 1024, 128256
N, PROMPT, BETA, IGNORE = 2 * B * T, T // 4, 0.1, -100


def seq_logps(h, w, y, average):
    """Each sequence's summed (or averaged) log-probability of its labels, the per-position ones
    (0 where not scored) and the mask of scored positions."""
    lp = F.log_softmax((h @ w.T).float(), -1)
    mask = y != IGNORE
    tok = lp.gather(-1, torch.where(mask, y, 0).unsqueeze(-1)).squeeze(-1) * mask
    pi = tok.sum(-1)
    return (pi / mask.sum(-1).clamp(min=1) if average else pi), tok, mask


def dpo(h, w, y, ref):
    pi = seq_logps(h, w, y, False)[0]
    c, r = pi.chunk(2)
    rc, rr = ref.chunk(2)
    return -F.logsigmoid(BETA * ((c - rc) - (r - rr))).mean()


def orpo(h, w, y):
    pi, tok, mask = seq_logps(h, w, y, True)
    c, r = pi.chunk(2)
    log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
    nll = -tok[:B].sum() / mask[:B].sum()
    return -BETA * F.logsigmoid(log_odds).mean() + nll


def logps(h, w, y):
    """The log-probabilities alone: detached inputs build no graph, as under no_grad."""
    return seq_logps(h.detach(), w.detach(), y, False)[0]


def row(impl, op, fn, flops):
    try:
        ms = median_ms(fn, warmup=5, rep=50)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    except Exception as e:  # an implementation without this op: say so, keep going
        print(f"{impl:8s} {op:26s}: n/a ({type(e).__name__}: {e})", flush=True)
        return
    print(f"{impl:8s} {op:26s}: {ms:.4f} ms, {flops / ms / 1e9:.1f} TFLOP/s, peak {peak:.0f} MiB",
          flush=True)


def inputs(h_dim):
    h = (torch.randn(2 * B, T, h_dim, device=DEV, dtype=BF) * 0.5).requires_grad_()
    w = (torch.randn(V, h_dim, device=DEV, dtype=BF) * 0.02).requires_grad_()
    y = torch.randint(0, V, (2 * B, T), device=DEV)
    y[:, :PROMPT] = IGNORE
    ref = torch.rand(2 * B, device=DEV) * 2 - 1
    return h, w, y, ref


def torch_rows(impl, f_dpo, f_orpo, f_logps):
    for h_dim in (2048, 4096):
        h, w, y, ref = inputs(h_dim)
        gemm, shape = 2 * N * V * h_dim, f"H{h_dim}"
        row(impl, f"dpo fwd+bwd {shape}", lambda: torch.autograd.grad(f_dpo(h, w, y, ref), (h, w)),
            3 * gemm)
        if h_dim == 2048:
            row(impl, f"logps fwd {shape}", lambda: f_logps(h, w, y), gemm)
            row(impl, f"orpo+nll fwd+bwd {shape}",
                lambda: torch.autograd.grad(f_orpo(h, w, y), (h, w)), 3 * gemm)
        del h, w, y, ref
        torch.cuda.empty_cache()


def liger():
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearDPOLoss, LigerFusedLinearORPOLoss
        # average_log_prob came in 0.5.9; before it Liger's DPO averaged
        free = LigerFusedLinearDPOLoss(beta=BETA, use_ref_model=False, average_log_prob=False)
        with_ref = LigerFusedLinearDPOLoss(beta=BETA, use_ref_model=True, average_log_prob=False)
        orpo_l = LigerFusedLinearORPOLoss(beta=BETA, compute_nll_loss=True)
    except Exception as e:
        print(f"liger: n/a ({type(e).__name__}: {e})", flush=True)
        return
    for h_dim in (2048, 4096):
        h, w, y, _ = inputs(h_dim)
        rh, rw = h.detach().clone(), w.detach().clone()
        gemm, shape = 2 * N * V * h_dim, f"H{h_dim}"
        row("liger", f"dpo fwd+bwd {shape}",
            lambda: torch.autograd.grad(free(w, h, y)[0], (h, w)), 3 * gemm)
        row("liger", f"dpo+ref model fwd+bwd {shape}",
            lambda: torch.autograd.grad(with_ref(w, h, y, ref_input=rh, ref_weight=rw)[0], (h, w)),
            4 * gemm)
        if h_dim == 2048:
            row("liger", f"orpo+nll fwd+bwd {shape}",
                lambda: torch.autograd.grad(orpo_l(w, h, y)[0], (h, w)), 3 * gemm)
        del h, w, y, rh, rw
        torch.cuda.empty_cache()


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    torch_rows("eager", dpo, orpo, logps)
    compiled = [torch.compile(f, dynamic=False) for f in (dpo, orpo, logps)]
    torch_rows("compile", *compiled)
    liger()


if __name__ == "__main__":
    main()
