"""The gate/up GEMM with SwiGLU's gate in its epilogue (:func:`zerogr_kernels.gate_up_silu`) against
cuBLAS's GEMM + :func:`zerogr_kernels.silu_mul`, alone, on a GPU: which tiling, from how many rows.

    python runs/probe_gate_up.py [ROWS,...]     # default 256,1000,2048,8000,40000

Qwen3-1.7B's MLP (hidden 2,048, F 6,144), bfloat16, random weights of standard deviation 0.02 (a
trained layer's scale) and unit-variance rows (as the RMS norm before the MLP leaves them). Each arm
is a CUDA graph of ``REPS`` calls that rotate over ``X_COPIES`` inputs and ``W_COPIES`` weights (a
model's layers each read their own weight, about 50 MB, an H100's whole L2), captured and replayed by
:func:`zerogr_core.timing.time_graph` (warm-up on a side stream, CUDA events around each replay); the
figure is the median replay over ``ROUNDS``, per call.

Arms: ``cublas`` (``F.linear`` then ``silu_mul``, as shipped), every preset of
:data:`~zerogr_kernels.gated_projection.TILINGS` (``*`` marks the one the launcher picks for the row
count) and the candidates of :func:`candidates`. One line per (rows, arm): microseconds per call,
ratio to cuBLAS, TFLOP/s (``2 · rows · 2,048 · 12,288`` per call), the largest difference to the cuBLAS
path's output and the fraction of outputs with its bits. A tiling that fails to compile or launch
prints one line and is skipped. With ``$OUT`` set, the figures also go to ``$OUT/gate-up.json``.
"""
from __future__ import annotations

import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

HIDDEN, FFN = 2048, 6144
REPS, ROUNDS, X_COPIES, W_COPIES = 20, 10, 3, 4
DEFAULT_ROWS = (256, 1000, 2048, 8000, 40000)
USAGE = "usage: python runs/probe_gate_up.py [ROWS,...]  (positive row counts, e.g. 256,1000,2048,8000,40000)"


def candidates():
    """Extra tilings beside the presets, each within sm_90's 227 KiB of shared memory
    (``stages · (BM·BK + 2·BK·BN) · 2`` bytes) and, compiled offline with ptxas 12.8, free of
    register spills. Left out for spilling there: 128×256×64 and 256×128×64 at 8 warps (two
    accumulators of 32 K floats over 256 threads), 128×128×64 at 4 warps, and any of them at 16
    warps (Triton then caps a thread at 128 registers); 128×256×64 with 3 stages also needs 240 KiB."""
    from zerogr_kernels.gated_projection import GateUpTiling as T

    return {
        "128x128x64 w8 s3": T(128, 128, 64, group_m=8, num_warps=8, num_stages=3),      # large, one stage less
        "128x128x128 w8 s2": T(128, 128, 128, group_m=8, num_warps=8, num_stages=2),    # longer K steps
        "128x64x64 w4 s4": T(128, 64, 64, group_m=8, num_warps=4, num_stages=4),        # a 128 × 128 GEMM tile
        "64x256x64 w8 s3": T(64, 256, 64, group_m=8, num_warps=8, num_stages=3),        # 216 KiB
        "256x64x64 w8 s4": T(256, 64, 64, group_m=8, num_warps=8, num_stages=4),        # tall
        "64x64x64 w4 s4": T(64, 64, 64, group_m=8, num_warps=4, num_stages=4),          # 96 KiB: two programs an SM
        "64x128x64 w4 s3": T(64, 128, 64, group_m=8, num_warps=4, num_stages=3),        # small, one stage less
        "128x128x64 w8 s4 g16": T(128, 128, 64, group_m=16, num_warps=8, num_stages=4),  # wider L2 groups
    }


