"""Command line interface: ``python -m zerogr_core COMMAND …``.

Commands are contributed by *registrars*: functions ``register(subparsers)`` that add
one or more subcommands and set ``handler`` (a function of the parsed arguments that
returns an exit status or ``None``) as a parser default. To add commands from another
module, append its ``register`` to :data:`REGISTRARS`. A registrar's module imports only
torch-free modules (argument types, presets, limits) and its handler imports the command's
work, so that ``--help`` and usage errors answer without loading torch or the kernels; a
handler checks what it can of its arguments (names, lists, counts against those constants)
before that import, for the same reason.

Every :class:`~zerogr_core.errors.ZeroGRError`, ``OSError`` and usage error ends the
program with a one-line ``error: …`` on stderr and a non-zero status, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import numpy as np

from .arg_types import SEED_MAX, whole, wholes
from .bench.commands import register as register_bench
from .bench.compare_orders import register as register_compare_orders
from .bench.e2e_command import register as register_bench_e2e
from .catalog.catalog import Catalog
from .catalog.samples import SAMPLE_NAMES, open_catalog
from .catalog.synth import SYNTH_PRESETS, generate
from .decode.dtype_names import check_dtype_name
from .decode.work_limits import MAX_HIDDEN, check_beams
from .devices import as_device, device_arg, resolved
from .errors import Parser, UsageError, ZeroGRError, check_output_file, is_out_of_memory
from .index.config import BUILDERS, INDEX_PRESETS
from .recsys.commands import register as register_recsys
from .recsys.cold_study import register as register_cold_items
from .serve.commands import register as register_serve

CATALOG_HELP = ("catalog file (.csv/.tsv/.txt/.parquet), a sample name (" + ", ".join(SAMPLE_NAMES) +
                "), or synth:KIND:N[:SEED[:V]]")


# ---------------------------------------------------------------------------- shared helpers
def add_catalog_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``CATALOG``, ``--codebook-sizes`` and ``--collision`` to ``parser``."""
    parser.add_argument("catalog", metavar="CATALOG", help=CATALOG_HELP)
    parser.add_argument("--codebook-sizes", metavar="V1,V2,…", type=wholes(1),
                        help="declared codebook size per level (default: from the file or max + 1)")
    parser.add_argument("--collision", action="store_true",
                        help="append a collision level to items sharing a SID instead of failing")


def catalog_from_args(args: argparse.Namespace) -> Catalog:
    """The catalog named by the arguments of :func:`add_catalog_arguments`."""
    return open_catalog(args.catalog, codebook_sizes=args.codebook_sizes,
                        on_duplicate="collision" if args.collision else "error")


def print_json(payload) -> None:
    """Print ``payload`` as indented JSON (numpy scalars and arrays become plain values)."""
    def plain(value):
        if isinstance(value, (np.generic, np.ndarray)):
            return value.tolist()
        raise TypeError(f"not JSON serialisable: {type(value).__name__}")

    print(json.dumps(payload, indent=2, default=plain))


