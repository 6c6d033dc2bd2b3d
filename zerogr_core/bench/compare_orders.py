"""The ``compare-orders`` command: filtering first against scoring first on the user's own model.

The model is a ``transformers`` checkpoint folder (T5 or a causal LM whose vocabulary holds
the SID tokens, read by :mod:`zerogr_core.models.checkpoint_folder`, the loader the Decode
page uses) decoding over the user's catalog, or a project checkpoint (``train-movielens``,
``train``) with the SID catalog it was trained on. Both orders decode the same seeded
requests through the public :class:`~zerogr_core.Decoder`; whole decodes are timed in turns,
so both orders see the same load, and at the same implementation quality as the Decode page
times them (:mod:`zerogr_core.bench.order_latency`): on a GPU filtering first as the engine's
CUDA graph and scoring first as the benchmark suite's graphed STATIC-style baseline, on a CPU
both as the reference loop. On a GPU the suite's valid-token STATIC (scoring first with the
softmax over the valid tokens only, filtering first's beams) is timed with them, so the gap of
filtering first to it is the order's cost alone. The report names what each series ran.

Bad input (a missing folder, offsets that are not numbers or do not fit the vocabulary and
the catalog) is a usage error naming the argument: one line, status 2. A bad ``--checkpoint``
(missing, unreadable, foreign, of another model version) is one line naming it and the file,
status 1, read by the loader of every command that takes one
(:func:`~zerogr_core.recsys.bundled.checkpoint_option`).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import numpy as np

from ..arg_types import SEED_MAX, whole
from ..decode.work_limits import check_beams
from ..devices import device_arg, resolved
from ..errors import UsageError, ZeroGRError

#: History items per seeded request of a project checkpoint.
HISTORY_LENGTH = 8
#: Most timed decodes per order.
MAX_REPEATS = 1_000


def register(subparsers) -> None:
    """Add ``compare-orders`` to the CLI's ``subparsers``."""
    p = subparsers.add_parser(
        "compare-orders", help="filtering first vs scoring first on your own model: latency, top-K overlap, "
                               "catalog validity",
        description="Decode the same seeded requests in both orders with a transformers checkpoint folder (T5 "
                    "or a causal LM whose vocabulary holds the SID tokens) over a catalog, or with a project "
                    "checkpoint and its SID catalog.")
    p.add_argument("--catalog", metavar="CATALOG",
                   help="catalog file (.csv/.tsv/.txt/.parquet) or a sample name; required with --model, "
                        "with --checkpoint it must hold the checkpoint's SIDs (default: the checkpoint's catalog)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", metavar="DIR", help="transformers checkpoint folder (save_pretrained)")
    source.add_argument("--checkpoint", metavar="FILE.pt",
                        help="project checkpoint written by train-movielens or train")
    p.add_argument("--offsets", metavar="O1,O2,…",
                   help="with --model: vocabulary id of token 0 of each SID level (default: zerogr.json "
                        "beside the weights)")
    p.add_argument("--batch", type=whole(1), default=4, help="requests per decode (default 4)")
    p.add_argument("--beam", type=whole(1), default=16, help="beam width M (default 16)")
    p.add_argument("--k", type=whole(1), default=10,
                   help="top-K of the overlap (default 10, at most the beam and the catalog)")
    p.add_argument("--repeats", type=whole(2, MAX_REPEATS), default=10,
                   help=f"timed decodes per order, in turns (default 10, at least 2, at most {MAX_REPEATS:,})")
    p.add_argument("--seed", type=whole(0, SEED_MAX), default=0,
                   help="seed of the requests (default 0; at most 2**32 - 1)")
    p.add_argument("--device", type=device_arg, default="cpu",
                   help="torch device: cpu (default), cuda, cuda:N or auto")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run_compare_orders)


@dataclass(frozen=True)
class CompareSettings:
    """The parsed numbers of one comparison.

    Attributes
    ----------
    batch, beam, k, repeats, seed : int
    device : torch.device
    """

    batch: int
    beam: int
    k: int
    repeats: int
    seed: int
    device: object


def _settings(args: argparse.Namespace) -> CompareSettings:
    import torch

    return CompareSettings(args.batch, args.beam, args.k, args.repeats, args.seed,
                           torch.device(resolved(args.device)))


def _check_work(settings: CompareSettings, catalog) -> None:
    """Refuse a comparison whose scoring-first decode is over this machine's work limit (the
    app's limit: :func:`zerogr_core.decode.work_limits.work_limits`)."""
    from ..decode.work_limits import work_limits

    try:
        work_limits(settings.device.type == "cuda").check_decode(settings.batch, settings.beam,
                                                                 catalog.codebook_sizes)
    except ZeroGRError as err:
        raise _as_usage("--batch × --beam", err) from None


