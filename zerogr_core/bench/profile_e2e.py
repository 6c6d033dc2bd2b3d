"""Where the end-to-end time of one shape goes: CUDA kernels of the model-only and ZeroGR decodes.

Profiles graph replays of ``bench-e2e``'s loop methods (T5, TIGER catalog) with
``torch.profiler`` and writes, per method and model dtype, the kernels grouped by name
with their total GPU time per decode, plus the median latency from CUDA events:

    python -m zerogr_core.bench.profile_e2e --batch 32 --beam 128 --dtype fp32,tf32,bf16 --out runs/results/e2e/profile.json

``tf32`` is the FP32 model with TF32 tensor-core matmuls allowed. ``--quick`` runs the
quick preset on the CPU (no kernel table there, just the run).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    import torch

    from zerogr_core.bench.e2e import E2EConfig, Workbench, build_catalog
    from zerogr_core.bench.kernel_profile import kernel_table
    from zerogr_core.environment import environment
    from zerogr_core.timing import summarize, time_runs

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--beam", type=int, default=128)
    p.add_argument("--dtype", default="fp32,tf32,bf16")
    p.add_argument("--methods", default="model-only,zerogr")
    p.add_argument("--prefill", default="inside", choices=("inside", "outside"))
    p.add_argument("--top", type=int, default=25, help="kernels listed per run")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="runs/results/e2e/profile.json")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    cfg = E2EConfig.preset("quick" if args.quick else "tiger")
    catalog = build_catalog(cfg, "tiger", 0, None)
    report = dict(command=shlex.join(["python", "-m", "zerogr_core.bench.profile_e2e", *sys.argv[1:]]),
                  env=environment(device),
                  batch=args.batch, beam=args.beam, prefill=args.prefill, runs=[])
    for name in args.dtype.split(","):
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        torch.backends.cudnn.allow_tf32 = name == "tf32"
        dtype = torch.bfloat16 if name == "bf16" else torch.float16 if name == "fp16" else torch.float32
        wb = Workbench(cfg, "t5", catalog, dtype, device, 0, args.prefill)
        ids, mask = wb.inputs(args.batch)
        for method in args.methods.split(","):
            run = wb.serving(method, args.beam)
            t = time.perf_counter()
            _, _, loop = run(ids, mask)
            first_s = time.perf_counter() - t
            stats = summarize(time_runs(lambda: run(ids, mask), device, warmup=3, repeats=30))
            entry = dict(dtype=name, method=method, loop=loop, first_call_s=round(first_s, 2),
                         median_ms=stats["median_ms"], kernels=[])
            if device.type == "cuda":
                from torch.profiler import ProfilerActivity, profile

                reps = 5
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(reps):
                        run(ids, mask)
                    torch.cuda.synchronize()
                entry.update(kernel_table(prof.events(), reps, args.top))
            report["runs"].append(entry)
            print(f"{name:5s} {method:11s} {stats['median_ms']:8.3f} ms  kernels "
                  f"{entry.get('kernels_per_decode', '-')} sum {entry.get('kernel_us_sum', '-')} us  ({loop})",
                  flush=True)
            for k in entry["kernels"][:12]:
                print(f"      {k['us']:9.1f} us {k['calls']:6.1f}x  {k['name'][:110]}", flush=True)
        del wb
        if device.type == "cuda":
            torch.cuda.empty_cache()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
