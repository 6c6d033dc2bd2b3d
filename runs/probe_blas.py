"""Does another BLAS library shorten the Qwen3 recommender's call? An A/B in one process.

    python runs/probe_blas.py [SHAPES] [ROUNDS]      (on a GPU; SHAPES like 1000x1,1000x8, ROUNDS 2)

The LLM benchmark's workload (Qwen3-1.7B shape, random bf16 weights, the 10^7-item catalog, beam
256, filtering first, prefill inside the graph) is built once; then, round after round, each
setting of ``torch.backends.cuda.preferred_blas_library`` (cuBLAS, cuBLASLt) gets a fresh serving,
captured under that setting, and its end-to-end call is timed as the benchmark times it (CUDA
events, warm-up, rotated inputs, median). A line per round and setting, then the medians of the
rounds and the ratio to cuBLAS.
"""
import statistics
import sys
import time

import torch

from zerogr_core.bench.llm import LLM_PRESETS, Workload, _timed


def main() -> None:
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1] if len(sys.argv) > 1 else "1000x1,1000x8").split(",")]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    cfg = LLM_PRESETS["h200"]
    w = Workload(cfg, lambda m: print(m, flush=True))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    got = {}
    for r in range(rounds):
        for lib in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(lib)
            for context, batch in shapes:
                sets = [w.inputs(batch, context, 1000 * batch + context + i) for i in range(cfg.rotations)]
                run = w.serving("filter-first", "auto", cfg.beam)
                cur = {"i": 0}
                t0 = time.perf_counter()
                ms = _timed(lambda: run.decode(sets[cur["i"]]).item_rows.cpu(), w.device, cfg,
                            lambda i: cur.update(i=i % len(sets)))
                got.setdefault((context, batch, lib), []).append(ms)
                print(f"round {r} {lib:9s} {context}x{batch}: {ms:.3f} ms ({time.perf_counter() - t0:.0f} s with capture)",
                      flush=True)
                del run
                torch.cuda.empty_cache()
    torch.backends.cuda.preferred_blas_library("cublas")
    for context, batch in shapes:
        base = statistics.median(got[(context, batch, "cublas")])
        lt = statistics.median(got[(context, batch, "cublaslt")])
        print(f"{context}x{batch}: cuBLAS {base:.3f} ms, cuBLASLt {lt:.3f} ms ({lt / base:.3f}x)", flush=True)


if __name__ == "__main__":
    main()