def _as_usage(option: str, err: ZeroGRError) -> UsageError:
    """``err`` as a usage error naming ``option`` (once, even when the message already does)."""
    text = " ".join(str(err).split())
    return UsageError(text if text.startswith(option) else f"{option}: {text}")


def _catalog(spec: str):
    from ..catalog.samples import open_catalog

    try:
        return open_catalog(spec)
    except (ZeroGRError, OSError) as err:
        raise _as_usage("--catalog", ZeroGRError(str(err))) from None


def _transformers_inputs(args, settings: CompareSettings, catalog) -> tuple[object, object, object, dict]:
    """Heads, band offsets, prefilled step model and a description of a checkpoint folder."""
    from ..models.checkpoint_folder import OFFSETS_FILE, checkpoint_model, load_model, model_folder, parse_offsets

    try:
        folder = model_folder(args.model, what="--model")
    except ZeroGRError as err:
        raise _as_usage("--model", err) from None
    if args.offsets is not None:
        option = "--offsets"
        try:
            offsets = parse_offsets(args.offsets, what="--offsets")
        except ZeroGRError as err:
            raise _as_usage(option, err) from None
    elif folder.token_offsets is not None:
        option, offsets = f"--offsets (from {OFFSETS_FILE})", folder.token_offsets
    else:
        raise UsageError(f"--offsets: give the vocabulary id of token 0 of each SID level, or put "
                         f"{{\"token_offsets\": [...]}} in {OFFSETS_FILE} beside the weights")
    try:
        model = load_model(folder, settings.device, what="--model")
    except ZeroGRError as err:
        raise _as_usage("--model", err) from None
    try:
        loaded = checkpoint_model(model, offsets, catalog.codebook_sizes)
    except ZeroGRError as err:
        # the head's shape or the offsets: both are what --model and --offsets say together
        raise _as_usage(option if "token_offsets" in str(err) else "--model",
                        ZeroGRError(str(err).removeprefix("token_offsets: "))) from None
    loaded.prefill_random(settings.batch, settings.beam, settings.seed)
    about = dict(kind="transformers", path=folder.path, architecture=type(model).__name__,
                 token_offsets=list(loaded.token_offsets), vocab_size=loaded.vocab_size)
    return loaded.head, loaded.token_offsets, loaded.step_model, about


def _project_inputs(args, settings: CompareSettings) -> tuple[object, object, object, dict, object]:
    """Heads, band offsets, prefilled step model, a description and the catalog of a project checkpoint."""
    from ..recsys.bundled import checkpoint_option, study_step_model

    study = checkpoint_option("--checkpoint", args.checkpoint, device=settings.device)
    catalog = study.catalog
    if args.catalog is not None:
        given = _catalog(args.catalog)
        if given.n_levels != catalog.n_levels or not np.array_equal(given.sids, catalog.sids):
            raise UsageError(f"--catalog: {given.name} is not the SID catalog the checkpoint was trained with "
                             f"({catalog.n_items:,} items); leave --catalog out to use that one")
        catalog = given
    rng = np.random.default_rng(settings.seed)
    histories = [rng.integers(0, catalog.n_items, size=HISTORY_LENGTH) for _ in range(settings.batch)]
    step_model = study_step_model(study, histories, settings.beam)
    about = dict(kind="project", path=str(args.checkpoint), architecture=type(study.model).__name__,
                 token_offsets=None, vocab_size=None)
    return study.model.head_weights(), None, step_model, about, catalog


def _in_catalog(catalog, result) -> dict:
    """Returned beams (finite score), and how many of them are catalog items whose SID is the beam's tokens."""
    rows = result.item_rows.cpu().numpy()
    tokens = result.tokens.cpu().numpy()
    returned = np.isfinite(result.scores.cpu().numpy())
    found = returned & (rows >= 0)
    sids = np.asarray(catalog.sids)[np.where(found, rows, 0)]
    found &= (sids == tokens).all(axis=-1)
    return dict(returned=int(returned.sum()), in_catalog=int(found.sum()),
                all_in_catalog=bool(found.sum() == returned.sum()))


