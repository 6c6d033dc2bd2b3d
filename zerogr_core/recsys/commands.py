"""CLI commands of the MovieLens study: ``train-movielens`` and ``quality``.

:func:`register` adds both to ``python -m zerogr_core``. Heavy imports (Polars, plotly)
happen inside the handlers, so the CLI starts fast.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..arg_types import SEED_MAX, minutes, number, whole
from ..devices import device_arg
from ..errors import UsageError

RESULTS_DIR = Path(__file__).resolve().parents[2] / "runs" / "results"


def register(subparsers) -> None:
    """Add ``train-movielens`` and ``quality`` to the CLI's ``subparsers``."""
    p = subparsers.add_parser("train-movielens", help="build semantic IDs and train the MovieLens recommender")
    p.add_argument("--data", metavar="DIR", help="MovieLens directory: ml-latest-small, ML-1M or ML-100K "
                   "layout (default: the bundled ml-latest-small)")
    p.add_argument("--out", metavar="FILE", help="checkpoint file to write (default, only without --data: "
                   "the bundled sample_catalogs/movielens/model.pt)")
    p.add_argument("--catalog", metavar="FILE", help="SID catalog to write (default: <--out stem>.sid_catalog.csv "
                   "beside --out; sid_catalog.csv for the bundled model)")
    p.add_argument("--preset", choices=("shipped", "tiny"), default="shipped",
                   help="model, SID and training preset (default: shipped)")
    p.add_argument("--device", type=device_arg, default="auto",
                   help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--json", action="store_true", help="print the checkpoint's metadata as JSON at the end")
    p.set_defaults(handler=run_train)

    t = subparsers.add_parser("train", help="train the T5 (TIGER) recommender on a sequence data set")
    t.add_argument("--data", metavar="PATH", help="interactions: JSON {user: [items]} or a 'user item item ...' "
                   "sequence file")
    t.add_argument("--sids", metavar="FILE", help="JSON SID file {item: [t1..tL]} (default: build SIDs by "
                   "RQ-KMeans on the training interactions)")
    t.add_argument("--dataset", choices=("amazon-beauty",), help="a bundled data set instead of --data")
    t.add_argument("--preset", choices=("tiger", "tiger-paper", "cpu", "tiny"), default="cpu",
                   help="recipe: tiger (GPU, TIGER's architecture), tiger-paper (the same model on the TIGER "
                   "paper's schedule: batch 256, 390 epochs, inverse-sqrt learning rate from 0.01), cpu (<= 15 min "
                   "on 2 cores), tiny (tests)")
    t.add_argument("--out", metavar="FILE", required=True, help="checkpoint file to write")
    t.add_argument("--max-minutes", type=minutes(), metavar="M", help="wall-clock budget of the training loop "
                   "(overrides the preset's; the best validation weights so far are kept)")
    t.add_argument("--seed", type=whole(0, SEED_MAX), help="override the preset's seed (at most 2**32 - 1)")
    t.add_argument("--lr", type=number(positive=True), metavar="LR", help="override the preset's peak learning rate")
    t.add_argument("--patience", type=whole(1), metavar="N", help="override the preset's early stopping: validation "
                   "decodes without a better NDCG@10 before training stops")
    t.add_argument("--validity-weight", type=number(0), metavar="W", help="add the catalog-validity term with weight W "
                   "per token (the ablation; default 0, plain cross-entropy; 0.625 matches the MovieLens recipe)")
    t.add_argument("--device", type=device_arg, default="auto",
                   help="torch device (default: cuda when available, else cpu)")
    t.add_argument("--amp", choices=("bf16",), help="autocast the training forward passes in bfloat16 (CUDA only; "
                   "weights, loss and AdamW stay FP32; recorded in the checkpoint)")
    t.add_argument("--compile", action="store_true", help="run each training batch through torch.compile at one "
                   "static shape (fewer, fused kernels; the first batches pay the compilation)")
    t.add_argument("--cuda-graph", action="store_true", help="capture each full batch's training step (forward, "
                   "backward, clipping, AdamW) in one CUDA graph and replay it (CUDA only; the step of a small "
                   "model is bound by launching its operators one by one)")
    t.add_argument("--state", metavar="FILE", help="training state written after every epoch, for --resume "
                   "(default with --resume or --stop-after-minutes: <out>.state.pt)")
    t.add_argument("--resume", action="store_true", help="continue the run saved in --state (same data, preset "
                   "and options)")
    t.add_argument("--stop-after-minutes", type=minutes(), metavar="M", help="stop this call between epochs after at "
                   "most M minutes of wall clock, state saved, without ending the schedule (continue with --resume)")
    t.set_defaults(handler=run_train_sequences)

    q = subparsers.add_parser("quality", help="filtering first vs scoring first on the trained recommender")
    q.add_argument("--data", metavar="PATH", help="MovieLens directory the checkpoint was trained on "
                   "(default: the bundled ml-latest-small), or the interactions file of a sequence "
                   "checkpoint (JSON or sequence file)")
    q.add_argument("--sids", metavar="FILE", help="SID file the sequence checkpoint was trained with")
    q.add_argument("--dataset", choices=("amazon-beauty",), help="a bundled sequence data set (its default "
                   "checkpoint: sample_catalogs/<dataset>/model.pt)")
    q.add_argument("--checkpoint", metavar="FILE", help="checkpoint (default: the bundled model)")
    q.add_argument("--beam", type=whole(1), default=128, help="beam width M (default 128)")
    q.add_argument("--users", type=whole(1), metavar="N", help="evaluate N evenly spread users (default: all)")
    q.add_argument("--batch-size", type=whole(1), default=64, help="requests per decode call (default 64)")
    q.add_argument("--seen", choices=("skip", "keep"), help="whether decoding may return an item of the user's "
                   "own history: skip (the default for a sequence data set, the full-ranking protocol of "
                   "sequential recommendation: each history is the request's deny list) or keep (the default "
                   "for MovieLens, as its shipped study was measured); the popularity baseline always skips")
    q.add_argument("--seen-normalise", choices=("catalog", "request"), default="catalog",
                   help="with --seen skip, what filtering first normalises over: the catalog's valid tokens, "
                   "the history items dropped afterwards so the other items score as with the history kept "
                   "(the default), or the request's remaining tokens")
    q.add_argument("--device", type=device_arg, default="cpu",
                   help="torch device (default cpu; 'auto' picks cuda if present)")
    q.add_argument("--results", metavar="DIR", default=str(RESULTS_DIR),
                   help="where the report goes (default runs/results): quality.json and quality.html for "
                   "MovieLens, quality-<data>-<preset>[-validity<W>].json for a sequence checkpoint")
    q.add_argument("--json", action="store_true", help="print the report as JSON")
    q.set_defaults(handler=run_quality)


def run_train(args: argparse.Namespace) -> None:
    if args.out is None and args.data is not None:  # before torch loads (the import below)
        raise UsageError("--out FILE is required with --data (the bundled checkpoint belongs to the bundled data)")
    from .train import BUNDLED_CHECKPOINT, train_movielens

    out = args.out if args.out is not None else BUNDLED_CHECKPOINT
    quiet = args.json
    meta = train_movielens(args.data, out, catalog_path=args.catalog, preset=args.preset, device=args.device,
                           log=(lambda line: None) if quiet else print)
    if args.json:
        print(json.dumps(meta, indent=2))


def run_quality(args: argparse.Namespace) -> None:
    from ..decode.work_limits import check_beams

    batch = min(args.batch_size, args.users) if args.users else args.batch_size  # what one decode holds
    check_beams(batch, args.beam, "--batch-size × --beam")  # before torch loads (the imports below)
    sequence_file = args.data is not None and Path(args.data).is_file()
    if args.data is not None and args.dataset is not None:
        raise UsageError("give exactly one of --data PATH or --dataset NAME")
    if sequence_file and args.checkpoint is None:
        raise UsageError("--checkpoint FILE is required with --data (the bundled model belongs to --dataset)")
    from .bundled import RETRAIN_MOVIELENS, checkpoint_option
    from .data import leave_one_out, load_movielens
    from .quality import KS, study_report, write_plot
    from .train import fixed_users, load_checkpoint

    if args.dataset is not None or sequence_file:
        return run_sequence_quality(args)
    start = time.perf_counter()
    if args.checkpoint is None:
        study = load_checkpoint(None, device=args.device)
    else:
        study = checkpoint_option("--checkpoint", args.checkpoint, load_checkpoint, RETRAIN_MOVIELENS, args.device)
    data = load_movielens(args.data)
    split = leave_one_out(data)
    row_of_item = study.rows_of_items(data)
    users = fixed_users(split.n_users, args.users if args.users is not None else split.n_users)
    ks = [k for k in KS if k <= args.beam]
    report = study_report(study, data, split, users, row_of_item, beam=args.beam, batch_size=args.batch_size,
                          ks=ks, checkpoint=args.checkpoint, skip_seen=args.seen == "skip",
                          seen_normalise=args.seen_normalise)
    report["timing"]["total_s"] = time.perf_counter() - start
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    (results / "quality.json").write_text(json.dumps(report, indent=2) + "\n")
    write_plot(report, results / "quality.html")
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(format_report(report))
    print(f"wrote {results / 'quality.json'} and {results / 'quality.html'}")


def run_train_sequences(args: argparse.Namespace) -> None:
    import shlex

    # checked here as well as in load_data: that one runs after torch loads (the imports below)
    if (args.data is None) == (args.dataset is None):
        raise UsageError("give exactly one of --data PATH or --dataset NAME")
    from .seqrec import load_data, train_sequences

    call_start = time.perf_counter()
    data = load_data(args.data, args.sids, args.dataset)
    meta = train_sequences(data, args.out, preset=args.preset, device=args.device, max_minutes=args.max_minutes,
                           seed=args.seed, lr=args.lr, patience=args.patience,
                           validity_weight=args.validity_weight, amp=args.amp, state=args.state,
                           resume=args.resume, stop_after_minutes=args.stop_after_minutes, call_start=call_start,
                           compile=args.compile, cuda_graph=args.cuda_graph)
    if meta["finished"]:
        if args.resume or args.stop_after_minutes is not None:
            print(f"finished: {meta['selection']['stopped']} after epoch {len(meta['history'])} of "
                  f"{meta['study']['train']['epochs']} ({meta['train_seconds'] / 60:.1f} min of training in all); "
                  f"checkpoint {args.out}")
        return
    argv = ["train"]
    for name in ("data", "sids", "dataset", "preset", "out", "max_minutes", "seed", "lr", "patience",
                 "validity_weight", "device", "amp", "stop_after_minutes"):
        if getattr(args, name) is not None:
            argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    argv += ["--compile"] if args.compile else []
    argv += ["--cuda-graph"] if args.cuda_graph else []
    argv += ["--state", meta["state"], "--resume"]
    print(f"stopped after {meta['call_seconds'] / 60:.1f} min (epoch {meta['epoch']} of {meta['epochs']}, "
          f"{meta['train_seconds'] / 60:.1f} min of training in all; state {meta['state']}); resume with: "
          f"python -m zerogr_core {shlex.join(argv)}")


def run_sequence_quality(args: argparse.Namespace) -> None:
    """``quality`` on a sequence data set and a T5 checkpoint (all users unless --users)."""
    from .bundled import RETRAIN_SEQUENCE, checkpoint_option
    from .data import leave_one_out
    from .quality import KS, QualityBars, study_report
    from .seqrec import BEAUTY_CHECKPOINT, load_data, load_sequence_checkpoint, rows_for
    from .train import fixed_users

    start = time.perf_counter()
    checkpoint = args.checkpoint if args.checkpoint is not None else BEAUTY_CHECKPOINT
    data = load_data(args.data, args.sids, args.dataset)
    if args.checkpoint is None:
        study = load_sequence_checkpoint(checkpoint, device=args.device)
    else:
        study = checkpoint_option("--checkpoint", checkpoint, load_sequence_checkpoint, RETRAIN_SEQUENCE, args.device)
    split = leave_one_out(data)
    row_of_item = rows_for(study, data, checkpoint, "--data" if args.data is not None else "--dataset",
                           "--checkpoint" if args.checkpoint is not None else None)
    users = fixed_users(split.n_users, args.users if args.users is not None else split.n_users)
    ks = [k for k in KS if k <= args.beam]
    report = study_report(study, data, split, users, row_of_item, beam=args.beam, batch_size=args.batch_size,
                          ks=ks, checkpoint=checkpoint, quality_bars=QualityBars.for_dataset(args.dataset),
                          skip_seen=args.seen != "keep", seen_normalise=args.seen_normalise)
    from .train import file_sha256

    report["checkpoint_sha256"] = file_sha256(Path(checkpoint))
    report["preset"] = study.meta["study"]["name"]
    report["selection"] = study.meta["selection"]
    report["learning_curve"] = study.meta["history"]
    report["timing"]["total_s"] = time.perf_counter() - start
    name = args.dataset or Path(data.directory).stem
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    weight = study.meta["study"]["train"].get("validity_weight", 0.0)
    # A validity-term checkpoint of a preset gets its own file, so the ablation keeps both reports.
    variant = f"-validity{weight:g}" if weight > 0 else ""
    out = results / f"quality-{name}-{report['preset']}{variant}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(format_report(report))
    print(f"wrote {out}")


def format_report(report: dict) -> str:
    """Human-readable tables of a study report."""
    lines = [f"{report['data']['layout']}: {report['users']} test users, beam {report['beam']}, model "
             f"{report['model']['parameters']:,} parameters, codebooks "
             f"{'/'.join(map(str, report['sid']['codebook_sizes']))} (collision rate "
             f"{report['sid']['collision_rate']:.3f})"]
    head = f"{'K':>5} {'overlap':>8} {'differ':>7} {'R@K ff':>8} {'R@K sf':>8} {'R@K pop':>8} " \
           f"{'N@K ff':>8} {'N@K sf':>8} {'N@K pop':>8}"
    lines.append(head)
    for k in map(str, report["k"]):
        lines.append(f"{k:>5} {report['overlap'][k]:8.4f} {report['share_differ'][k]:7.3f} "
                     f"{report['recall_filter_first'][k]:8.4f} {report['recall_score_first'][k]:8.4f} "
                     f"{report['recall_popularity'][k]:8.4f} {report['ndcg_filter_first'][k]:8.4f} "
                     f"{report['ndcg_score_first'][k]:8.4f} {report['ndcg_popularity'][k]:8.4f}")
    lines.append("popularity keeping already-rated items: Recall@K " + " ".join(
        f"{report['recall_popularity_unfiltered'][k]:.4f}" for k in map(str, report["k"])))
    lines.append("invalid mass under scoring first (per live beam):")
    lines.append(f"{'step':>5} {'mean':>8} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8} {'density':>8}")
    for row in report["invalid_mass"]:
        lines.append(f"{row['step']:>5} {row['mean']:8.4f} {row['p50']:8.4f} {row['p90']:8.4f} {row['p99']:8.4f} "
                     f"{row['max']:8.4f} {row['beam_density']:8.4f}")
    from .quality import QualityBars

    b = report["bars"]
    ok = lambda flag: "ok" if b[flag] else "MISSED"  # noqa: E731
    study = QualityBars.preset("study")         # what reports written before the presets were held to
    gap = b.get("max_gap_pp", study.max_gap_pp)
    at = b.get("at_k", 10)                      # reports written before at_k compared K = 10
    line = (f"bars ({b.get('preset', 'study')}): max |ΔRecall| {b['max_recall_gap_pp']:.2f} pp ≤ {gap:g} "
            f"({ok('recall_gap_ok')}), max |ΔNDCG| {b['max_ndcg_gap_pp']:.2f} pp ≤ {gap:g} ({ok('ndcg_gap_ok')}), "
            f"min overlap {100 * b['min_overlap']:.2f} % ≥ {100 * b.get('min_overlap_bar', study.min_overlap):g} % "
            f"({ok('overlap_ok')}), Recall@{at} above popularity: {'yes' if b['beats_popularity'] else 'NO'}")
    if "recall_ok" in b:
        line += f", Recall@{at} ≥ {b['min_recall_at10']:g} ({ok('recall_ok')})"
    if "ndcg_ok" in b:
        line += f", NDCG@{at} ≥ {b['min_ndcg_at10']:g} ({ok('ndcg_ok')})"
    lines.append(line)
    t = report.get("timing", {})
    if all(f"{o}_decode_s" in t for o in ("filter-first", "score-first")):
        lines.append("clock (s): " + "; ".join(
            f"{o} decode {t[f'{o}_decode_s']:.2f} + first call {t[f'{o}_first_call_s']:.2f} + host overhead "
            f"{t[f'{o}_overhead_s']:.2f} (total {t[f'{o}_s']:.2f})" for o in ("filter-first", "score-first")))
    return "\n".join(lines)
