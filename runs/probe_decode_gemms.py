"""The Qwen3-1.7B decode step's weight GEMMs alone, on a GPU: cuBLAS's default choice against
the transposed orientation and against PyTorch's TunableOp (which, where the build supports it,
benchmarks every cuBLASLt algorithm the heuristic offers).

Each GEMM runs inside a CUDA graph of ``REPS`` calls that rotate over enough weight copies
(about 400 MB) that the weights come from HBM, as they do in a decode step; the figure is the
median per call over ``ROUNDS`` replays.

    python runs/probe_decode_gemms.py [ROWS,...]     # default 256,2048 (beam 256 at batch 1 and 8)
    python runs/probe_decode_gemms.py triton [ROWS]  # a split-K Triton GEMM's tile sweep against cuBLAS

The split-K GEMM writes float32 partial products (splits, M, N) that a consumer would sum (the
following norm or gate kernel); its time here is the GEMM kernel alone.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM = 2048, 6144, 16, 8, 128
SHAPES = {  # name: (out features N, in features K)
    "qkv": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
    "o": (HIDDEN, HEADS * HEAD_DIM),
    "gate_up": (2 * FFN, HIDDEN),
    "down": (HIDDEN, FFN),
}
REPS, ROUNDS, COPIES_BYTES = 16, 15, 400e6


def _graph_us(fn, reps: int) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(2):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            fn(i)
    times = []
    for _ in range(ROUNDS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(times)


@triton.jit
def _splitk_kernel(a_ptr, w_ptr, c_ptr, M, N, K, k_chunk,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m, pid_n, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k0 = s * k_chunk
    a = a_ptr + rm[:, None] * K + (k0 + rk)[None, :]
    w = w_ptr + rn[None, :] * K + (k0 + rk)[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for _ in range(0, k_chunk, BLOCK_K):
        acc = tl.dot(tl.load(a), tl.load(w), acc)
        a += BLOCK_K
        w += BLOCK_K
    tl.store(c_ptr + (s * M + rm)[:, None].to(tl.int64) * N + rn[None, :], acc)


def triton_sweep(rows: int) -> dict:
    dev, dt = torch.device("cuda"), torch.bfloat16
    res = {}
    for name, (n, k) in SHAPES.items():
        copies = max(2, int(COPIES_BYTES // (n * k * 2)))
        ws = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
        x = torch.randn(rows, k, device=dev, dtype=dt)
        base = _graph_us(lambda i: F.linear(x, ws[i % copies]), REPS)
        best = []
        for bm in (64, 128):
            for bn in (64, 128, 256):
                for bk in (64,):
                    for splits in (1, 2, 4, 8):
                        for warps, stages in ((4, 4), (8, 3)):
                            if bm * bn > 128 * 128 and warps == 4:
                                continue
                            if k % (splits * bk) or rows % bm or n % bn:
                                continue
                            c = torch.empty(splits, rows, n, device=dev, dtype=torch.float32)
                            grid = (rows // bm, n // bn, splits)

                            def fn(i, bm=bm, bn=bn, bk=bk, splits=splits, warps=warps, stages=stages, c=c, grid=grid):
                                _splitk_kernel[grid](x, ws[i % copies], c, rows, n, k, k // splits, BLOCK_M=bm,
                                                     BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
                            try:
                                us = _graph_us(fn, REPS)
                            except Exception as e:  # noqa: BLE001 (a config out of shared memory)
                                continue
                            if splits == 1:
                                ref = F.linear(x, ws[0]).float()
                                fn(0)
                                assert torch.allclose(c[0], ref, atol=2e-2, rtol=2e-2), (name, bm, bn, bk)
                            best.append((us, f"{bm}x{bn}x{bk} s{splits} w{warps} st{stages}"))
        best.sort()
        res[f"{name} M={rows} N={n} K={k}"] = {"cublas": base, "triton_best": best[:5]}
        print(name, rows, n, k, "cublas", round(base, 2), "triton", [(round(u, 2), c) for u, c in best[:5]], flush=True)
        del ws
    return res


def main(argv) -> int:
    if len(argv) > 1 and argv[1] == "triton":
        rows = int(argv[2]) if len(argv) > 2 else 256
        out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "rows": rows, "shapes": triton_sweep(rows)}
        dst = os.environ.get("OUT")
        if dst:
            with open(os.path.join(dst, f"decode-gemms-triton-{rows}.json"), "w") as f:
                json.dump(out, f, indent=1)
        return 0
    rows = [int(r) for r in (argv[1].split(",") if len(argv) > 1 else ("256", "2048"))]
    dev, dt = torch.device("cuda"), torch.bfloat16
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    for name, (n, k) in SHAPES.items():
        copies = max(2, int(COPIES_BYTES // (n * k * 2)))
        ws = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=dt)
            res = {}
            res["linear"] = _graph_us(lambda i: F.linear(x, ws[i % copies]), REPS)
            res["transposed"] = _graph_us(lambda i: torch.mm(ws[i % copies], x.t()), REPS)
            flops = 2.0 * m * n * k
            res["tflops_linear"] = flops / (res["linear"] * 1e-6) / 1e12
            res["weight_tbps_linear"] = n * k * 2 / (res["linear"] * 1e-6) / 1e12
            out["shapes"][f"{name} M={m} N={n} K={k}"] = res
            print(name, m, n, k, {a: round(b, 2) for a, b in res.items()}, flush=True)
        del ws
    # TunableOp: tune the same shapes, then time them again with the tuned choice
    tun = torch.cuda.tunable
    path = os.path.join(tempfile.mkdtemp(), "tunableop_results%d.csv")
    tun.enable(True)
    tun.tuning_enable(True)
    tun.set_filename(path)
    tun.set_max_tuning_duration(200)
    for name, (n, k) in SHAPES.items():
        copies = max(2, int(COPIES_BYTES // (n * k * 2)))
        ws = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=dt)
            F.linear(x, ws[0])
            torch.cuda.synchronize()
            tun.tuning_enable(False)
            us = _graph_us(lambda i: F.linear(x, ws[i % copies]), REPS)
            tun.tuning_enable(True)
            out["shapes"][f"{name} M={m} N={n} K={k}"]["tunableop"] = us
            print(name, m, "tunableop", round(us, 2), flush=True)
        del ws
    results = tun.get_results()
    out["tunableop_results"] = [list(map(str, r)) for r in results]
    print("tunableop results:", *results, sep="\n  ")
    dst = os.environ.get("OUT")
    if dst:
        with open(os.path.join(dst, "decode-gemms.json"), "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
