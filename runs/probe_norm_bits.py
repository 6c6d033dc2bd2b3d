"""Do the Qwen3 step model's fused kernels round bit for bit as Hugging Face's eager ops do, on a
GPU, in bf16? And what does summing in eager PyTorch's order cost? From the repository root:

    python runs/probe_norm_bits.py

Prints, for each kernel, the share of output elements equal to its PyTorch reference (the eager
ops), at the Qwen3-1.7B shapes of a prefill (1,000 rows) and a decode step (256 rows). Then the
variance's sum alone against ``x.float().pow(2).mean(-1)``, in the shipped order and in candidate
orders (to find torch's, should it change), and Triton's rsqrt against torch's. Then each norm
kernel's GPU time (20 calls captured in a CUDA graph, median replay) with the sum in eager order,
in each layout of ``zerogr_kernels.row_sums`` (``IMPL`` 3: the q/k kernel's heads summed from the halves it
holds, ``halves_sum_squares``; 2 and 1: ``sum_squares``), against Triton's tree (0); and the residual norm
in eager order at other rows and warps a program.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

import zerogr_kernels.rms_norm as rms_norm
import zerogr_kernels.row_sums as row_sums
from zerogr_kernels.head_norm_rope import qk_norm_rope_reference, qk_norm_rope_triton
from zerogr_kernels.rms_norm import rms_layer_norm_reference, rms_layer_norm_triton
from zerogr_kernels.row_sums import row_sum_squares_reference, row_sum_squares_triton
from zerogr_kernels.swiglu import silu_mul_reference, silu_mul_triton


def same(a, b) -> str:
    eq = (a == b) | (torch.isnan(a) & torch.isnan(b))
    return f"{eq.float().mean().item():.4%} equal"


def tree(v, descending=False):
    while v.shape[-1] > 1:
        h = v.shape[-1] // 2
        v = v[..., :h] + v[..., h:] if descending else v[..., 0::2] + v[..., 1::2]
    return v[..., 0]


def candidate(sq, vec, descending=False):
    """Sum of squares: 32 threads, `vec`-wide loads (vec 1: 4 strided accumulators), a warp tree."""
    n, d = sq.shape
    if vec > 1:
        parts = sq.view(n, d // (32 * vec), 32, vec)
        s = parts[:, 0]
        for k in range(1, parts.shape[1]):
            s = s + parts[:, k]
        lanes = s[..., 0]
        for i in range(1, vec):
            lanes = lanes + s[..., i]
    else:
        parts = sq.view(n, d // 128, 4, 32)
        s = parts[:, 0]
        for k in range(1, parts.shape[1]):
            s = s + parts[:, k]
        lanes = ((s[:, 0] + s[:, 1]) + s[:, 2]) + s[:, 3]
    return tree(lanes, descending)


@triton.jit
def _rsqrts(v_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    v = tl.load(v_ptr + i, mask=ok, other=1.0)
    tl.store(out_ptr + i, tl.math.rsqrt(v), mask=ok)
    tl.store(out_ptr + n + i, libdevice.rsqrt(v), mask=ok)
    tl.store(out_ptr + 2 * n + i, tl.math.div_rn(1.0, tl.math.sqrt_rn(v)), mask=ok)


def graphed(fn, calls=20, replays=50) -> float:
    """GPU time per call of ``fn``: ``calls`` calls captured in one CUDA graph, replays timed."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[replays // 2] * 1000 / calls


