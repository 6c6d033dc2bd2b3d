"""Where a traced call's GPU sat idle: reads a Chrome trace of one call (``torch.profiler``'s
``export_chrome_trace``, plain or gzipped, e.g. from ``runs/host_llm_e2e.py 1000x1 TRACE``) and prints

- the host's runtime calls longer than 5 µs, from the trace's start;
- the GPU's span, kernel time and idle time from ``--from``'s GPU event on (default the first
  event of a CUDA graph's replay: the first GPU event after the last ``cudaGraphLaunch`` began);
- the idle time between neighbouring GPU events summed per (before → after) pair of names, widest first.

    python runs/trace_gaps.py runs/results/llm/session-2026-12-04c/trace-1000x1.json.gz [--top 20]
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args(argv)
    events = load(args.trace)
    t0 = min(e["ts"] for e in events)
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    runtime = sorted((e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")), key=lambda e: e["ts"])
    print("host runtime calls over 5 µs (start µs, duration µs, name):")
    for e in runtime:
        if e["dur"] > 5:
            print(f"  {e['ts'] - t0:9.1f} {e['dur']:9.1f}  {e['name']}")
    launches = [e["ts"] for e in runtime if e["name"] == "cudaGraphLaunch"]
    start = launches[-1] if launches else gpu[0]["ts"]
    part = [e for e in gpu if e["ts"] >= start]
    if launches:
        print(f"first GPU event after the graph's launch began: {part[0]['ts'] - start:.1f} µs later")
    span = part[-1]["ts"] + part[-1]["dur"] - part[0]["ts"]
    busy = sum(e["dur"] for e in part)
    pairs = collections.defaultdict(lambda: [0, 0.0])
    idle = 0.0
    for a, b in zip(part, part[1:]):
        gap = b["ts"] - (a["ts"] + a["dur"])
        if gap > 0:
            idle += gap
            key = f"{a['name'][:45]} -> {b['name'][:45]}"
            pairs[key][0] += 1
            pairs[key][1] += gap
    memsets = [e for e in part if e.get("cat") == "gpu_memset"]
    print(f"from the graph on: {len(part)} GPU events, span {span:.1f} µs, their time {busy:.1f} µs, "
          f"idle between them {idle:.1f} µs; {len(memsets)} memsets, {sum(e['dur'] for e in memsets):.1f} µs")
    print("idle µs, times, before -> after:")
    for key, (n, us) in sorted(pairs.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"  {us:8.1f} {n:4d}  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