def compare(catalog, heads, band_offsets, step_model, settings: CompareSettings) -> dict:
    """Decode the prefilled requests in both orders and time them in turns.

    Parameters
    ----------
    catalog : Catalog
    heads : torch.Tensor (rows, H) or list of torch.Tensor (|V_l|, H)
        As :class:`~zerogr_core.Decoder` takes them.
    band_offsets : sequence of int or None
        For a shared head.
    step_model : StepModel
        Prefilled with ``settings.batch`` requests; both orders decode from it.
    settings : CompareSettings

    Returns
    -------
    dict
        ``orders`` (order → what ran as ``implementation``, latency statistics in ms and
        the catalog check), ``also_timed`` (series timed besides the orders, here
        :data:`~.order_latency.VALID_TOKENS` where it ran → ``implementation`` and latency
        statistics), ``notes``, ``k``, ``overlap_at_k``, ``share_differ_at_k``,
        ``all_in_catalog``.
    """
    from .. import Decoder, build_index
    from ..recsys.quality import overlap_metrics
    from .order_latency import ORDERS, VALID_TOKENS, LatencyProtocol, order_runs, time_orders

    index = build_index(catalog, device=settings.device)
    decoders = {o: Decoder(index, heads, settings.beam, order=o, band_offsets=band_offsets, catalog=catalog)
                for o in ORDERS}
    # the first decode of each order plans (and on a GPU captures); its lists are the ones compared
    results = {o: d.decode(step_model, settings.batch) for o, d in decoders.items()}
    runs, notes = order_runs(catalog, decoders, step_model, settings.batch)
    latency = time_orders(runs, settings.device, LatencyProtocol(min_repeats=settings.repeats, min_seconds=0.0))
    k = min(settings.k, settings.beam, catalog.n_items)
    a, b = (results[o].item_rows.cpu().numpy() for o in ORDERS)
    overlap, differ, _ = overlap_metrics(a, b, [k])
    orders = {o: dict(_timing(latency[o]), **_in_catalog(catalog, results[o])) for o in ORDERS}
    also = {s: _timing(latency[s]) for s in (VALID_TOKENS,) if s in latency}
    return dict(orders=orders, also_timed=also, notes=notes, k=k, overlap_at_k=overlap[k],
                share_differ_at_k=differ[k], all_in_catalog=all(v["all_in_catalog"] for v in orders.values()))


def _timing(lat) -> dict:
    """What ran and the latency statistics (ms) of one timed series, as the report gives them."""
    stats = lat.stats
    return dict(implementation=lat.implementation, median_ms=stats["median_ms"], p10_ms=stats["p10_ms"],
                p90_ms=stats["p90_ms"], runs=stats["n"])


def run_compare_orders(args: argparse.Namespace) -> None:
    # the command line's own errors come before torch loads (_settings): a usage error answers at once
    check_beams(args.batch, args.beam)
    if args.checkpoint is not None and args.offsets is not None:
        raise UsageError("--offsets: goes with --model (a project checkpoint knows its SID tokens)")
    if args.checkpoint is None and args.catalog is None:
        raise UsageError("--catalog: required with --model (the catalog the model's SIDs come from)")
    settings = _settings(args)
    if args.checkpoint is not None:
        heads, bands, step_model, about, catalog = _project_inputs(args, settings)
        _check_work(settings, catalog)
    else:
        catalog = _catalog(args.catalog)
        _check_work(settings, catalog)
        heads, bands, step_model, about = _transformers_inputs(args, settings, catalog)
    report = dict(catalog=dict(name=catalog.name, items=catalog.n_items, levels=catalog.n_levels,
                               codebook_sizes=[int(v) for v in catalog.codebook_sizes]),
                  model=about, device=str(settings.device), batch=settings.batch, beam=settings.beam,
                  seed=settings.seed, repeats=settings.repeats)
    report.update(compare(catalog, heads, bands, step_model, settings))
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(format_report(report))


def format_report(report: dict) -> str:
    """The report of :func:`run_compare_orders` as text."""
    c, m = report["catalog"], report["model"]
    offsets = f" (token offsets {'/'.join(map(str, m['token_offsets']))})" if m["token_offsets"] else ""
    lines = [f"catalog {c['name']}: {c['items']:,} items, {c['levels']} levels, codebooks "
             f"{'/'.join(map(str, c['codebook_sizes']))}",
             f"model {m['architecture']} from {m['path']}{offsets}: {report['batch']} seeded requests, beam "
             f"{report['beam']}, {report['device']}, {report['repeats']} timed decodes per order in turns"]
    timed = {**report["orders"], **report["also_timed"]}
    w = max(len(name) for name in ["order", *timed])
    lines.append(f"{'order':>{w}}  {'median ms':>10}  {'p10 ms':>9}  {'p90 ms':>9}  {'in catalog':>14}")
    for name, o in timed.items():
        # the catalog check is the orders' (their decodes' results); another series is timed only
        checked = f"{o['in_catalog']:>6,} of {o['returned']:<,}" if "in_catalog" in o else ""
        lines.append(f"{name:>{w}}  {o['median_ms']:10.3f}  {o['p10_ms']:9.3f}  {o['p90_ms']:9.3f}  "
                     f"{checked}".rstrip())
    lines += [f"{name:>{w}}: {o['implementation']}" for name, o in timed.items()]
    lines += [f"note: {n}" for n in report["notes"]]
    k = report["k"]
    lines.append(f"overlap@{k}: {100 * report['overlap_at_k']:.1f} % (requests whose top-{k} differs: "
                 f"{100 * report['share_differ_at_k']:.0f} %)")
    lines.append("every returned item is in the catalog: " + ("yes" if report["all_in_catalog"] else "NO"))
    return "\n".join(lines)
