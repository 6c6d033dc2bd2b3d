"""The ``coldstart`` suite: seconds to the first decode of a shape in a fresh process.

Per shape, two new processes run one after the other, sharing a cache folder that starts
empty (``ZEROGR_CACHE_DIR`` with the plan store, ``TRITON_CACHE_DIR`` under it):

* ``cold``: nothing planned, nothing compiled — the first decode plans (cost model, parallel
  compile, timing), compiles the plan's kernels and captures the CUDA graph;
* ``warm``: the plan comes from the store and every kernel from Triton's disk cache.

Each child (``python -m zerogr_core.bench.coldstart``) builds the catalog and index first,
outside the measurement, then times its first decode with a synchronised stopwatch, and
prints one JSON line. Targets: ≤ 30 s cold, ≤ 10 s warm.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from ..arg_types import SEED_MAX, whole
from ..decode.work_limits import MAX_HIDDEN
from ..devices import device_arg, resolved

COLD_TARGET_S, WARM_TARGET_S = 30.0, 10.0
PHASES = ("cold", "warm")


def first_decode(source: str, scale, seed: int, codebook, dtype_name: str, hidden: int, beam: int, batch: int,
                 device: str) -> dict:
    """In this process: catalog and index, then the first (and a second) decode of one shape."""
    import torch

    from ..decode.engine import GpuEngine
    from ..timing import Stopwatch
    from .methods import ReplayModel
    from .workload import CatalogSpec, Workload

    dev = torch.device(device)
    t0 = time.perf_counter()
    wl = Workload(CatalogSpec(source, scale, seed, codebook), dev)
    ctx = wl.context(dtype_name, hidden, beam, batch, n_sets=1)  # the headline suite's heads and hidden states
    hidden_fn = ReplayModel(ctx.sets, batch)
    setup_s = time.perf_counter() - t0
    with Stopwatch(dev) as first:  # a serving engine: the default plan store and Triton cache
        engine = GpuEngine(wl.index, ctx.heads, beam, use_graph=dev.type == "cuda")
        engine.decode(hidden_fn, batch)
    with Stopwatch(dev) as second:
        engine.decode(hidden_fn, batch)
    plan = engine.plans[engine.key(batch)]
    return dict(first_decode_s=first.seconds, second_decode_ms=second.ms, setup_s=setup_s,
                plan_source=plan.source, graph_error=engine.graph_error,
                plan_modes="/".join(f"{s.option.mode}:{s.option.topk}" for s in plan.steps),
                options_timed=sum(len(s.times_us) + len(s.failed) for s in plan.steps),
                options_skipped=sum(len(s.skipped) for s in plan.steps),
                plan_file=str(engine.plan_store.path(engine.plan_key(batch))) if engine.plan_store else None,
                triton_cache=os.environ.get("TRITON_CACHE_DIR"),
                **{k: v for k, v in wl.fields.items()  # the catalog statistics every record carries
                   if k not in ("catalog", "catalog_label", "scale", "codebook", "catalog_stats")})


def run_child(spec, dtype_name: str, hidden: int, beam: int, batch: int, device, cache_dir: str,
              timeout_s: float) -> dict:
    """:func:`first_decode` in a fresh process whose caches live under ``cache_dir``."""
    env = dict(os.environ, ZEROGR_CACHE_DIR=cache_dir, TRITON_CACHE_DIR=os.path.join(cache_dir, "triton"),
               PYTHONUNBUFFERED="1")
    env.pop("ZEROGR_PLAN_STORE", None)
    args = [sys.executable, "-m", "zerogr_core.bench.coldstart", "--catalog", spec.source, "--seed", str(spec.seed),
            "--dtype", dtype_name, "--hidden", str(hidden), "--beam", str(beam), "--batch", str(batch),
            "--device", str(device)]
    if spec.scale is not None:
        args += ["--scale", str(spec.scale)]
    if spec.codebook is not None:
        args += ["--codebook", str(spec.codebook)]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"first-decode process exited with {done.returncode}: {tail}")
    return dict(json.loads(lines[-1]), process_s=wall)


def suite_coldstart(s, suite: str) -> None:
    """First-decode seconds of every shape, cold then warm (see the module docstring)."""
    st = s.settings(suite)
    spec = s.spec(st["catalog"])
    for beam in st["beams"]:
        for dtype, hidden in st["configs"]:
            for batch in st["batches"]:
                shape = dict(dtype=dtype, hidden=hidden, beam=beam, batch=batch)
                with tempfile.TemporaryDirectory(prefix="zerogr-coldstart-") as cache:
                    for phase in PHASES:
                        what = f"{phase} {dtype}/H{hidden} beam {beam} batch {batch}"
                        if s.expired():
                            s.skipped(suite, spec, what)
                            continue
                        try:
                            rec = run_child(spec, dtype, hidden, beam, batch, s.dev, cache, _child_timeout(s))
                        except Exception as exc:  # noqa: BLE001 - one shape's failure must not lose the others
                            s.error(suite, spec, what, exc)
                            break
                        target = COLD_TARGET_S if phase == "cold" else WARM_TARGET_S
                        s.emit(suite, "first-decode", spec, dict(shape), phase=phase, **shape, target_s=target,
                               met=rec["first_decode_s"] <= target, **rec)
                        s.log(f"[{suite}] {spec.label} {what}: first decode {rec['first_decode_s']:.1f} s "
                              f"(plan {rec['plan_source']}, target ≤ {target:.0f} s), "
                              f"process {rec['process_s']:.1f} s")


def _child_timeout(s) -> float:
    """Seconds a child may run: the session's time left plus a grace, at most 600."""
    now = time.perf_counter()
    left = [d - now for d in (s.deadline, s.suite_deadline) if d is not None]
    return max(60.0, min([600.0] + [t + 30.0 for t in left]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m zerogr_core.bench.coldstart",
                                description="time the first decode of one shape in this process (one JSON line)")
    p.add_argument("--catalog", required=True)
    p.add_argument("--scale", type=whole(1), default=None)
    p.add_argument("--codebook", type=whole(1), default=None)
    p.add_argument("--seed", type=whole(0, SEED_MAX), default=0)
    p.add_argument("--dtype", required=True)
    p.add_argument("--hidden", type=whole(1, MAX_HIDDEN), required=True)
    p.add_argument("--beam", type=whole(1), required=True)
    p.add_argument("--batch", type=whole(1), required=True)
    p.add_argument("--device", type=device_arg, default="cuda")
    a = p.parse_args(argv)
    rec = first_decode(a.catalog, a.scale, a.seed, a.codebook, a.dtype, a.hidden, a.beam, a.batch,
                       resolved(a.device))
    print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
