"""The ``bench-e2e`` command: its options, the run over models and catalogs, and the records
(speed-ups, constrained decoding's share, the cross-check against Hugging Face's cache).

The methods, models and catalogs it times are :mod:`zerogr_core.bench.e2e`'s.
"""
from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import time
from pathlib import Path

from ..arg_types import SEED_MAX, seconds, whole, wholes
from ..decode.work_limits import MAX_REPEATS
from ..devices import device_arg, resolved
from .e2e import (CATALOGS, DTYPE_FIELDS, DTYPES, LAST_STEP_ARMS, METHODS, MODELS, T5_ONLY, E2EConfig, Workbench,
                  build_catalog, catalog_label, default_partial_last_step)


def register(subparsers) -> None:
    """Add the ``bench-e2e`` subcommand."""
    p = subparsers.add_parser(
        "bench-e2e", help="end-to-end latency with the model included: ZeroGR vs STATIC-style masking, "
                          "unconstrained search and Hugging Face generate",
        description="Decode the same requests with one model (random weights) over one catalog: ZeroGR filtering "
                    "first with the model's KV cache inside its CUDA graph, STATIC-style masking, unconstrained "
                    "search and the model alone in the same loop, and Hugging Face generate with "
                    "prefix_allowed_tokens_fn and unconstrained. Results go to JSON and CSV, one pair per model and "
                    "catalog.")
    p.add_argument("--model", default=None,
                   help="comma list of t5 (TIGER-size T5ForConditionalGeneration, every method) and decoder-only "
                        "(12 layers, d 1024, 256 history items; HF methods through its GPT-2 twin) "
                        "(default: both; quick: t5)")
    p.add_argument("--catalog", default=None,
                   help="comma list of tiger (1e6 SIDs, 4x256) and search (search-like, 2e7 SIDs) "
                        "(default: both; quick: tiger)")
    p.add_argument("--preset", default=None, help="tiger (default) or quick")
    p.add_argument("--dtype", default="fp32", choices=tuple(DTYPES),
                   help="model dtype (default fp32, strict: no TF32); tf32 is FP32 weights with TF32 tensor-core "
                        "matmuls allowed")
    p.add_argument("--prefill", default="inside", choices=("inside", "outside"),
                   help="on a GPU: run the prefill inside each loop method's CUDA graph (default) or eagerly "
                        "before it")
    p.add_argument("--quick", action="store_true", help="CPU/CI mode: the quick preset, batches 1,2, beam 4, 2 repeats")
    p.add_argument("--methods", default=None,
                   help=f"comma list of {', '.join(METHODS)} (default: all but the last-step arm that equals zerogr "
                        "for the model)")
    p.add_argument("--batch", type=wholes(1), default=None, help="batch sizes (default 1,8,32)")
    p.add_argument("--beam", type=wholes(1), default=None, help="beam widths (default 32,128,256)")
    p.add_argument("--items", type=whole(1), default=None, metavar="N",
                   help="SIDs of every catalog (default: 1e6 tiger, 2e7 search)")
    p.add_argument("--repeats", type=whole(1, MAX_REPEATS), default=None,
                   help="timed runs per measurement (default 20; quick 2)")
    p.add_argument("--hf-repeats", type=whole(1, MAX_REPEATS), default=None,
                   help="timed runs of the HF methods (default 3; quick 1)")
    p.add_argument("--warmup", type=whole(0, MAX_REPEATS), default=None, help="untimed runs first (default 2; quick 1)")
    p.add_argument("--budget-s", type=seconds(), default=None, metavar="S",
                   help="start no new measurement after S seconds (shared out between models and catalogs)")
    p.add_argument("--seed", type=whole(0, SEED_MAX), default=0,
                   help="seed of the catalogs, models and requests (default 0; at most 2**32 - 1)")
    p.add_argument("--device", type=device_arg, default=None,
                   help="torch device (default cuda when available, else cpu)")
    p.add_argument("--out", default="runs/results/e2e", metavar="DIR",
                   help="result folder (default runs/results/e2e)")
    p.set_defaults(handler=run_e2e)


def _names(text, option: str, allowed, default) -> list[str]:
    from .commands import _list

    return _list(text, option, allowed) or list(default)