def parse_rows(argv) -> list[int]:
    """Row counts from ``argv[1]`` (comma-separated positive integers) or the default; exits on bad input."""
    if len(argv) > 2:
        sys.exit(USAGE)
    if len(argv) < 2:
        return list(DEFAULT_ROWS)
    try:
        rows = [int(r) for r in argv[1].split(",")]
    except ValueError:
        sys.exit(f"probe_gate_up.py: bad ROWS {argv[1]!r}; {USAGE}")
    if not rows or min(rows) < 1:
        sys.exit(f"probe_gate_up.py: bad ROWS {argv[1]!r}; {USAGE}")
    return rows


def _per_call_us(fn, device) -> float:
    """Median µs per call of ``fn`` (which makes ``REPS`` calls) over ``ROUNDS`` graph replays."""
    from zerogr_core.timing import time_graph

    return statistics.median(time_graph(fn, device, repeats=ROUNDS, warmup=3)) * 1e3 / REPS


def probe(rows: int, ws, arms: dict, device) -> dict:
    """Every arm at ``rows`` rows: one printed line each; returns their figures."""
    from zerogr_kernels.gated_projection import choose_tiling, gate_up_silu_triton
    from zerogr_kernels.swiglu import silu_mul

    xs = [torch.randn(rows, HIDDEN, device=device, dtype=ws[0].dtype) for _ in range(X_COPIES)]
    flops = 2.0 * rows * HIDDEN * 2 * FFN

    def unfused(x, w):
        return silu_mul(F.linear(x, w))

    want = unfused(xs[0], ws[0])
    results = {}
    base = None
    for arm, tiling in {"cublas": None, **arms}.items():
        op = unfused if arm == "cublas" else (lambda x, w, t=tiling: gate_up_silu_triton(x, w, t))
        try:
            got = op(xs[0], ws[0])          # compiles outside the capture, where a failure is clean
            torch.cuda.synchronize()

            def calls():
                for i in range(REPS):
                    op(xs[i % X_COPIES], ws[i % W_COPIES])

            us = _per_call_us(calls, device)
        except Exception as exc:  # noqa: BLE001 - a tiling out of shared memory or registers: report, go on
            first = (str(exc).strip().splitlines() or [""])[0][:160]
            print(f"{rows:6d} rows  {arm:34s} skipped: {type(exc).__name__}: {first}", flush=True)
            torch.cuda.synchronize()
            continue
        base = base or us
        diff = (got.float() - want.float()).abs().max().item()
        same = (got == want).float().mean().item()
        chosen = tiling is not None and tiling == choose_tiling(rows)
        results[arm] = dict(tiling=str(tiling) if tiling else "cublas+silu_mul", chosen=chosen, us=us,
                            ratio=us / base, tflops=flops / (us * 1e-6) / 1e12, max_abs_diff=diff, bit_equal=same)
        label = arm + (" *" if chosen else "")
        print(f"{rows:6d} rows  {label:34s} {us:9.1f} us  {us / base:6.3f}x cublas  "
              f"{results[arm]['tflops']:6.1f} TFLOP/s  max|d| {diff:.3g}  bit-equal {same:.4f}", flush=True)
    del xs, want
    torch.cuda.empty_cache()
    return results


def main(argv) -> int:
    rows = parse_rows(argv)
    if not torch.cuda.is_available():
        sys.exit("probe_gate_up.py: needs a CUDA GPU (torch.cuda.is_available() is False)")
    import triton

    from zerogr_kernels.gated_projection import TILINGS

    device = torch.device("cuda")
    torch.manual_seed(0)
    ws = [torch.randn(2 * FFN, HIDDEN, device=device, dtype=torch.bfloat16) * 0.02 for _ in range(W_COPIES)]
    arms = {**{f"{name} {t}": t for name, t in TILINGS.items()}, **candidates()}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"x (rows, {HIDDEN}) @ [gate; up] ({2 * FFN}, {HIDDEN}) bfloat16, {REPS} calls a graph", flush=True)
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "hidden": HIDDEN, "ffn": FFN, "rows": {}}
    for n in rows:
        out["rows"][str(n)] = probe(n, ws, arms, device)
    dst = os.environ.get("OUT")
    if dst:
        with open(os.path.join(dst, "gate-up.json"), "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
