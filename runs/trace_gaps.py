"""Where a traced call's GPU sat idle: reads a Chrome trace of one call (``torch.profiler``'s
``export_chrome_trace``, plain or gzipped, e.g. from ``runs/host_llm_e2e.py 1000x1 TRACE``) and prints

- the host's runtime calls longer than 5 µs, from the trace's start;
- the GPU's span, busy time and idle time from the last ``cudaGraphLaunch`` on (the graph's
  replay; from the first GPU event when the trace has no graph launch);
- the idle stretches (``zerogr_core.bench.kernel_profile.idle_stretches``) summed per pair of the
  events around them, widest first.

    python runs/trace_gaps.py runs/results/llm/session-2026-12-04c/trace-1000x1.json.gz [--top 20]
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
from types import SimpleNamespace

from zerogr_core.bench.kernel_profile import idle_stretches, union_us


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args(argv)
    try:
        events = load(args.trace)
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"error: {args.trace}: not a readable Chrome trace ({type(exc).__name__}: {exc})")
    if not any(e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") for e in events):
        raise SystemExit(f"error: {args.trace}: the trace holds no GPU events")
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
    intervals = [(e["ts"], e["ts"] + e["dur"]) for e in part]
    span = max(end for _, end in intervals) - intervals[0][0]
    busy = union_us(intervals)
    pairs = collections.defaultdict(lambda: [0, 0.0])
    stretches = idle_stretches([SimpleNamespace(name=e["name"], time_range=SimpleNamespace(start=s, end=t))
                                for e, (s, t) in zip(part, intervals)])
    for g in stretches:
        key = f"{g['after'][:45]} -> {g['before'][:45]}"
        pairs[key][0] += 1
        pairs[key][1] += g["us"]
    memsets = [e for e in part if e.get("cat") == "gpu_memset"]
    print(f"from the graph on: {len(part)} GPU events, span {span:.1f} µs, busy {busy:.1f} µs, "
          f"idle {span - busy:.1f} µs; {len(memsets)} memsets, {sum(e['dur'] for e in memsets):.1f} µs")
    print("idle µs, times, before -> after:")
    for key, (n, us) in sorted(pairs.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"  {us:8.1f} {n:4d}  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
