"""``python -m zerogr_core bench``: the benchmark command.

Examples::

    python -m zerogr_core bench --quick --suite all --out /tmp/bench      # CPU / CI smoke run
    python -m zerogr_core bench --suite headline --catalog search-like --scale 2e7
    python -m zerogr_core bench --suite stages,ablation,steps --batch 1,8,32
    python -m zerogr_core bench --suite codebook-sweep --codebook 2048,4096,8192,16384
    python -m zerogr_core bench --summarize runs/results                 # tables from saved files

Only the standard library is imported when the CLI starts; torch and the kernels load in
the handler.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from ..arg_types import SEED_MAX, seconds, to_seconds, whole, wholes
from ..decode.work_limits import MAX_HIDDEN, MAX_REPEATS, check_beams
from ..devices import device_arg, resolved
from ..errors import UsageError
from .registry import SUITE_NAMES
from .rerun import run_command

METHOD_NAMES = ("zerogr", "static", "static-adapted", "unconstrained", "cpu-trie", "naive-selective")
DEFAULT_HIDDEN = {"fp16": 1024, "bf16": 1024, "fp32": 4096}


def register(subparsers) -> None:
    """Add the ``bench`` subcommand."""
    # exit_on_error=False: a bad value reaches the caller's parser as an ArgumentError, so the app's
    # live sweep (its own parser) reports the one line too instead of argparse's exit
    p = subparsers.add_parser(
        "bench", exit_on_error=False,
        help="benchmark zerogr against the baselines (latency, steps, stages, memory, build)",
        description="Time the filtering-first GPU engine against STATIC-style scoring first (as published and "
                    "adapted), unconstrained decoding, a host trie and the naive selective projection, on one "
                    "catalog with the same heads and hidden states. Results go to JSON and CSV as the run goes.")
    p.add_argument("--suite", default="headline",
                   help=f"comma list of suites, or 'all': {', '.join(SUITE_NAMES)} (default headline)")
    p.add_argument("--catalog", default=None,
                   help="search-like, watch-like, synthetic-7, a sample name, synth:KIND:N[:SEED[:V]] or a catalog "
                        "file (default: search-like; synthetic-7 for the sweeps)")
    p.add_argument("--scale", type=whole(1), default=None, metavar="N",
                   help="SIDs of a synthetic catalog, e.g. 2e7 (default: search-like 19269255, the docs/design.md §8 "
                        "anchor; watch-like 2e7; synthetic-7 1e7)")
    p.add_argument("--methods", default=None,
                   help=f"comma list of {', '.join(METHOD_NAMES)} (default: all; the sweeps skip cpu-trie and "
                        "naive-selective)")
    p.add_argument("--batch", type=wholes(1), default=None,
                   help="batch sizes (default 1,2,4,8,16,32; 1,8,32 for sweeps/steps)")
    p.add_argument("--beam", type=wholes(1), default=None, help="beam widths (default 128; beam-sweep 64,128,256)")
    p.add_argument("--dtype", default=None, help="head/hidden dtypes fp16, bf16, fp32, paired with --hidden "
                                                 "(default fp16,fp32)")
    p.add_argument("--hidden", type=wholes(1, MAX_HIDDEN), default=None,
                   help="hidden sizes, paired with --dtype (default 1024,4096)")
    p.add_argument("--codebook", type=wholes(1), default=None,
                   help="codebook size V of every level of a synthetic catalog; the codebook-sweep sweeps a list "
                        "(default 2048,4096,8192,16384)")
    p.add_argument("--json", default=None, metavar="FILE", help="JSON result file (default OUT/<name>.json)")
    p.add_argument("--csv", default=None, metavar="FILE", help="CSV result file (default OUT/<name>.csv)")
    p.add_argument("--out", default="runs/results", metavar="DIR", help="result folder (default runs/results)")
    p.add_argument("--quick", action="store_true",
                   help="CPU/CI mode: tiny catalogs (codebook 32), small hidden sizes, batches 1,2, beam 4, "
                        "3 repeats; every code path still runs")
    p.add_argument("--seed", type=whole(0, SEED_MAX), default=0,
                   help="seed of catalogs, heads and hidden states (default 0; at most 2**32 - 1)")
    p.add_argument("--repeats", type=whole(1, MAX_REPEATS), default=None,
                   help="timed runs per measurement (default 30; quick 3)")
    p.add_argument("--warmup", type=whole(0, MAX_REPEATS), default=None,
                   help="untimed runs before timing (default 5; quick 1)")
    p.add_argument("--budget-s", type=seconds(), default=None, metavar="S",
                   help="stop starting new measurements after S seconds (what finished is kept)")
    p.add_argument("--suite-budgets", default=None, metavar="SUITE=S,…",
                   help="per-suite time budgets in seconds, e.g. headline=200,build=60")
    p.add_argument("--check", choices=("ends", "all", "none"), default="ends",
                   help="check outputs before timing at the smallest and largest batch (ends), every batch, "
                        "or never (default ends)")
    p.add_argument("--device", type=device_arg, default=None,
                   help="torch device (default cuda when available, else cpu)")
    p.add_argument("--build-repeats", type=whole(1), default=None,
                   help="runs per builder in the build suite (default 2)")
    p.add_argument("--interference-s", type=seconds(), default=None, metavar="S",
                   help="seconds of decoding per condition in the interference suite (default 3)")
    p.add_argument("--topk-paths", default=None, metavar="PATHS",
                   help="top-k paths zerogr's planner times, from small,wide,split,prune (default small,wide,split)")
    p.add_argument("--summarize", default=None, metavar="PATH",
                   help="print the summary tables of saved results (file or folder) and exit")
    p.set_defaults(handler=run_bench)


def _list(text, option: str, allowed) -> list[str] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if items == ["all"]:
        return list(allowed)
    for item in items:
        if item not in allowed:
            raise UsageError(f"{option}: unknown value {item!r}; choose from {', '.join(allowed)}")
    if not items:
        raise UsageError(f"{option}: give at least one value")
    return items


def _configs(dtypes, hiddens, quick: bool):
    if dtypes is None and hiddens is None:
        return None
    default = [("fp16", 32), ("fp32", 48)] if quick else [("fp16", 1024), ("fp32", 4096)]
    if dtypes is None:
        dtypes = [d for d, _ in default][:len(hiddens)] if len(hiddens) <= 2 else ["fp16"]
    if hiddens is None:
        hiddens = [(32 if d != "fp32" else 48) if quick else DEFAULT_HIDDEN[d] for d in dtypes]
    if len(dtypes) == 1:
        dtypes = dtypes * len(hiddens)
    if len(hiddens) == 1:
        hiddens = hiddens * len(dtypes)
    if len(dtypes) != len(hiddens):
        raise UsageError(f"--dtype lists {len(dtypes)} values and --hidden {len(hiddens)}; pair them one to one")
    return list(zip(dtypes, hiddens))


def _stem(suites, options) -> str:
    name = "+".join(suites) if len(suites) < len(SUITE_NAMES) else "all"
    if options.catalog:
        name += "__" + Path(options.catalog).stem.replace(":", "-")
    if options.scale is not None:
        from .workload import format_count

        name += "-" + format_count(options.scale)
    if options.codebooks and len(options.codebooks) == 1:
        name += f"-V{options.codebooks[0]}"
    if options.quick:
        name += "__quick"
    return name


def parse_options(args):
    """The :class:`~zerogr_core.bench.options.Options` of parsed arguments (usage errors raised)."""
    # the names and counts are checked before torch and the kernels load: a usage error answers at once
    check_beams(args.batch or [32], args.beam or [256])  # the suites' largest defaults where none is given
    suites = _list(args.suite, "--suite", SUITE_NAMES)
    methods = _list(args.methods, "--methods", METHOD_NAMES)
    dtypes = _list(args.dtype, "--dtype", ("fp16", "bf16", "fp32"))
    budgets = {}
    for item in (args.suite_budgets or "").split(","):
        if not item.strip():
            continue
        name, _, value = item.partition("=")
        name = name.strip()
        if name not in SUITE_NAMES:
            raise UsageError(f"--suite-budgets: unknown suite {name!r}")
        try:
            budgets[name] = to_seconds(value)
        except ValueError as err:
            raise UsageError(f"--suite-budgets {name}: {err}") from None
    configs = _configs(dtypes, args.hidden, args.quick)
    import torch

    from zerogr_kernels import TOPK_PATHS

    from ..decode.options import PLANNED_TOPK
    from .options import Options

    if args.device is not None:
        device = torch.device(resolved(args.device))
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: CUDA is not available here")
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    topk_paths = PLANNED_TOPK if args.topk_paths is None else tuple(_list(args.topk_paths, "--topk-paths",
                                                                          TOPK_PATHS))
    return Options(suites=suites, suite_budgets=budgets, topk_paths=topk_paths, catalog=args.catalog,
                   scale=args.scale, methods=methods, batches=args.batch, beams=args.beam,
                   configs=configs, codebooks=args.codebook, seed=args.seed,
                   repeats=args.repeats, warmup=args.warmup, quick=args.quick, budget_s=args.budget_s,
                   check=args.check, build_repeats=args.build_repeats, interference_s=args.interference_s,
                   device=device)


def run_bench(args: argparse.Namespace) -> int:
    if args.summarize is not None:
        from .results import load_results
        from .summary import summary_text

        records = load_results(args.summarize)
        if not records:
            raise UsageError(f"--summarize: no benchmark results under {args.summarize}")
        print(summary_text(records))
        return 0
    options = parse_options(args)
    import torch

    from ..environment import environment
    from .results import ResultWriter
    from .session import Session
    from .summary import summary_text

    if options.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # FP32 GEMMs in FP32, as the baselines and references compute
        torch.backends.cudnn.allow_tf32 = False
    elif options.quick:
        torch.set_num_threads(1)  # tiny CPU problems: threads only add noise
    stem = _stem(options.suites, options)
    out = Path(args.out)
    json_path = Path(args.json) if args.json else out / f"{stem}.json"
    csv_path = Path(args.csv) if args.csv else out / f"{stem}.csv"
    env = environment(options.device)
    command = run_command(options)
    env["argv"] = shlex.join(sys.argv)
    writer = ResultWriter(json_path, csv_path, env, command)
    print(f"bench: {command}")
    print(f"bench: {env['gpu']} | driver {env['driver']} | torch {env['torch']} | triton {env['triton']} | "
          f"writing {json_path} and {csv_path}", flush=True)
    t0 = time.perf_counter()
    session = Session(options, writer, env, command, log=lambda line: print(line, flush=True))
    interrupted = False
    try:
        session.run()
    except KeyboardInterrupt:  # a time limit's SIGINT: keep and summarise what finished
        interrupted = True
    finally:
        writer.close()
    state = "interrupted" if interrupted else "finished"
    print(f"\nbench: {state} after {time.perf_counter() - t0:.1f} s; {len(writer.records)} records in {json_path}\n")
    print(summary_text(writer.records), flush=True)
    if interrupted:
        return 130
    return 1 if session.errors else 0
