"""Where a zerogr decode's time goes, kernel by kernel, at the headline shapes.

    python -m zerogr_core.bench.profile_decode --shapes fp16:1,fp16:32,fp32:32 --out runs/results/profile-decode/headline.json

For each ``dtype:batch`` shape (search-like 19,269,255 SIDs, beam 128, H 1024 for fp16/bf16
and 4096 for fp32, as in the headline suite) the engine plans and captures the whole decode
in one CUDA graph, as ``bench --suite headline`` does. Then:

- the median of graph replays (CUDA events, ``zerogr_core.timing``);
- ``torch.profiler`` over a few replays: per decode, the kernels (and memsets) that ran, their
  summed GPU time, the time the GPU was busy with at least one of them (programmatic
  dependent launch lets neighbours overlap), and the span from the first start to the last
  end. ``span - busy`` is the time between kernels: launch latency and dependency waits;
- the same kernels grouped by name, largest first.

``--lists`` profiles the same shapes with per-request lists, built beforehand as the
constraints suite builds them (``bench --suite constraints``), so the tables show what the
constrained graph adds (the lists' share of the filter kernels, the row bitmap, the
catalog-normalised pass after projection):

    python -m zerogr_core.bench.profile_decode --shapes fp16:1,fp16:32 --scale 20000000 \
        --lists none,deny:0,deny:10000,deny-catalog:10000,allow:200000 --out runs/results/constraints/profile.json

``--quick`` decodes a 2,000-SID catalog at beam 4 on the CPU (no profile there), to check the script.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

HIDDEN = {"fp16": 1024, "bf16": 1024, "fp32": 4096}


def parse_shapes(text: str) -> list[tuple[str, int]]:
    shapes = []
    for part in text.split(","):
        dtype, _, batch = part.partition(":")
        if dtype not in HIDDEN or not batch.isdigit() or int(batch) < 1:
            raise SystemExit(f"profile_decode: --shapes: {part!r} is not DTYPE:BATCH with DTYPE in "
                             f"{', '.join(HIDDEN)} and BATCH >= 1")
        shapes.append((dtype, int(batch)))
    return shapes


LIST_KINDS = ("none", "deny", "deny-catalog", "allow")


def parse_lists(text: str) -> list[tuple[str, int]]:
    """``"none,deny:100,allow:200000"`` -> ``[("none", 0), ("deny", 100), ("allow", 200000)]``."""
    out = []
    for part in text.split(","):
        kind, _, count = part.partition(":")
        if kind == "none" and not count:
            out.append(("none", 0))
        elif kind in LIST_KINDS[1:] and count.isdigit():
            out.append((kind, int(count)))
        else:
            raise SystemExit(f"profile_decode: --lists: {part!r} is not 'none' or KIND:ROWS with KIND in "
                             f"{', '.join(LIST_KINDS[1:])}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="fp16:1,fp16:32,fp32:32", help="comma list of DTYPE:BATCH")
    p.add_argument("--reps", type=int, default=10, help="graph replays profiled per shape")
    p.add_argument("--top", type=int, default=30, help="kernel names kept per shape")
    p.add_argument("--scale", type=int, default=19_269_255, help="SIDs of the search-like catalog")
    p.add_argument("--lists", default="none",
                   help="comma list of per-request list conditions: none, or KIND:ROWS with KIND deny, "
                        "deny-catalog (catalog-normalised) or allow")
    p.add_argument("--quick", action="store_true", help="2,000 SIDs, beam 4, on the CPU, no profile")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.reps < 1 or args.top < 1:
        p.error(f"--reps and --top must be at least 1, got {args.reps} and {args.top}")
    shapes = parse_shapes(args.shapes)
    conditions = parse_lists(args.lists)
    if args.scale < 1:
        p.error(f"--scale must be at least 1, got {args.scale}")

    import numpy as np
    import torch

    from zerogr_core.environment import environment
    from zerogr_core.bench.kernel_profile import kernel_table
    from zerogr_core.bench.live import _random_lists
    from zerogr_core.bench.methods import ReplayModel, ZeroGRRunner
    from zerogr_core.bench.workload import CatalogSpec, Workload
    from zerogr_core.timing import summarize, time_runs

    cuda = torch.cuda.is_available() and not args.quick
    if not cuda and not args.quick:
        print("profile_decode: needs a CUDA GPU (or --quick)", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    spec = CatalogSpec("search-like", 2000 if args.quick else args.scale, 0, None)
    workload = Workload(spec, device)
    beam = 4 if args.quick else 128
    report = dict(command=shlex.join(["python", "-m", "zerogr_core.bench.profile_decode", *(argv or sys.argv[1:])]),
                  env=environment(device), catalog=spec.label, beam=beam, runs=[])
    for dtype, batch in shapes:
        hidden = 40 if args.quick else HIDDEN[dtype]
        ctx = workload.context(dtype, hidden, beam, batch, n_sets=1)
        runner = ZeroGRRunner(ctx.engine, ReplayModel(ctx.sets, batch), batch)
        runner.capture()
        rng = np.random.default_rng(0)
        for kind, count in conditions:
            if kind == "none":
                replay = runner.graph.replay if runner.graph is not None else runner.eager
            else:
                n_items = workload.catalog.n_items
                lists = _random_lists(n_items, batch, kind, min(count, n_items - 1), rng)
                model = ReplayModel(ctx.sets, batch)
                replay = (lambda lists=lists, model=model: ctx.engine.decode(model, batch, lists=lists))
            entry = _profiled(replay, device, cuda, args, kernel_table, summarize, time_runs)
            entry.update(dtype=dtype, hidden=hidden, batch=batch, lists=kind, listed_per_request=count,
                         graph=runner.graph is not None, plan=[s.option.label for s in runner.plan.steps])
            report["runs"].append(entry)
            print(f"{dtype}/H{hidden} batch {batch} lists {kind}:{count}: {entry['median_ms'] * 1e3:.1f} us; "
                  f"{entry.get('kernels_per_decode', '-')} kernels, busy {entry.get('busy_us', '-')} us, "
                  f"span {entry.get('span_us', '-')} us, gaps {entry.get('gap_us', '-')} us; "
                  f"plan {' '.join(entry['plan'])}", flush=True)
            for k in entry.get("kernels", [])[:15]:
                print(f"    {k['us']:8.1f} us {k['calls']:5.1f}x  {k['name'][:100]}", flush=True)
        runner.release()
        ctx.release()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def _profiled(replay, device, cuda: bool, args, kernel_table, summarize, time_runs) -> dict:
    """Median of ``replay`` calls, and on CUDA the kernel table of ``args.reps`` more."""
    import torch

    stats = summarize(time_runs(replay, device, warmup=5, repeats=5 if args.quick else 50))
    entry = dict(median_ms=stats["median_ms"])
    if cuda:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.reps):
                replay()
            torch.cuda.synchronize()
        entry.update(kernel_table(prof.events(), args.reps, args.top))
    return entry


if __name__ == "__main__":
    sys.exit(main())
