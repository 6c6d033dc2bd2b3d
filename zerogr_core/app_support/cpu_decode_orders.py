"""CPU decode time of both orders on the bundled MovieLens recommender.

What the app's Decode page runs on a machine without a GPU: the PyTorch reference path
with one torch thread, test users of the bundled data as requests. Filtering first runs
under the per-step CPU plan (:mod:`zerogr_core.decode.reference_plan`) and, for
comparison, under the fixed default projection (a GEMM on dense steps, selective
projection on sparse ones); scoring first projects and normalises the whole codebook.
Each figure is the median over ``--repeats`` decodes (the methods take turns) of the
stage-timed total (the Decode page's number, model forward included), of the same without
the model stage (what the order itself costs; its minimum too), of the whole decode's wall
clock and of its thread CPU time (model included; what the process itself spent, which other
processes on a shared machine disturb least), and the median over rounds of each method's
decode time and thread CPU time over scoring first's in the same round.

    python -m zerogr_core.app_support.cpu_decode_orders                  # writes runs/cpu_results/decode-orders__movielens.json
    python -m zerogr_core.app_support.cpu_decode_orders --batch 1,8 --beam 32 --repeats 9
"""
from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from ..arg_types import SEED_MAX, whole, wholes
from ..decode.decoder import default_projection
from ..decode.heads import Heads
from ..decode.ops import REFERENCE
from ..decode.reference_plan import make_reference_plan, plan_projection, plan_rows
from ..decode.work_limits import MAX_REPEATS, check_beams
from ..environment import environment
from ..errors import Parser, UsageError
from ..index import build_index
from ..recsys import movielens
from .profile import profiled_decode, steady_cpu_timing

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "runs" / "cpu_results" / "decode-orders__movielens.json"
BASELINE = "score-first"


def measure(index, heads, beam, make_fn, batch, methods: dict, repeats: int) -> dict:
    """Per method ``name -> (order, projection)``: medians (ms) over ``repeats`` decodes after
    one warm-up each, the methods taking turns so that a busy machine slows them alike (each
    round starts with the next method, so that none always runs first)."""
    samples = {name: ([], [], [], []) for name in methods}
    last = {}
    names = list(methods)
    for i in range(repeats + 1):
        for name in names[i % len(names):] + names[:i % len(names)]:
            order, projection = methods[name]
            t0, c0 = time.perf_counter(), time.thread_time()
            run = profiled_decode(index, heads, beam, order, make_fn(), batch, projection=projection)
            wall, cpu = (time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3
            last[name] = run
            if i:
                total, decode, walls, cpus = samples[name]
                total.append(run.total_ms)
                decode.append(sum(r["ms"] for r in run.stage_ms if r["stage"] != "model"))
                walls.append(wall)
                cpus.append(cpu)
    # the methods of one round run back to back: the median of their per-round ratio is the
    # comparison least disturbed by other work on a shared machine
    base = samples.get(BASELINE)
    ratio = lambda xs, k: statistics.median(x / b for x, b in zip(xs, base[k])) if base else None  # noqa: E731
    return {name: dict(median_ms=statistics.median(total), min_ms=min(total),
                       decode_median_ms=statistics.median(decode), decode_min_ms=min(decode),
                       decode_ratio_to_score_first=ratio(decode, 1),
                       wall_median_ms=statistics.median(walls),
                       cpu_median_ms=statistics.median(cpus), cpu_ratio_to_score_first=ratio(cpus, 3),
                       runs=repeats, projection=list(last[name].projection), result=last[name].result)
            for name, (total, decode, walls, cpus) in samples.items()}


def main(argv=None) -> int:
    # the project's argument types: a bad count is one line, not numpy's or statistics' traceback mid-run
    p = Parser(prog="python -m zerogr_core.app_support.cpu_decode_orders", description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=wholes(1), default=[1, 8, 32], help="request batches (default 1,8,32)")
    p.add_argument("--beam", type=whole(1), default=32, help="beam width (default 32, the Decode page's CPU default)")
    p.add_argument("--repeats", type=whole(1, MAX_REPEATS), default=7,
                   help=f"timed decodes per order (default 7, at most {MAX_REPEATS:,})")
    p.add_argument("--seed", type=whole(0, SEED_MAX), default=0,
                   help="seed of the sampled test users (default 0; at most 2**32 - 1)")
    p.add_argument("--out", default=str(OUT), help=f"result file (default {OUT.relative_to(ROOT)})")
    try:
        args = p.parse_args(argv)
        check_beams(args.batch, args.beam)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not movielens.available():
        print(f"error: {movielens.MISSING}", file=sys.stderr)
        return 1
    dev = torch.device("cpu")
    study = movielens.bundled_study("cpu")
    users = movielens.test_users(study)
    index = build_index(study.catalog)
    heads = Heads.build(study.model.head_weights(), index.codebook_sizes)
    records = []
    load_before = os.getloadavg()
    with torch.no_grad(), steady_cpu_timing(dev):
        for batch in args.batch:
            histories, _ = users.pick(users.sample(batch, args.seed))
            make_fn = lambda: study.model.hidden_fn_for(histories, study.sids)  # noqa: E731
            t0 = time.perf_counter()
            plan = make_reference_plan(index, heads, args.beam, make_fn(), batch, ops=REFERENCE)
            plan_ms = (time.perf_counter() - t0) * 1e3
            runs = measure(index, heads, args.beam, make_fn, batch, {
                "filter-first (CPU plan)": ("filter-first", plan_projection(plan)),
                "filter-first (default projection)": ("filter-first", default_projection(index)),
                "score-first": ("score-first", None)}, args.repeats)
            planned, fixed = runs["filter-first (CPU plan)"]["result"], runs["filter-first (default projection)"]["result"]
            same = bool(torch.equal(planned.tokens, fixed.tokens)
                        and (planned.scores - fixed.scores).abs().nan_to_num(0.0).max() <= 1e-5)
            for name, r in runs.items():
                r.pop("result")
                records.append(dict(kind="cpu-decode", catalog="movielens (bundled)", items=index.n_items,
                                    levels=index.n_levels, batch=batch, beam=args.beam, method=name, **r))
            records.append(dict(kind="cpu-plan", batch=batch, beam=args.beam, plan_ms=plan_ms, steps=plan_rows(plan),
                                planned_equals_default_beams=same))
            ff, df, sf = (runs[k] for k in ("filter-first (CPU plan)", "filter-first (default projection)",
                                            "score-first"))
            fig = lambda r: (f"{r['median_ms']:.1f} ({r['decode_median_ms']:.2f} median, "  # noqa: E731
                             f"{r['decode_min_ms']:.2f} min, x{r['decode_ratio_to_score_first']:.3f}; "
                             f"thread CPU x{r['cpu_ratio_to_score_first']:.3f})")
            print(f"batch {batch:>3} beam {args.beam}: total ms (without the model stage): filter-first plan "
                  f"{'/'.join(plan_projection(plan))} {fig(ff)}, default projection {fig(df)}, "
                  f"score-first {fig(sf)}; plan took {plan_ms:.0f} ms; same beams as default: {same}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = environment(dev)
    env["torch_threads"] = 1
    # 1-minute load averages when the run started and ended: above ~1 other work shared the cores
    env["load_average_1min"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    out.write_text(json.dumps(dict(format="zerogr-cpu-decode/1", env=env,
                                   run_command=shlex.join(["python", "-m", "zerogr_core.app_support.cpu_decode_orders",
                                                           *(sys.argv[1:] if argv is None else argv)]),
                                   records=records), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
