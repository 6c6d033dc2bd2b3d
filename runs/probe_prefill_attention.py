"""The Qwen3-1.7B prefill's causal attention through each SDPA backend, on a GPU.

The layout is the step model's: queries (B, 16, T, 128) from the fused projection, keys and
values the (B, T, 8, 128) cache viewed as (B, 8, T, 128), grouped-query attention. Times are
medians of CUDA-graph replays of 10 calls, in microseconds per call, with the largest
difference to the math backend in float32.

    python runs/probe_prefill_attention.py
"""
from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

H, KVH, D = 16, 8, 128
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def _us(fn) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    times = []
    for _ in range(15):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 100)
    return statistics.median(times)


def main() -> None:
    dev, dt = "cuda", torch.bfloat16
    for b, t in ((1, 1024), (8, 1024), (1, 5120), (8, 5120)):
        q = torch.randn(b, t, H, D, device=dev, dtype=dt).transpose(1, 2)
        kv = torch.randn(2, b, t, KVH, D, device=dev, dtype=dt)
        k, v = kv[0].transpose(1, 2), kv[1].transpose(1, 2)
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
        row = []
        for name, backend in BACKENDS.items():
            try:
                with sdpa_kernel([backend]):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
                    err = (fn().float() - want).abs().max().item()
                    row.append(f"{name} {_us(fn):.1f} us (err {err:.3g})")
            except Exception as e:  # noqa: BLE001 (a backend that refuses the shape)
                row.append(f"{name} refused ({type(e).__name__}: {str(e)[:80]})")
        with torch.no_grad():
            fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
            row.append(f"default {_us(fn):.1f} us")
        print(f"B={b} T={t}: " + "; ".join(row), flush=True)


if __name__ == "__main__":
    main()