def format_table(rows: list[dict], columns: list[str]) -> str:
    """Right-aligned text table of ``rows`` (dicts) over ``columns``."""
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        if isinstance(value, (int, np.integer)):
            return f"{int(value):,}"
        return str(value)

    body = [[cell(row[c]) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in body]
    return "\n".join(lines)


def _describe(catalog: Catalog) -> str:
    text = (f"{catalog.name}: {catalog.n_items:,} items, {catalog.n_levels} levels, codebooks "
            f"{'/'.join(map(str, catalog.codebook_sizes))}")
    if catalog.collision_level_added:
        text += f" (collision level added for {catalog.duplicate_groups} shared SIDs)"
    return text


# ---------------------------------------------------------------------------- index
def register_index(subparsers) -> None:
    """``index CATALOG``: build the step-sliced index with every builder and report it."""
    p = subparsers.add_parser("index", help="build the index and show its per-step layout and bytes")
    add_catalog_arguments(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--preset", choices=sorted(INDEX_PRESETS), default="default",
                   help="representation rule (default: default)")
    p.add_argument("--dense-steps", metavar="STEPS", type=wholes(1, empty=True), default=[],
                   help="force these 1-based steps dense")
    p.add_argument("--sparse-steps", metavar="STEPS", type=wholes(1, empty=True), default=[],
                   help="force these 1-based steps sparse")
    p.add_argument("--builders", metavar="NAMES", default=",".join(BUILDERS),
                   help=f"builders to run and time (default: {','.join(BUILDERS)}); the first one's "
                        "index is reported")
    p.add_argument("--device", type=device_arg, default=None, help="torch device of the index (default: cpu)")
    p.set_defaults(handler=_run_index)


def _run_index(args: argparse.Namespace) -> None:
    # the arguments are checked before torch loads (build_index's import): a usage error answers at once
    builders = [b.strip() for b in args.builders.split(",") if b.strip()]
    for builder in builders:
        if builder not in BUILDERS:
            raise UsageError(f"--builders: unknown builder {builder!r}; choose from {', '.join(BUILDERS)}")
    if not builders:
        raise UsageError("--builders: name at least one builder")
    catalog = catalog_from_args(args)
    config = INDEX_PRESETS[args.preset]
    overrides = {}
    for option, kind in (("--dense-steps", "dense"), ("--sparse-steps", "sparse")):
        for step in getattr(args, option[2:].replace("-", "_")):
            if not 1 <= step <= catalog.n_levels:
                raise UsageError(f"{option}: step {step} is outside 1…{catalog.n_levels}")
            if overrides.get(step, kind) != kind:
                raise UsageError(f"step {step} is in both --dense-steps and --sparse-steps")
            overrides[step] = kind
    if overrides:
        config = config.with_overrides(overrides)
    from .index import build_index

    timings, report = {}, None
    for builder in builders:
        start = time.perf_counter()
        try:
            index = build_index(catalog, device=resolved(args.device), builder=builder, config=config)
        except ZeroGRError as err:
            if builder == builders[0]:
                raise
            timings[builder] = {"error": str(err)}
            continue
        timings[builder] = dict(index.build, wall_s=time.perf_counter() - start)
        if report is None:
            report = index.report()
        del index
    report = dict(catalog=catalog.name, n_levels=catalog.n_levels, codebook_sizes=list(catalog.codebook_sizes),
                  **report, builders=timings)
    if args.json:
        print_json(report)
        return
    print(_describe(catalog))
    print(format_table(report["steps"], ["step", "codebook", "states", "entries", "density", "max_segment",
                                         "kind", "bytes"]))
    total, raw, static = report["total_bytes"], report["sid_table_int16_bytes"], report["static_style_bytes"]
    print(f"index: {total:,} bytes = {total / raw:.3f}× the int16 SID table ({raw:,} bytes), "
          f"{100 * total / static:.3g}% of the STATIC-style index ({static:,} bytes)")
    for builder, timing in timings.items():
        if "error" in timing:
            print(f"build {builder}: not run ({timing['error']})")
        else:
            print(f"build {builder}: {timing['total_s']:.4f} s "
                  f"({catalog.n_items / max(timing['total_s'], 1e-9) / 1e6:.1f} M SIDs/s)")


# ---------------------------------------------------------------------------- next
def register_next(subparsers) -> None:
    """``next CATALOG --prefix 3,5``: valid next tokens after a prefix."""
    p = subparsers.add_parser("next", help="list the valid next tokens after a prefix")
    add_catalog_arguments(p)
    p.add_argument("--prefix", required=True, metavar="T1,T2,…", type=wholes(0, empty=True),
                   help='tokens so far, comma or space separated ("" for the first step)')
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.set_defaults(handler=_run_next)


def _run_next(args: argparse.Namespace) -> None:
    prefix = args.prefix
    catalog = catalog_from_args(args)
    if len(prefix) >= catalog.n_levels:
        raise UsageError(f"--prefix has {len(prefix)} tokens; a prefix of this catalog has at most "
                         f"{catalog.n_levels - 1}")
    from .index import build_index  # loads torch: after the usage errors

    index = build_index(catalog)
    tokens = index.next_tokens(prefix)
    answer = dict(prefix=prefix, step=len(prefix) + 1, tokens=tokens.tolist())
    if len(prefix) == catalog.n_levels - 1:
        # Last step: the entry position of each completed SID is its row in the sorted table.
        rows = [index.walk(prefix + [int(t)]) for t in tokens]
        answer["item_ids"] = catalog.item_ids[rows].tolist()
        if catalog.titles is not None:
            answer["titles"] = catalog.titles[rows].tolist()
    if args.json:
        print_json(answer)
        return
    shown = ",".join(map(str, prefix)) or "(empty prefix)"
    print(f"step {answer['step']}: {len(tokens)} valid next tokens after {shown}")
    if "item_ids" in answer:
        titles = answer.get("titles", [""] * len(tokens))
        for token, item, title in zip(answer["tokens"], answer["item_ids"], titles):
            print(f"{token}\titem {item}\t{title}".rstrip())
    else:
        print(" ".join(map(str, answer["tokens"])))


# ---------------------------------------------------------------------------- synth
def register_synth(subparsers) -> None:
    """``synth KIND --n N --out FILE``: write a synthetic catalog."""
    p = subparsers.add_parser("synth", help="generate a synthetic catalog file")
    p.add_argument("kind", metavar="KIND", help=f"preset: {', '.join(SYNTH_PRESETS)}")
    p.add_argument("--n", required=True, metavar="N", type=whole(1), help="number of items (e.g. 50000 or 2e7)")
    p.add_argument("--out", required=True, metavar="FILE", help="output .csv/.tsv/.txt/.parquet")
    p.add_argument("--seed", type=whole(0, SEED_MAX), default=0, help="random seed (default 0; at most 2**32 - 1)")
    p.add_argument("--codebook", type=whole(1), default=None, metavar="V", help="codebook size of every level")
    p.set_defaults(handler=_run_synth)


def _run_synth(args: argparse.Namespace) -> None:
    from .catalog.io import catalog_format, save_catalog

    catalog_format(args.out)  # fail on a bad extension, or a place it cannot be written, before generating
    check_output_file(args.out, "--out", folder_must_exist=True)
    start = time.perf_counter()
    catalog = generate(args.kind, args.n, seed=args.seed, codebook=args.codebook)
    generated = time.perf_counter() - start
    save_catalog(catalog, args.out)
    print(f"wrote {args.out}: {_describe(catalog)} (generated in {generated:.2f} s)")


# ---------------------------------------------------------------------------- stats
def register_stats(subparsers) -> None:
    """``stats CATALOG``: catalog-level statistics per step."""
    p = subparsers.add_parser("stats", help="per-step states, entries, density and segment lengths")
    add_catalog_arguments(p)
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.set_defaults(handler=_run_stats)


def _run_stats(args: argparse.Namespace) -> None:
    catalog = catalog_from_args(args)
    stats = dict(catalog=catalog.name, items=catalog.n_items, levels=catalog.n_levels,
                 codebook_sizes=list(catalog.codebook_sizes),
                 band_offsets=None if catalog.band_offsets is None else list(catalog.band_offsets),
                 collision_level_added=catalog.collision_level_added,
                 duplicate_groups=catalog.duplicate_groups,
                 item_ids="string" if catalog.string_ids else "integer",
                 sid_table_int16_bytes=catalog.sid_table_bytes_int16(), steps=catalog.step_stats())
    if args.json:
        print_json(stats)
        return
    print(_describe(catalog))
    if catalog.string_ids:
        print(f"string item ids (first: {catalog.item_ids[0]!s})")
    if catalog.band_offsets is not None:
        print(f"shared head, band offsets {'/'.join(map(str, catalog.band_offsets))}")
    print(format_table(stats["steps"], ["step", "codebook", "states", "entries", "density", "max_segment",
                                        "mean_segment"]))


# ---------------------------------------------------------------------------- plan
def register_plan(subparsers) -> None:
    """``plan CATALOG``: the engine's warm-up plan for one serving shape."""
    p = subparsers.add_parser("plan", help="time every option of every step for a serving shape and show "
                                           "the plan the engine fixes")
    add_catalog_arguments(p)
    p.add_argument("--batch", type=whole(1), default=8, help="requests per decode (default 8)")
    p.add_argument("--beam", type=whole(1), default=128, help="beam width M (default 128)")
    p.add_argument("--hidden", type=whole(1, MAX_HIDDEN), default=1024, help="hidden size H (default 1024)")
    p.add_argument("--dtype", default=None, help="head and hidden dtype: float16, bfloat16 or float32 (default: "
                                                 "float16 on a GPU, float32 on a CPU)")
    p.add_argument("--device", type=device_arg, default=None,
                   help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--override", default=None, metavar="OPT,…",
                   help="one entry per step: full, selective or MODE/TOPK (e.g. sparse+full/prune)")
    p.add_argument("--seed", type=whole(0, SEED_MAX), default=0,
                   help="seed of the random head and requests (default 0; at most 2**32 - 1)")
    add_planner_arguments(p)
    p.add_argument("--json", action="store_true", help="print the plan table as JSON")
    p.set_defaults(handler=_run_plan)


DTYPE_ALIASES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def add_planner_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--plan-dir``, ``--no-plan-store`` and ``--cost-model`` to ``parser``."""
    parser.add_argument("--plan-dir", default=None, metavar="DIR",
                        help="plan store folder (default: $ZEROGR_CACHE_DIR/plans, else ~/.cache/zerogr/plans)")
    parser.add_argument("--no-plan-store", action="store_true",
                        help="neither read nor write stored plans (time every shape afresh)")
    parser.add_argument("--cost-model", choices=("default", "off"), default="default",
                        help="skip options the cost model predicts far slower than the best before timing "
                             "(default), or time every option (off)")


def _planner_kwargs(args: argparse.Namespace) -> dict:
    from .decode.planner import COST_MODELS

    store = False if args.no_plan_store else (args.plan_dir or "default")
    return dict(plan_store=store, cost_model=COST_MODELS[args.cost_model])


def _dtype_name(text: str) -> str:
    """``fp16``/``float16`` -> ``float16`` (also bf16, fp32); other names are left to the checks."""
    return DTYPE_ALIASES.get(text.strip().lower(), text.strip().lower())


def _check_dtype(name: str) -> None:
    """Refuse a ``--dtype`` that names no dtype of the random heads, as a usage error naming it."""
    try:
        check_dtype_name(name)
    except ZeroGRError as err:
        raise UsageError(f"--dtype: {err} (or fp32, bf16, fp16)") from None


def _serving_dtype(device) -> str:
    """The dtype a shape is served in when none is named: half precision on a GPU; float32 on a
    CPU, where float16 matmuls run far slower than float32 ones."""
    return "float16" if device.type == "cuda" else "float32"


def _plan_device(name):
    return as_device(name, "--device")


def _describe_source(engine, plan) -> str:
    if plan.source == "store":
        return f"plan from the store: {engine.plan_store.path(engine.plan_key(plan.key[0]))}"
    if plan.source == "fixed":
        return "plan fixed by the override (nothing timed)"
    if engine.plan_store is None:
        return "plan timed now (plan store off)"
    path = engine.plan_store.path(engine.plan_key(plan.key[0]))
    return f"plan timed now, saved to {path}" if path.exists() else f"plan timed now, not saved ({path} not writable)"


def _run_plan(args: argparse.Namespace) -> None:
    batch, beam, hidden, seed = args.batch, args.beam, args.hidden, args.seed
    # checked before torch and the kernels load (the imports below): a usage error answers at once
    check_beams(batch, beam)
    if args.dtype is not None:
        _check_dtype(_dtype_name(args.dtype))
    from .decode.engine import GpuEngine
    from .decode.heads import Heads
    from .decode.random_requests import random_heads, random_hidden_fn
    from .index import build_index

    device = _plan_device(args.device)
    dtype = _serving_dtype(device) if args.dtype is None else _dtype_name(args.dtype)
    override = None if args.override is None else [o.strip() for o in args.override.split(",")]
    catalog = catalog_from_args(args)
    if override is not None and len(override) != catalog.n_levels:
        raise UsageError(f"--override: {len(override)} steps for a catalog of {catalog.n_levels} levels "
                         "(one entry per step)")
    index = build_index(catalog, device=device)
    heads, bands = random_heads(catalog, hidden, dtype, device, seed)
    engine = GpuEngine(index, Heads.build(heads, index.codebook_sizes, bands), beam, plan_override=override,
                       **_planner_kwargs(args))
    if override is not None:
        try:  # the engine checks each entry only when it plans: name the option it came from
            engine.options_for(batch)
        except ZeroGRError as err:
            raise UsageError(f"--override: {err}") from None
    hidden_fn = random_hidden_fn(batch, hidden, catalog.codebook_sizes, dtype, device, seed + 1)
    plan = engine.plan(hidden_fn, batch)
    if engine.use_graph:  # the capture is part of serving the shape: report whether it held
        engine.decode(hidden_fn, batch)
        plan = engine.plans[engine.key(batch)]
    rows = plan.table()
    if args.json:
        print_json(dict(catalog=catalog.name, device=str(device), batch=batch, beam=beam, hidden=hidden,
                        dtype=dtype, total_us=plan.total_us, source=plan.source, graph_error=plan.graph_error,
                        steps=rows))
        return
    print(f"{_describe(catalog)}\nplan for batch {batch}, beam {beam}, {dtype}, H {hidden} on {device}"
          + ("" if device.type == "cuda" else " (CPU wall clock of the PyTorch reference ops: a GPU plan differs)"))
    print(_describe_source(engine, plan))
    print(format_table(rows, ["step", "mode", "topk", "chosen_us"]))
    print(f"total {plan.total_us:.1f} µs per decode (steps timed alone)")
    if plan.graph_error:
        print(f"CUDA graph: capture failed, this shape runs eagerly: {plan.graph_error}")
    elif engine.use_graph:
        print("CUDA graph: captured (whole decode replayed)")
    for row in rows:
        others = ", ".join(f"{k[:-5]} {v:.1f}" for k, v in row.items() if k.endswith(" (µs)"))
        print(f"step {row['step']} options (µs): {others}" + (f"; failed: {row['failed']}" if "failed" in row else "")
              + (f"; skipped by the cost model: {row['skipped by cost model']}" if "skipped by cost model" in row
                 else ""))


# ---------------------------------------------------------------------------- warmup
def register_warmup(subparsers) -> None:
    """``warmup CATALOG``: plan and compile a list of serving shapes ahead of serving."""
    p = subparsers.add_parser("warmup", help="plan and compile serving shapes ahead of serving (fills the plan "
                                             "store and Triton's cache)",
                              description="Plan every shape of batch × beam × (dtype, hidden) for CATALOG, compile "
                                          "its kernels and store the plans, so that a server's first decode of each "
                                          "shape times nothing and compiles nothing. Plans depend on the catalog's "
                                          "statistics and the head layout, not on the head's values.")
    add_catalog_arguments(p)
    p.add_argument("--batch", type=wholes(1), default=[1, 8, 32], help="requests per decode, a list (default 1,8,32)")
    p.add_argument("--beam", type=wholes(1), default=[128], help="beam widths, a list (default 128)")
    p.add_argument("--dtype", default=None, help="head/hidden dtypes, a list of fp16, bf16, fp32 (default: fp16 on a "
                                                 "GPU, fp32 on a CPU)")
    p.add_argument("--hidden", type=wholes(1, MAX_HIDDEN), default=[1024],
                   help="hidden size per dtype, a list as long as --dtype, or one size for all (default 1024)")
    p.add_argument("--device", type=device_arg, default=None,
                   help="torch device (default: cuda when present, else cpu)")
    p.add_argument("--seed", type=whole(0, SEED_MAX), default=0,
                   help="seed of the random head and requests (default 0; at most 2**32 - 1)")
    add_planner_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON record per shape")
    p.set_defaults(handler=_run_warmup)


def _run_warmup(args: argparse.Namespace) -> None:
    batches, beams, hiddens, seed = args.batch, args.beam, args.hidden, args.seed
    # checked before torch and the kernels load (the imports below): a usage error answers at once
    check_beams(batches, beams)
    dtypes = None if args.dtype is None else [_dtype_name(d) for d in args.dtype.replace(",", " ").split()]
    if dtypes == []:
        raise UsageError("--dtype: give at least one dtype")
    for d in dtypes or []:
        _check_dtype(d)
    n_dtypes = 1 if dtypes is None else len(dtypes)  # the serving dtype of the device when none is named
    if len(hiddens) == 1:
        hiddens = hiddens * n_dtypes
    if len(hiddens) != n_dtypes:
        raise UsageError(f"--hidden: give one size, or one per dtype ({n_dtypes}), got {len(hiddens)}")
    if args.no_plan_store:
        raise UsageError("warmup writes the plan store: drop --no-plan-store")
    from .decode.engine import GpuEngine
    from .decode.heads import Heads
    from .decode.random_requests import random_heads, random_hidden_fn
    from .index import build_index
    from .timing import Stopwatch

    device = _plan_device(args.device)
    dtypes = dtypes or [_serving_dtype(device)]
    catalog = catalog_from_args(args)
    index = build_index(catalog, device=device)
    if not args.json:
        print(f"{_describe(catalog)}\nwarming up {len(batches) * len(beams) * len(dtypes)} shapes on {device}")
    for dtype, hidden in zip(dtypes, hiddens):
        heads, bands = random_heads(catalog, hidden, dtype, device, seed)
        heads = Heads.build(heads, index.codebook_sizes, bands)
        for beam in beams:
            engine = GpuEngine(index, heads, beam, use_graph=device.type == "cuda", **_planner_kwargs(args))
            if engine.plan_store is None:
                raise UsageError("the plan store is off (ZEROGR_PLAN_STORE): warmup has nowhere to write")
            for batch in batches:
                fn = random_hidden_fn(batch, hidden, catalog.codebook_sizes, dtype, device, seed + 1)
                with Stopwatch(device) as watch:
                    engine.decode(fn, batch)  # plans (or loads), compiles and captures like a server's first call
                plan = engine.plans[engine.key(batch)]
                path = engine.plan_store.path(engine.plan_key(batch))
                record = dict(batch=batch, beam=beam, dtype=dtype, hidden=hidden, source=plan.source,
                              seconds=round(watch.seconds, 3), plan=str(path),
                              options="/".join(f"{s.option.mode}:{s.option.topk}" for s in plan.steps))
                if args.json:
                    print(json.dumps(record))
                else:
                    what = {"store": "already stored", "fixed": "fixed", "timed": "planned"}[plan.source]
                    print(f"batch {batch} beam {beam} {dtype} H {hidden}: {what} in {watch.seconds:.1f} s "
                          f"({record['options']}) -> {path}")
            engine.release()


# ---------------------------------------------------------------------------- entry point
#: Functions ``register(subparsers)`` that contribute subcommands, in help order.
REGISTRARS = (register_index, register_next, register_synth, register_stats, register_plan, register_warmup,
              register_bench, register_recsys)
REGISTRARS += (register_bench_e2e,)
REGISTRARS += (register_serve,)
REGISTRARS += (register_cold_items,)
REGISTRARS += (register_compare_orders,)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = Parser(prog="python -m zerogr_core",
                    description="ZeroGR: filtering-first constrained decoding for generative "
                                "recommendation.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in REGISTRARS:
        register(subparsers)
    return parser


def main(argv=None) -> int:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``) and return the exit status. Warnings
    print as one line each, as errors do."""
    with warnings.catch_warnings():
        warnings.showwarning = _warn_one_line
        return _main(argv)


def _warn_one_line(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {_one_line(message)}", file=sys.stderr)


def _main(argv) -> int:
    try:
        args = build_parser().parse_args(argv)
        status = args.handler(args) or 0
        sys.stdout.flush()  # a closed pipe is raised here, inside this handling, not at the interpreter's exit
        return status
    except UsageError as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader stopped reading (`| head`): end quietly, as other command-line tools do, with
        # stdout pointed at /dev/null so that the interpreter's last flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ZeroGRError, OSError) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as err:
        # an optional library this command needs (e.g. polars on a GPU image without it)
        print(f"error: this command needs the Python package {err.name!r}, which is not installed "
              f"(pip install -r requirements.txt)", file=sys.stderr)
        return 1
    except MemoryError:
        print("error: out of memory (a smaller --batch, --beam or catalog needs less)", file=sys.stderr)
        return 1
    except RuntimeError as err:  # torch's allocators (CPU and CUDA) say so in a RuntimeError
        if not is_out_of_memory(err):
            raise
        print(f"error: out of memory: {_one_line(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split()) or type(err).__name__