def main() -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    bf = torch.bfloat16
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(bf)

    print("== kernels against their eager references (bitwise) ==")
    w = randn(2048, scale=0.1) + 1
    for n in (1000, 256, 8):
        x, r = randn(n, 2048, scale=3), randn(n, 2048, scale=3)
        o1, o2 = rms_layer_norm_triton(x, w, 1e-6), rms_layer_norm_reference(x, w, 1e-6)
        (p1, s1), (p2, s2) = rms_layer_norm_triton(x, w, 1e-6, r), rms_layer_norm_reference(x, w, 1e-6, r)
        print(f"rms_layer_norm {n}x2048: {same(o1, o2)}; with residual: out {same(p1, p2)}, sum {same(s1, s2)}")
    qw, kw = randn(128, scale=0.1) + 1, randn(128, scale=0.1) + 1
    for n in (1000, 256):
        q, k = randn(n, 16, 128, scale=2), randn(n, 8, 128, scale=2)
        ang = torch.arange(n, device=dev, dtype=torch.float32)[:, None] * torch.logspace(0, -6, 128, device=dev)[None]
        cos, sin = ang.cos().to(bf), ang.sin().to(bf)
        a, b = qk_norm_rope_triton(q, k, qw, kw, 1e-6, cos, sin), qk_norm_rope_reference(q, k, qw, kw, 1e-6, cos, sin)
        print(f"qk_norm_rope {n} tokens: q {same(a[0], b[0])}, k {same(a[1], b[1])}")
    # which part of qk_norm_rope parts it from its reference: the norm alone (cos 1, sin 0), and the
    # rotation's roundings (each product rounded to bf16, as eager; or one rounding of the fp32 sum)
    n = 1000
    q, k = randn(n, 16, 128, scale=2), randn(n, 8, 128, scale=2)
    ones, zeros = torch.ones(n, 128, device=dev, dtype=bf), torch.zeros(n, 128, device=dev, dtype=bf)
    a, b = qk_norm_rope_triton(q, k, qw, kw, 1e-6, ones, zeros), qk_norm_rope_reference(q, k, qw, kw, 1e-6, ones, zeros)
    print(f"qk_norm_rope, norm alone (cos 1, sin 0): q {same(a[0], b[0])}, k {same(a[1], b[1])}")
    ang = torch.arange(n, device=dev, dtype=torch.float32)[:, None] * torch.logspace(0, -6, 128, device=dev)[None]
    cos, sin = ang.cos().to(bf), ang.sin().to(bf)
    y = b[0]                                          # the normed, weighted q (rotation by 0)
    mine = qk_norm_rope_triton(q, k, qw, kw, 1e-6, cos, sin)[0]
    rot = torch.cat([-y[..., 64:], y[..., :64]], dim=-1)
    eager = y * cos[:, None] + rot * sin[:, None]
    fused = (y.float() * cos[:, None].float() + rot.float() * sin[:, None].float()).to(bf)
    print(f"qk_norm_rope q against rotations of the reference's norm: eager roundings {same(mine, eager)}, "
          f"one rounding {same(mine, fused)}; eager against one rounding {same(eager, fused)}")
    for n in (1000, 256):
        gu = randn(n, 2 * 6144, scale=2)
        print(f"silu_mul {n}x6144: {same(silu_mul_triton(gu), silu_mul_reference(gu))}")

    print("== the variance's sum against x.float().pow(2).mean(-1) (bitwise) ==")
    for n, d in ((1000, 2048), (256, 2048), (1, 2048), (16000, 128), (8, 128), (1000, 1024), (1000, 64)):
        x = randn(n, d, scale=3)
        torch_mean = x.float().pow(2).mean(-1)
        line = [f"{n}x{d}: shipped kernel {same(row_sum_squares_triton(x) * (1.0 / d), torch_mean)}",
                f"its reference {same(row_sum_squares_reference(x) * (1.0 / d), torch_mean)}",
                f"tree sum {same(x.float().pow(2).sum(-1) * (1.0 / d), torch_mean)}"]
        sq = x.float().pow(2)
        for vec in (1, 2, 4, 8):
            if d % (32 * max(vec, 4)) == 0:
                for desc in (False, True):
                    line.append(f"vec {vec}{' desc' if desc else ''} {same(candidate(sq, vec, desc) * (1.0 / d), torch_mean)}")
        print("; ".join(line), flush=True)

    print("== rsqrt: Triton's against torch.rsqrt (bitwise) ==")
    v = torch.rand(1 << 20, device=dev, generator=g) * 20 + 1e-3
    out = torch.empty(3 << 20, device=dev)
    _rsqrts[(v.numel() // 1024,)](v, out, v.numel(), BLOCK=1024)
    want = torch.rsqrt(v)
    for i, name in enumerate(("tl.math.rsqrt", "libdevice.rsqrt", "1 / sqrt_rn (div_rn)")):
        print(f"{name}: {same(out[i << 20:(i + 1) << 20], want)}")
    print(f"torch: 1 / torch.sqrt against torch.rsqrt {same(1 / torch.sqrt(v), want)}", flush=True)

    print("== GPU time of 20 calls in a CUDA graph, per call (µs, median of 50 replays): the sum in eager "
          "order (IMPL 3: q/k heads summed from their halves in registers, rms as shipped; IMPL 2, IMPL 1) against "
          "Triton's tree (0) ==")
    for n in (1000, 256, 8):
        x, r = randn(n, 2048, scale=3), randn(n, 2048, scale=3)
        q, k = randn(n, 16, 128, scale=2), randn(n, 8, 128, scale=2)
        cos = sin = randn(n, 128)
        line = []
        for impl in (row_sums.HALVES, 2, 1, 0):
            row_sums.IMPL = impl
            a, b = rms_layer_norm_triton(x, w, 1e-6, r), qk_norm_rope_triton(q, k, qw, kw, 1e-6, cos, sin)
            ok = "" if impl == 0 else (f" (bitwise: rms {same(a[0], rms_layer_norm_reference(x, w, 1e-6, r)[0])}, "
                                        f"qk {same(b[0], qk_norm_rope_reference(q, k, qw, kw, 1e-6, cos, sin)[0])})")
            line.append(f"IMPL {impl}: rms+residual {graphed(lambda: rms_layer_norm_triton(x, w, 1e-6, r)):.2f}, "
                        f"qk_norm_rope {graphed(lambda: qk_norm_rope_triton(q, k, qw, kw, 1e-6, cos, sin)):.2f}{ok}")
        row_sums.IMPL = None
        print(f"{n} rows: " + "; ".join(line), flush=True)
        # rows and warps per program of the residual norm in eager order (the launcher takes 1 row and 4
        # warps at this width below rms_norm.MANY_ROWS rows, 4 rows and 8 warps from there)
        line = []
        for rows, warps in ((1, 4), (2, 2), (4, 4), (8, 8), (4, 8)):
            def launch():
                out, tot = torch.empty_like(x), torch.empty_like(x)
                rms_norm._rms_norm_kernel[(triton.cdiv(n, rows),)](
                    x, r, w, out, tot, n, 2048, 1.0 / 2048, 1e-6, HAS_RES=True, ROUND_W=True, EAGER=2, ROWS=rows,
                    BLOCK_D=2048, num_warps=warps, enable_fp_fusion=False)
                return out
            ok = same(launch(), rms_layer_norm_reference(x, w, 1e-6, r)[0])
            line.append(f"{rows} rows / {warps} warps: {graphed(launch):.2f} ({ok})")
        print(f"{n} rows, rms+residual in eager order by rows and warps a program: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
