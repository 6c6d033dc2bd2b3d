"""Does a decode GEMM run faster when its weight was brought into L2 while the kernel before it ran?

The Qwen3-1.7B decode step's four weight GEMMs (``probe_decode_gemms.SHAPES``), each after a kernel
that keeps the GPU busy without reading memory (``torch.cuda._sleep``: a stand-in for the attention,
norms and rotary kernels between the GEMMs), in a CUDA graph of ``REPS`` such pairs that rotate over
enough weight copies (about 400 MB) that each weight comes from HBM. Arms:

* ``cold``: the pair as the model runs it today;
* ``prefetch``: :func:`zerogr_kernels.prefetch_l2` of the weight on a side stream, forked as the
  busy kernel starts (what :mod:`zerogr_core.models.weight_prefetch` does in the model);
* ``hot``: one weight for every call (in L2 whenever it fits: the ceiling of what a prefetch can give);
* ``busy``: the busy kernel alone, subtracted from the others.

    python runs/probe_l2_prefetch.py [ROWS,...] [CYCLES,...]    # default 256,2048 and 0,4000,20000

One line per (GEMM, rows, busy cycles): each arm's µs per GEMM (busy time subtracted) and
prefetch / cold. ``OUT`` set: the lines as ``l2-prefetch.json`` there too.
"""
from __future__ import annotations

import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
import triton

from probe_decode_gemms import COPIES_BYTES, SHAPES
from zerogr_core.timing import time_graph
from zerogr_kernels.l2_prefetch import prefetch_l2

REPS, REPEATS = 16, 15


def _pairs(arm: str, x, ws, cycles: int, side):
    def fn():
        cur = torch.cuda.current_stream()
        for i in range(REPS):
            w = ws[0] if arm == "hot" else ws[i % len(ws)]
            if arm == "prefetch":
                side.wait_stream(cur)
                with torch.cuda.stream(side):
                    prefetch_l2(w)
            if cycles:
                torch.cuda._sleep(cycles)
            if arm != "busy":
                F.linear(x, w)
        if arm == "prefetch":
            cur.wait_stream(side)
    return fn


def main(argv) -> int:
    if not torch.cuda.is_available():
        sys.exit("probe_l2_prefetch: needs a CUDA GPU")
    rows = [int(r) for r in (argv[1] if len(argv) > 1 else "256,2048").split(",")]
    cycles_list = [int(c) for c in (argv[2] if len(argv) > 2 else "0,4000,20000").split(",")]
    dev, dt = torch.device("cuda"), torch.bfloat16
    side = torch.cuda.Stream()
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "reps": REPS, "repeats": REPEATS, "lines": []}
    print(out["gpu"], out["torch"], out["triton"], flush=True)
    for name, (n, k) in SHAPES.items():
        copies = max(2, int(COPIES_BYTES // (n * k * 2)))
        ws = [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=dt)
            for cycles in cycles_list:
                us = {}
                for arm in ("busy", "cold", "prefetch", "hot"):
                    ms = time_graph(_pairs(arm, x, ws, cycles, side), dev, repeats=REPEATS)
                    us[arm] = statistics.median(ms) * 1e3 / REPS
                line = {"gemm": name, "rows": m, "n": n, "k": k, "busy_cycles": cycles, "busy_us": us["busy"]}
                line.update({arm: us[arm] - us["busy"] for arm in ("cold", "prefetch", "hot")})
                line["prefetch_over_cold"] = line["prefetch"] / line["cold"]
                line["hot_over_cold"] = line["hot"] / line["cold"]
                out["lines"].append(line)
                print(f"{name:8s} M={m:5d} busy {cycles:6d} cycles ({us['busy']:.2f} us): cold {line['cold']:.2f} "
                      f"prefetch {line['prefetch']:.2f} hot {line['hot']:.2f} us; prefetch/cold "
                      f"{line['prefetch_over_cold']:.3f}, hot/cold {line['hot_over_cold']:.3f}", flush=True)
        del ws
        torch.cuda.empty_cache()
    dst = os.environ.get("OUT")
    if dst:
        with open(os.path.join(dst, "l2-prefetch.json"), "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