@contextlib.contextmanager
def _matmul_precision(device, *, tf32: bool):
    """Strict FP32 matrix products on a GPU, as the other suites, unless ``tf32``; restored on exit."""
    import torch

    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def run_e2e(args: argparse.Namespace) -> int:
    import torch

    from ..errors import ZeroGRError
    from ..environment import environment
    from .results import ResultWriter

    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ZeroGRError("bench-e2e needs transformers (pip install -r requirements.txt)") from None
    quick = args.quick
    preset = args.preset or ("quick" if quick else "tiger")
    cfg = E2EConfig.preset(preset)
    models = _names(args.model, "--model", MODELS, ["t5"] if quick else MODELS)
    catalogs = _names(args.catalog, "--catalog", CATALOGS, ["tiger"] if quick else CATALOGS)
    items = args.items
    wanted = list(METHODS) if args.methods is None else [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in wanted:
        if m not in METHODS:
            raise ZeroGRError(f"--methods: unknown method {m!r}; choose from {', '.join(METHODS)}")
        if m in T5_ONLY and "t5" not in models and args.methods is not None:
            raise ZeroGRError(f"--methods: {m} needs --model t5 (it decodes through the T5's Hugging Face cache)")
    dtype = getattr(torch, DTYPES[args.dtype])
    batches = args.batch or ([1, 2] if quick else [1, 8, 32])
    beams = args.beam or ([4] if quick else [32, 128, 256])
    from ..decode.work_limits import check_beams

    check_beams(batches, beams)
    repeats = args.repeats or (2 if quick else 20)
    hf_repeats = args.hf_repeats or (1 if quick else 3)
    warmup = args.warmup if args.warmup is not None else (1 if quick else 2)
    seed, budget = args.seed, args.budget_s
    device = torch.device(resolved(args.device) or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" and quick:
        torch.set_num_threads(1)

    with _matmul_precision(device, tf32=args.dtype == "tf32"):
        env = environment(device)
        env["argv"] = shlex.join(sys.argv)
        out = Path(args.out)
        t0 = time.perf_counter()
        blocks = [(kind, name) for name in catalogs for kind in models]
        built: dict = {}
        errors, written = 0, 0
        for i, (kind, name) in enumerate(blocks):
            methods = [m for m in wanted if kind == "t5" or m not in T5_ONLY]
            if args.methods is None:   # by default, only the last-step arm that differs from zerogr's
                methods = [m for m in methods if LAST_STEP_ARMS.get(m, None) != default_partial_last_step(kind)]
            parts = ["python", "-m", "zerogr_core", "bench-e2e", "--model", kind, "--catalog", name, "--dtype",
                     args.dtype, "--preset", preset, "--methods", ",".join(methods), "--batch",
                     ",".join(map(str, batches)), "--beam", ",".join(map(str, beams)), "--repeats", str(repeats),
                     "--hf-repeats", str(hf_repeats), "--warmup", str(warmup), "--seed", str(seed),
                     "--prefill", args.prefill]
            parts += ["--items", str(items)] if items is not None else []
            parts += ["--quick"] if quick else []
            parts += ["--device", str(device)] if device.type != "cuda" else []
            command = shlex.join(parts)
            block_end = None
            if budget is not None:
                left = budget - (time.perf_counter() - t0)
                if left <= 0:
                    print(f"bench-e2e: time budget spent; {kind} on {name} not run", flush=True)
                    continue
                block_end = time.perf_counter() + left / (len(blocks) - i)
            if name not in built:
                t = time.perf_counter()
                built.clear()                      # one catalog in memory at a time
                built[name] = build_catalog(cfg, name, seed, items)
                print(f"bench-e2e: catalog {name}: {built[name].n_items:,} SIDs {catalog_label(built[name])}, built in "
                      f"{time.perf_counter() - t:.1f} s", flush=True)
            catalog = built[name]
            stem = f"e2e-{kind}-{args.dtype}-{catalog_label(catalog)}-{catalog.n_items}" + ("__quick" if quick else "")
            writer = ResultWriter(out / f"{stem}.json", out / f"{stem}.csv", env, command)
            print(f"bench-e2e: {command}\nbench-e2e: {env['gpu']} | torch {env['torch']} | writing {out / stem}.json",
                  flush=True)
            try:
                errors += _run(cfg, kind, name, catalog, dtype, methods, batches, beams, repeats, hf_repeats, warmup,
                               seed, device, writer, env, command, block_end, args.prefill, DTYPE_FIELDS[args.dtype])
            finally:
                writer.close()
                written += len(writer.records)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print(f"bench-e2e: {written} records in {time.perf_counter() - t0:.1f} s", flush=True)
        return 1 if errors else 0


#: Largest score gap, in float32, between ZeroGR's T5 step model and the same engine fed by
#: Hugging Face's own cache, on a beam both return: the two compute the same float32
#: arithmetic in another order (fused kernels against PyTorch modules).
HF_CACHE_SCORE_TOL = 1e-4
#: Smallest mean share of a request's beams that both return, in float32: beams may differ
#: only where a near-tie at the boundary fell the other way.
HF_CACHE_MIN_OVERLAP = 0.99


def hf_cache_agreement(ours: tuple, theirs: tuple) -> dict:
    """How far ZeroGR's decode and the decode through Hugging Face's own cache agree.

    Parameters
    ----------
    ours, theirs : (torch.Tensor, torch.Tensor)
        ``(item_rows, scores)`` of each, both (B, M); unfilled beams have score -inf.

    Returns
    -------
    dict
        ``hf_cache_overlap`` (mean over requests of the share of beams in both),
        ``hf_cache_same_top1`` (share of requests with the same best item),
        ``hf_cache_max_score_gap`` (largest score difference of a beam in both).
    """
    overlaps, top1, gap = [], [], 0.0
    for rows_a, sc_a, rows_b, sc_b in zip(ours[0].tolist(), ours[1].tolist(), theirs[0].tolist(), theirs[1].tolist()):
        a = {r: s for r, s in zip(rows_a, sc_a) if s != float("-inf")}
        b = {r: s for r, s in zip(rows_b, sc_b) if s != float("-inf")}
        common = a.keys() & b.keys()
        overlaps.append(len(common) / max(len(a), len(b), 1))
        top1.append(bool(rows_a) and bool(rows_b) and rows_a[0] == rows_b[0])
        gap = max([gap] + [abs(a[r] - b[r]) for r in common])
    n = max(len(overlaps), 1)
    return dict(hf_cache_overlap=sum(overlaps) / n, hf_cache_same_top1=sum(top1) / n, hf_cache_max_score_gap=gap)


def derived_record(base: dict, medians: dict, rows: dict, partial: dict | None = None) -> tuple[dict, int]:
    """Speed-ups, constrained decoding's overhead and share, and the item cross-check of one shape.

    ``rows`` maps ``zerogr``, ``zerogr-partial``, ``zerogr-full`` and ``zerogr-hf-cache`` to their
    ``(item_rows, scores)``; ``partial`` maps the first three to whether their step model ran the
    partial last step (``partial_last_step_ratio``: the partial arm's median over the full arm's;
    ``partial_same_items``: the share of item slots the two fill alike). In
    float32 the two must agree (:data:`HF_CACHE_MIN_OVERLAP`, :data:`HF_CACHE_SCORE_TOL`);
    in TF32, BF16 and FP16 the two step models round differently, so their agreement is
    recorded, not checked (the kernels are checked against their references per dtype in
    the test suite).

    Returns
    -------
    (dict, int)
        The record and the number of failed checks.
    """
    derived, errors = dict(base, method="derived"), 0
    if "zerogr" not in medians:
        return derived, errors
    z = medians["zerogr"]
    for other in ("hf-constrained", "hf-unconstrained", "zerogr-hf-cache", "static", "unconstrained"):
        if other in medians:
            derived[f"speedup_vs_{other}"] = medians[other] / z
    arms = {flag: method for method, flag in (partial or {}).items() if method in medians}
    if True in arms and False in arms:
        on, off = arms[True], arms[False]
        derived["partial_last_step_ratio"] = medians[on] / medians[off]
        if on in rows and off in rows:
            # the same beams by construction; other GEMM row counts may round a near tie the other way
            derived["partial_same_items"] = float((rows[on][0] == rows[off][0]).float().mean())
    if "unconstrained" in medians:
        derived["constrained_overhead_vs_unconstrained"] = z / medians["unconstrained"] - 1
    if "model-only" in medians:
        derived["model_only_ms"] = medians["model-only"]
        derived["decode_share"] = 1 - medians["model-only"] / z
        if "static" in medians:
            derived["static_decode_share"] = 1 - medians["model-only"] / medians["static"]
    if "zerogr-hf-cache" in rows and "zerogr" in rows:
        agree = hf_cache_agreement(rows["zerogr"], rows["zerogr-hf-cache"])
        derived.update(agree)
        if base.get("dtype") == "float32":
            ok = agree["hf_cache_overlap"] >= HF_CACHE_MIN_OVERLAP and \
                agree["hf_cache_max_score_gap"] <= HF_CACHE_SCORE_TOL
            derived["check_agrees_with_hf_cache"] = ok
            errors += 0 if ok else 1
    return derived, errors


def _run(cfg, kind, catalog_name, catalog, dtype, methods, batches, beams, repeats, hf_repeats, warmup, seed, device,
         writer, env, command, deadline, prefill="inside", dtype_field=None):
    import torch

    from ..timing import summarize, time_runs

    t = time.perf_counter()
    wb = Workbench(cfg, kind, catalog, dtype, device, seed, prefill)
    print(f"bench-e2e: {kind} model {wb.parameters:,} parameters on {catalog_name}, set up in "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    base = dict(suite="e2e", env=env, run_command=command, seed=seed, catalog=f"{catalog_name}-{catalog_label(catalog)}",
                n_items=catalog.n_items, codebooks="/".join(map(str, catalog.codebook_sizes)),
                parameters=wb.parameters, history_items=wb.history,
                dtype=dtype_field or str(dtype).replace("torch.", ""),
                device=str(device), model_kind=kind, prefill=wb.prefill_where, **wb.fields)
    errors = 0
    partial = {m: LAST_STEP_ARMS.get(m, default_partial_last_step(kind)) for m in ("zerogr", *LAST_STEP_ARMS)}
    for beam in beams:
        runners = {}
        for batch in batches:
            ids, mask = wb.inputs(batch)
            shape = dict(batch=batch, beam=beam)
            medians, rows = {}, {}
            for method in methods:
                if deadline is not None and time.perf_counter() > deadline:
                    print(f"bench-e2e: time budget of {kind} on {catalog_name} spent; stopping", flush=True)
                    if medians:
                        record, bad = derived_record(dict(base, **shape), medians, rows, partial)
                        writer.add(record)
                        errors += bad
                    return errors
                try:
                    if method not in runners:
                        runners[method] = wb.serving(method, beam)
                    run = runners[method]
                    result, valid, loop = run(ids, mask)
                    if method in ("zerogr", "zerogr-partial", "zerogr-full", "zerogr-hf-cache"):
                        rows[method] = (result.item_rows.clone(), result.scores.clone())
                    stats = summarize(time_runs(lambda: run(ids, mask), device, warmup=warmup,
                                                repeats=hf_repeats if method.startswith("hf-") else repeats))
                except torch.cuda.OutOfMemoryError as exc:
                    runners.pop(method, None)
                    torch.cuda.empty_cache()
                    writer.add(dict(base, method=method, **shape, error=f"out of memory: {exc}"[:300]))
                    print(f"bench-e2e: {method} batch {batch} beam {beam}: out of memory", flush=True)
                    continue
                except Exception as exc:  # noqa: BLE001 - one failing method must not lose the others' records
                    runners.pop(method, None)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    reason = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
                    writer.add(dict(base, method=method, **shape, error=reason))
                    print(f"bench-e2e: {method} batch {batch} beam {beam}: FAILED {reason}", flush=True)
                    errors += 1
                    continue
                medians[method] = stats["median_ms"]
                valid = valid()
                last = dict(partial_last_step=partial[method]) if method in partial else {}
                writer.add(dict(base, method=method, loop=loop, **shape, valid_fraction=valid, **last, **stats))
                shown = "   -  " if valid is None else f"{valid:.3f}"
                print(f"bench-e2e: {kind} {catalog_name} beam {beam:4d} batch {batch:3d} {method:17s} "
                      f"{stats['median_ms']:10.3f} ms valid {shown} ({loop})", flush=True)
            record, bad = derived_record(dict(base, **shape), medians, rows, partial)
            writer.add(record)
            errors += bad
            summary = [text.format(record[field]) for field, text in (
                ("speedup_vs_hf-constrained", "{:.1f}x HF constrained"),
                ("speedup_vs_static", "{:.2f}x STATIC-style"),
                ("constrained_overhead_vs_unconstrained", "{:+.1%} over unconstrained"),
                ("decode_share", "constrained decoding {:.1%} of end to end")) if field in record]
            if summary:
                print(f"bench-e2e: {kind} {catalog_name} beam {beam:4d} batch {batch:3d} zerogr: " + ", ".join(summary),
                      flush=True)
        runners.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return errors
