#!/usr/bin/env python3
"""PyTorch eager and Liger Kernel on llmcl-bench's memory-bound shapes (norms, RoPE, SwiGLU, the
copy): a yardstick to run beside llmcl-bench in the same session on a CUDA machine, never a
dependency of llmcl.

usage: python3 tools/bench/yardstick_memory.py
Prints one line per row: implementation, op, direction, median ms and GB/s, where the bytes are
llmcl-bench's for the same row (every input read once, every output written once), so the two
tables compare directly. Backward rows time torch.autograd.grad on a kept graph. Liger's rows are
skipped, with the reason, where liger_kernel does not import. The `triton` row is SwiGLU's forward
as Liger computes it (a program a row, the whole row in one block), written here so that the row
runs where Liger is not installed."""
import torch

from yardstick_timing import median_ms

DEV, BF = "cuda", torch.bfloat16


def row(impl, op, direction, nbytes, fn):
    try:
        ms = median_ms(fn)
    except Exception as e:  # an implementation without this op or dtype: say so, keep going
        print(f"{impl:6s} {op:10s} {direction:4s}: n/a ({type(e).__name__}: {e})", flush=True)
        return
    print(f"{impl:6s} {op:10s} {direction:4s}: {ms:.4f} ms, {nbytes / ms / 1e6:.0f} GB/s", flush=True)


def fwd_bwd(impl, op, f, inputs, grads_of, bytes_fwd, bytes_bwd):
    row(impl, op, "fwd", bytes_fwd, lambda: f(*inputs))
    out = f(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    douts = [torch.randn_like(o) for o in outs]
    row(impl, op, "bwd", bytes_bwd,
        lambda: torch.autograd.grad(outs, grads_of, douts, retain_graph=True))


def liger():
    try:
        from liger_kernel.ops import rms_norm, layer_norm, rope, swiglu
        return rms_norm, layer_norm, rope, swiglu
    except Exception as e:
        print(f"liger: n/a ({type(e).__name__}: {e})", flush=True)
        return None


def norms(lg):
    n, h, e = 8192, 4096, 2
    act, vec, rowf = n * h * e, h * e, n * 4
    x = torch.randn(n, h, device=DEV, dtype=BF, requires_grad=True)
    w = (0.5 + torch.rand(h, device=DEV, dtype=BF)).requires_grad_()
    b = torch.rand(h, device=DEV, dtype=BF, requires_grad=True)
    rms = lambda x, w: torch.nn.functional.rms_norm(x, (h,), w, 1e-5)
    ln = lambda x, w, b: torch.nn.functional.layer_norm(x, (h,), w, b, 1e-5)
    fwd_bwd("torch", "rmsnorm", rms, (x, w), (x, w), 2 * act + vec + rowf,
            3 * act + 2 * vec + rowf)
    fwd_bwd("torch", "layernorm", ln, (x, w, b), (x, w, b), 2 * act + 2 * vec + 2 * rowf,
            3 * act + 3 * vec + 2 * rowf)
    if lg:
        rms_l = lambda x, w: lg[0].LigerRMSNormFunction.apply(x, w, 1e-5, 0.0, "llama", False)
        ln_l = lambda x, w, b: lg[1].LigerLayerNormFunction.apply(x, w, b, 1e-5)
        fwd_bwd("liger", "rmsnorm", rms_l, (x, w), (x, w), 2 * act + vec + rowf,
                3 * act + 2 * vec + rowf)
        fwd_bwd("liger", "layernorm", ln_l, (x, w, b), (x, w, b), 2 * act + 2 * vec + 2 * rowf,
                3 * act + 3 * vec + 2 * rowf)


def rotate(q, k, cos, sin):
    def rot(t):
        t1, t2 = t.chunk(2, dim=-1)
        return t * cos + torch.cat((-t2, t1), dim=-1) * sin
    return rot(q), rot(k)


def ropes(lg):
    b, hq, hk, t, d = 4, 32, 8, 2048, 128
    q = torch.randn(b, hq, t, d, device=DEV, dtype=BF, requires_grad=True)
    k = torch.randn(b, hk, t, d, device=DEV, dtype=BF, requires_grad=True)
    ang = torch.outer(torch.arange(t, device=DEV, dtype=torch.float32),
                      10000.0 ** (-torch.arange(0, d, 2, device=DEV, dtype=torch.float32) / d))
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos().to(BF)[None, None], emb.sin().to(BF)[None, None]
    nbytes = 2 * (q.numel() + k.numel()) * 2 + 2 * t * (d // 2) * 4  # llmcl-bench's convention
    fwd_bwd("torch", "rope", lambda q, k: rotate(q, k, cos, sin), (q, k), (q, k), nbytes, nbytes)
    if lg:
        c, s = cos[0], sin[0]
        fwd_bwd("liger", "rope", lambda q, k: lg[2].LigerRopeFunction.apply(q, k, c, s), (q, k),
                (q, k), nbytes, nbytes)


def triton_swiglu():
    """silu(g) * u by a Triton program a row, the row in one block of 16 warps, math in f32."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def fwd(g_ptr, u_ptr, o_ptr, cols, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64) * cols
        c = tl.arange(0, BLOCK)
        m = c < cols
        g = tl.load(g_ptr + row + c, mask=m, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + row + c, mask=m, other=0.0)
        tl.store(o_ptr + row + c, (g * tl.sigmoid(g)).to(u.dtype) * u, mask=m)

    def run(g, u):
        o = torch.empty_like(g)
        fwd[(g.shape[0],)](g, u, o, g.shape[1], BLOCK=triton.next_power_of_2(g.shape[1]),
                           num_warps=16)
        return o
    return run


def swiglus(lg):
    n, i = 8192, 14336
    e = n * i * 2
    g = torch.randn(n, i, device=DEV, dtype=BF, requires_grad=True)
    u = torch.randn(n, i, device=DEV, dtype=BF, requires_grad=True)
    eager = lambda g, u: torch.nn.functional.silu(g) * u
    fwd_bwd("torch", "swiglu", eager, (g, u), (g, u), 3 * e, 5 * e)
    tr = triton_swiglu()
    if tr:
        gd, ud = g.detach(), u.detach()
        ref = torch.nn.functional.silu(gd.float()) * ud.float()
        if (tr(gd, ud).float() - ref).abs().max().item() > 0.05 * ref.abs().max().item():
            print("triton swiglu fwd : wrong result, not timed", flush=True)
        else:
            row("triton", "swiglu", "fwd", 3 * e, lambda: tr(gd, ud))
    if lg:
        fwd_bwd("liger", "swiglu", lg[3].LigerSiLUMulFunction.apply, (g, u), (g, u), 3 * e, 5 * e)


def main():
    src = torch.empty(1 << 28, device=DEV, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    row("torch", "copy", "f32", 2 * src.numel() * 4, lambda: dst.copy_(src))
    del src, dst
    lg = liger()
    norms(lg)
    ropes(lg)
    swiglus(lg)


if __name__ == "__main__":
    main()
