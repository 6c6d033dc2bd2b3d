"""The memsets in the Qwen3-1.7B prefill's graph, and ways around them, on a GPU.

A traced 1,000 × 1 call (``runs/results/llm/session-2026-12-04c/trace-gaps.txt``) has 55 memsets
inside the graph: 28 before the cuDNN attention and 27 before full-size GEMMs (by the counts, the
gate/up projection's). With the idle time around them they cost about 0.3 ms of the call. This
script runs each candidate form of those two operations alone, inside a CUDA graph, and prints
per call its median time (µs, ``zerogr_core.timing.median_us``), the memsets one replay holds,
and the GPU kernels' names.

    python runs/probe_prefill_memsets.py [ROWS,...]     # default 1024,5120 (context rows of batch 1)
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from zerogr_core.timing import capture, median_us

HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM = 2048, 6144, 16, 8, 128


def graph_events(fn) -> tuple[int, list[str]]:
    """Memsets of one call of ``fn`` replayed from a CUDA graph, and its kernels' names."""
    graph, _ = capture(fn)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    names = [ev.name for ev in prof.events() if ev.device_type.name == "CUDA"]
    return sum("emset" in n for n in names), sorted({n[:60] for n in names if "emset" not in n})


def report(label: str, fn) -> None:
    us = median_us(fn, "cuda")
    memsets, kernels = graph_events(fn)
    print(f"  {label:<44} {us:8.1f} µs  memsets {memsets}  {'; '.join(kernels)}", flush=True)


def gemms(rows: int) -> None:
    dt, dev = torch.bfloat16, "cuda"
    h = torch.randn(rows, HIDDEN, device=dev, dtype=dt)
    w = torch.randn(2 * FFN, HIDDEN, device=dev, dtype=dt) / HIDDEN ** 0.5
    wt = w.t().contiguous()
    y = torch.empty(rows, 2 * FFN, device=dev, dtype=dt)
    gate, up = w[:FFN], w[FFN:]
    qkv = torch.randn((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, device=dev, dtype=dt)
    print(f"gate/up GEMM, {rows} rows × {HIDDEN} → {2 * FFN}:")
    report("F.linear (the step model's call)", lambda: F.linear(h, w))
    report("torch.mm into a preallocated output", lambda: torch.mm(h, w.t(), out=y))
    report("weights stored (K, N): torch.mm(h, wt)", lambda: torch.mm(h, wt))
    report("gate and up as two GEMMs", lambda: (F.linear(h, gate), F.linear(h, up)))
    for lib in ("cublas", "cublaslt"):
        before = torch.backends.cuda.preferred_blas_library()
        try:
            torch.backends.cuda.preferred_blas_library(lib)
            report(f"F.linear, preferred BLAS {lib}", lambda: F.linear(h, w))
        finally:
            torch.backends.cuda.preferred_blas_library(before)
    # deterministic mode makes PyTorch set cuBLAS's atomics mode to "not allowed", so its heuristic
    # skips kernels that reduce split-K partial sums with atomics into a zeroed output
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        report("F.linear, cuBLAS atomics not allowed", lambda: F.linear(h, w))
    finally:
        torch.use_deterministic_algorithms(False)
    report("control: the q/k/v GEMM (no memset in the trace)", lambda: F.linear(h, qkv))


def attention(rows: int) -> None:
    dt, dev = torch.bfloat16, "cuda"
    y = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=dev, dtype=dt)
    kv = torch.randn(2, 1, rows, KV_HEADS, HEAD_DIM, device=dev, dtype=dt)
    q_view = y[:, :HEADS * HEAD_DIM].view(1, rows, HEADS, HEAD_DIM).transpose(1, 2)
    k_view, v_view = kv[0].transpose(1, 2), kv[1].transpose(1, 2)
    q_c, k_c, v_c = q_view.contiguous(), k_view.contiguous(), v_view.contiguous()
    k_x = k_c.repeat_interleave(HEADS // KV_HEADS, dim=1)
    v_x = v_c.repeat_interleave(HEADS // KV_HEADS, dim=1)
    print(f"causal attention, {rows} tokens, {HEADS} query and {KV_HEADS} KV heads of {HEAD_DIM}:")
    cases = {
        "cuDNN, the step model's views, GQA": (q_view, k_view, v_view, True),
        "cuDNN, contiguous (B, heads, T, D), GQA": (q_c, k_c, v_c, True),
        "cuDNN, KV heads repeated, no GQA": (q_c, k_x, v_x, False),
    }
    for label, (q, k, v, gqa) in cases.items():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            report(label, lambda q=q, k=k, v=v, gqa=gqa: F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=gqa))
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            report("cuDNN, the views, GQA, deterministic mode", lambda: F.scaled_dot_product_attention(
                q_view, k_view, v_view, is_causal=True, enable_gqa=True))
    finally:
        torch.use_deterministic_algorithms(False)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        report("flash, KV heads repeated", lambda: F.scaled_dot_product_attention(q_c, k_x, v_x, is_causal=True))


def main(argv) -> int:
    rows = [int(r) for r in (argv[1] if len(argv) > 1 else "1024,5120").split(",")]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, cuDNN {torch.backends.cudnn.version()}")
    with torch.no_grad():
        for r in rows:
            gemms(r)
            attention(r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
