"""The cold-start items study (the STATIC paper's Table 3) and its ``coldstart`` command.

One call, :func:`run_cold_study`, takes a sequence file with content semantic IDs and:

1. draws the cold-start items and splits the data (:func:`~.cold_items.cold_split`);
2. trains the T5 recommender on the warm part through :func:`~.seqrec.train_sequences`
   (the split recorded in the checkpoint) or loads a checkpoint trained that way;
3. trains the content two-tower baseline on the same warm transitions
   (:mod:`.dense_retrieval`);
4. ranks the cold test sequences' targets five ways: the model *unconstrained*, a
   uniformly *random* cold item (the expected value, exact), *dense* retrieval over the
   cold items, and constrained beam search restricted to the cold items through
   :class:`~zerogr_core.Decoder`'s allow lists, *filter-first* (each step normalised over
   the allowed tokens) and *score-first* (normalised over the whole codebook, then masked);
5. reports Recall@1/5/10 and NDCG@1/5/10 per method, and the overlap of the two orders'
   top-K.

Semantic IDs must come from item content: the command refuses to build them from the
interactions it evaluates on (no ``--sids``), and says in its report which file they came
from. Beam width 20, as the paper's.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..arg_types import SEED_MAX, minutes, whole
from ..devices import device_arg
from ..errors import UsageError, ZeroGRError, check_output_file

#: Methods of the report, in table order.
METHODS = ("unconstrained", "random", "dense", "filter-first", "score-first")
#: Cut-offs of the report.
KS = (1, 5, 10)


@dataclass(frozen=True)
class ColdStudyConfig:
    """How the study trains and decodes.

    Attributes
    ----------
    name : str
        The generative model's :class:`~.seqrec.SeqPreset` name.
    dense : str
        The two-tower baseline's :class:`~.dense_retrieval.DenseConfig` preset.
    beam : int
        Beam width of every decode (the paper's 20).
    batch_size : int
        Requests per decode call.
    """

    name: str
    dense: str
    beam: int = 20
    batch_size: int = 64

    @classmethod
    def preset(cls, name: str) -> "ColdStudyConfig":
        """``"cpu"``, ``"tiger"`` (GPU) or ``"tiny"`` (tests, beam 10): the same-named model presets."""
        if name not in ("cpu", "tiger", "tiny"):
            raise ZeroGRError(f"--preset: unknown preset {name!r} (choose from cpu, tiger, tiny)")
        # Tests decode through the Triton interpreter: a narrower beam keeps them fast.
        return cls(name=name, dense=name, beam=10 if name == "tiny" else 20)


def random_expectation(n_allowed: int, ks=KS) -> tuple[dict, dict]:
    """Expected Recall@K and NDCG@K of a uniformly random ranking of ``n_allowed`` items,
    one of which is the target.

    Returns
    -------
    recall, ndcg : dict
        K → float: ``min(K, n)/n`` and ``(1/n) Σ_{r ≤ min(K, n)} 1/log2(r + 1)``.
    """
    recall, ndcg = {}, {}
    for k in ks:
        top = min(k, n_allowed)
        recall[k] = top / n_allowed
        ndcg[k] = float(np.sum(1.0 / np.log2(np.arange(1, top + 1) + 1.0)) / n_allowed)
    return recall, ndcg


def _keyed(metrics: dict) -> dict:
    return {str(k): float(v) for k, v in metrics.items()}


def _paths_check(data_path, sids_path) -> None:
    # usage errors (exit status 2): both paths are the command's options, checked before any file is read
    if data_path is None:
        raise UsageError("--data FILE is required (a JSON {user: [items]} or 'user item item ...' sequence file)")
    if sids_path is None:
        raise UsageError("--sids FILE is required: the cold-start study needs content semantic IDs (e.g. "
                          "index_rqkmeans.json, from item text); SIDs built from the interactions it evaluates "
                          "on would carry the cold items' interactions")


def _read_checkpoint(checkpoint, device):
    """The model of ``--checkpoint``; every failure is one line naming the argument and the file."""
    from .bundled import checkpoint_option
    from .seqrec import load_sequence_checkpoint

    return checkpoint_option("--checkpoint", checkpoint, load_sequence_checkpoint,
                             "python -m zerogr_core coldstart --out FILE", device)


def _load_or_train(split, config: ColdStudyConfig, device, seed: int, max_minutes, out, checkpoint, study,
                   cuda_graph, log):
    """The generative model of the study: ``study``, read from ``checkpoint`` (checked to hold
    this split), or a fresh one trained on ``split.warm`` and written to ``out`` (a temporary
    file when None)."""
    from .seqrec import load_sequence_checkpoint, train_sequences

    record = split.record()
    if checkpoint is not None:
        theirs = study.meta.get("split") or {}
        for key in ("kind", "share", "seed", "cold_sha256"):
            if theirs.get(key) != record[key]:
                raise ZeroGRError(f"--checkpoint {checkpoint}: trained on another split ({key} is "
                                  f"{theirs.get(key)!r} there, {record[key]!r} here); train it with this "
                                  f"command's --out")
        return study, Path(checkpoint)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(out) if out is not None else Path(tmp) / "cold-model.pt"
        train_sequences(split.warm, path, preset=config.name, device=device, seed=seed, max_minutes=max_minutes,
                        split_record=record, cuda_graph=cuda_graph, log=log)
        study = load_sequence_checkpoint(path, device=device)
    return study, (Path(out) if out is not None else None)


def run_cold_study(data_path, sids_path, share: float, *, preset: str = "cpu", device="auto", seed: int = 0,
                   users: int | None = None, max_minutes: float | None = None, out=None, checkpoint=None,
                   cuda_graph: bool = False, log=print) -> dict:
    """Run the whole cold-start items study; returns its report.

    Parameters
    ----------
    data_path : str or Path
        Interactions (JSON or sequence file, :func:`~.sequences.load_sequences`).
    sids_path : str or Path
        The content SID file of every catalog item, cold ones included.
    share : float
        Share of the catalog drawn as cold, in (0, 1).
    preset : {"cpu", "tiger", "tiny"}
    device : str
        Where training and decoding run (``"auto"``: CUDA when available).
    seed : int
        Seeds the cold draw, the model's training and the baseline's.
    users : int, optional
        Evaluate this many cold test sequences, evenly spread (default: all).
    max_minutes : float, optional
        Override the preset's training budget of the generative model.
    out : str or Path, optional
        Keep the trained checkpoint here (default: a temporary file, removed).
    checkpoint : str or Path, optional
        Evaluate this checkpoint (written by this study with the same data, share and
        seed) instead of training.
    cuda_graph : bool
        Train the generative model's steps from one CUDA graph (``train --cuda-graph``).
    log : callable(str)

    Returns
    -------
    dict
        JSON-ready: ``cold_share`` (``share`` as asked), ``cold_share_drawn`` (the share of
        the catalog made cold: ``round(share × N)`` items, at least one), ``n_cold_items``,
        ``n_cold_test``, ``recall`` and ``ndcg`` (method → K →
        value, K in ``"1"``, ``"5"``, ``"10"``), ``overlap`` (K → mean share of the two
        orders' top-K in common, out of min(K, cold items) places), ``share_differ``, the split
        record, model, baseline and timing details, and ``targets`` (the issue's checks).
    """
    from .cold_items import cold_split
    from .data import leave_one_out
    from .dense_retrieval import DenseConfig, dense_rank, train_dense
    from .quality import decode_rows, overlap_metrics, ranking_metrics
    from .seqrec import rows_for
    from .seqrec_config import SeqPreset
    from .seqrec_train import transitions
    from .sequences import load_sequences
    from .train import fixed_users, resolve_device

    _paths_check(data_path, sids_path)
    if users is not None and users < 1:
        raise ZeroGRError(f"--users must be ≥ 1, got {users}")
    if max_minutes is not None and not max_minutes > 0:
        raise ZeroGRError(f"--max-minutes must be > 0, got {max_minutes}")
    config = ColdStudyConfig.preset(preset)
    dev = resolve_device(device)
    start = time.perf_counter()
    # read before the data: loading and splitting it takes seconds (Amazon Beauty) that a bad file need not wait
    loaded = None if checkpoint is None else _read_checkpoint(checkpoint, dev)
    data = load_sequences(data_path, sids_path)
    log(f"semantic IDs from {sids_path}, taken as content SIDs (item metadata, not these interactions); "
        f"the study is only meaningful if they are")
    split = cold_split(data, share, seed)
    # round(share × N), at least one: the share made cold can be far from the one asked on a small catalog
    drawn = split.cold_items.size / data.n_items
    log(f"cold-start items: {split.cold_items.size} of {data.n_items} ({100 * drawn:.3g} %; --cold {share:g}, "
        f"seed {seed}); "
        f"{split.removed_interactions} interactions removed; {split.warm.n_users} warm users; "
        f"{split.test_targets.size} cold test sequences ({split.empty_history_tests} without a warm history dropped)")
    t_train = time.perf_counter()
    study, kept = _load_or_train(split, config, dev, seed, max_minutes, out, checkpoint, loaded, cuda_graph, log)
    train_s = time.perf_counter() - t_train
    warm_split = leave_one_out(split.warm)
    row_of_item = rows_for(study, split.warm, checkpoint or "the trained model", "--data",
                           "--checkpoint" if checkpoint is not None else None)
    cold_rows = np.sort(row_of_item[split.cold_items])
    chosen = fixed_users(split.test_targets.size, users if users is not None else split.test_targets.size)
    histories = [row_of_item[split.test_histories[int(t)]] for t in chosen]
    targets = row_of_item[split.test_targets[chosen]]

    t_dense = time.perf_counter()
    dense_config = replace(DenseConfig.preset(config.dense), seed=seed)
    n_content = data.sid_codes.shape[1]
    codes = study.catalog.sids[:, :n_content].astype(np.int64)
    rows, lengths, tgts = transitions(warm_split, row_of_item, dense_config.max_items, None)
    is_cold = np.zeros(study.catalog.n_items, dtype=bool)
    is_cold[cold_rows] = True
    valid_users = fixed_users(warm_split.n_users, dense_config.eval_users)
    dense_model, dense_record = train_dense(
        dense_config, codes, rows, lengths, tgts, np.flatnonzero(~is_cold),
        [row_of_item[warm_split.history(int(u), "valid")] for u in valid_users],
        row_of_item[warm_split.valid_items[valid_users]], dev, log=log)
    dense_s = time.perf_counter() - t_dense

    t_eval = time.perf_counter()
    depth = max(KS)
    lists = {"dense": dense_rank(dense_model, histories, cold_rows, depth)}
    lists["unconstrained"] = decode_rows(study, histories, "unconstrained", config.beam, config.batch_size)
    for order in ("filter-first", "score-first"):
        lists[order] = decode_rows(study, histories, order, config.beam, config.batch_size, allow_rows=cold_rows)
    # Diagnostic: filtering first normalised over the catalog's valid tokens, the non-cold items dropped
    # afterwards; it separates the effect of renormalising over the allowed tokens from the orders' beams.
    catalog_ff = decode_rows(study, histories, "filter-first", config.beam, config.batch_size, allow_rows=cold_rows,
                             allow_normalise="catalog")
    eval_s = time.perf_counter() - t_eval
    recall, ndcg = {}, {}
    for method in METHODS:
        if method == "random":
            r, n = random_expectation(int(cold_rows.size), KS)
        else:
            r, n = ranking_metrics(lists[method][:, :depth], targets, KS)
        recall[method], ndcg[method] = _keyed(r), _keyed(n)
    # the lists hold cold items only: with fewer cold items than K, the empty places are no disagreement
    n_cold = int(cold_rows.size)
    overlap, differ, order_differ = overlap_metrics(lists["filter-first"], lists["score-first"], KS, most=n_cold)
    r, n = ranking_metrics(catalog_ff[:, :depth], targets, KS)
    vs_score, _, _ = overlap_metrics(catalog_ff, lists["score-first"], KS, most=n_cold)
    vs_filter, _, _ = overlap_metrics(catalog_ff, lists["filter-first"], KS, most=n_cold)
    diagnostic = dict(description="filter-first with the allow list normalised over the catalog's valid tokens "
                                  "(normalise='catalog') instead of the allowed ones",
                      recall=_keyed(r), ndcg=_keyed(n), overlap_with_score_first=_keyed(vs_score),
                      overlap_with_filter_first=_keyed(vs_filter))
    top = lists["unconstrained"][:, :depth]
    unconstrained = dict(cold_share_of_top10=float(np.isin(top, cold_rows).mean()),
                         invalid_share_of_top10=float((top < 0).mean()))
    record = split.record()
    record.pop("cold_item_ids")
    seq = SeqPreset.preset(config.name)
    report = dict(
        study="cold-start items (STATIC Table 3 setting)", cold_share=split.share, cold_share_drawn=drawn,
        seed=split.seed,
        n_cold_items=int(cold_rows.size), n_cold_test=int(len(chosen)), k=list(KS), beam=config.beam,
        recall=recall, ndcg=ndcg, overlap=_keyed(overlap), share_differ=_keyed(differ),
        share_order_differ=_keyed(order_differ), unconstrained=unconstrained,
        filter_first_catalog_normalised=diagnostic,
        sid_source=dict(file=Path(sids_path).name, levels=int(n_content),
                        note="taken as content SIDs (from item metadata); the command refuses to build SIDs "
                             "from the interactions it evaluates on"),
        split=record, data=data.summary(), warm_data=split.warm.summary(),
        model=dict(preset=config.name, architecture=asdict(seq.model),
                   parameters=int(sum(p.numel() for p in study.model.parameters())),
                   train_seconds=study.meta.get("train_seconds"), selection=study.meta.get("selection"),
                   epochs_run=len(study.meta.get("history", [])), trained_on=study.meta.get("device"),
                   checkpoint=str(kept) if kept is not None else None),
        dense=dict(description="two towers over content SIDs: item = sum of per-level code embeddings + residual "
                               "MLP; user = MLP of the newest history item's content vector and the history's "
                               "mean; sampled softmax over warm items only; ranks the cold items", **dense_record),
        device=str(dev), timing=dict(train_s=train_s, dense_s=dense_s, decode_s=eval_s,
                                     total_s=time.perf_counter() - start))
    report["targets"] = targets_check(report)
    return report


def targets_check(report: dict) -> dict:
    """The issue's targets, checked on a report (Recall@1 unless said otherwise)."""
    r1 = {m: report["recall"][m]["1"] for m in METHODS}
    best = max(r1["filter-first"], r1["score-first"])
    gap_pp = 100 * abs(r1["filter-first"] - r1["score-first"])
    return dict(unconstrained_zero=r1["unconstrained"] == 0.0,
                constrained_over_random=best / r1["random"],
                over_random={m: r1[m] / r1["random"] for m in ("filter-first", "score-first")},
                beats_random_5x=min(r1["filter-first"], r1["score-first"]) >= 5 * r1["random"],
                beats_dense=min(r1["filter-first"], r1["score-first"]) > r1["dense"],
                orders_recall1_gap_pp=gap_pp, orders_gap_ok=gap_pp <= 0.2)


def _drawn(report: dict) -> float:
    """The share of the catalog a report made cold (not --cold: the count is rounded, at least one)."""
    return report["n_cold_items"] / report["data"]["items"]


def format_cold_report(report: dict) -> str:
    """A plain-text table of a study report."""
    lines = [f"cold-start items: {report['n_cold_items']} cold ({100 * _drawn(report):.3g} % of "
             f"{report['data']['items']}), {report['n_cold_test']} cold test sequences, beam {report['beam']}, "
             f"model {report['model']['preset']} ({report['model']['parameters']:,} parameters)",
             f"{'method':<14}" + "".join(f"{'R@' + k:>9}" for k in map(str, KS)) + f"{'NDCG@10':>9}"]
    for m in METHODS:
        lines.append(f"{m:<14}" + "".join(f"{100 * report['recall'][m][str(k)]:8.2f}%" for k in KS)
                     + f"{100 * report['ndcg'][m]['10']:8.2f}%")
    lines.append("overlap of the two orders' top-K: " + ", ".join(f"@{k} {report['overlap'][str(k)]:.4f}"
                                                               for k in KS))
    d = report["filter_first_catalog_normalised"]
    lines.append("filter-first normalised over the catalog (diagnostic): R@K " + ", ".join(
        f"@{k} {100 * d['recall'][str(k)]:.2f}%" for k in KS) + "; overlap with score-first " + ", ".join(
        f"@{k} {d['overlap_with_score_first'][str(k)]:.4f}" for k in KS))
    t = report["targets"]
    ratios = t.get("over_random") or {"best order": t["constrained_over_random"]}
    lines.append(f"targets (both orders): unconstrained R@1 = 0: {t['unconstrained_zero']}; constrained ≥ 5× "
                 f"random: {t['beats_random_5x']} (" + ", ".join(f"{m} {v:.1f}×" for m, v in ratios.items())
                 + f"); beats dense: {t['beats_dense']}; "
                 f"orders' R@1 gap {t['orders_recall1_gap_pp']:.2f} pp ≤ 0.2: {t['orders_gap_ok']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- CLI
def register(subparsers) -> None:
    """Add ``coldstart`` (the cold-start items study) to the CLI's ``subparsers``."""
    p = subparsers.add_parser("coldstart", help="cold-start items study: hold out a share of the catalog's items, "
                              "train on the rest, recommend the cold-start items by constrained decoding (both "
                              "orders) vs unconstrained, random and a content two-tower baseline")
    p.add_argument("--data", metavar="FILE", help="interactions: JSON {user: [items]} or a 'user item item ...' file")
    p.add_argument("--sids", metavar="FILE", help="content SID file {item: [t1..tL]} covering every item, "
                   "cold-start items included (required: SIDs must not come from these interactions)")
    p.add_argument("--cold", type=float, default=0.02, metavar="SHARE",
                   help="share of the catalog's items drawn as cold-start items (default 0.02)")
    p.add_argument("--preset", choices=("cpu", "tiger", "tiny"), default="cpu",
                   help="model and baseline recipe: cpu (minutes on 2 cores), tiger (GPU), tiny (tests)")
    p.add_argument("--device", type=device_arg, default="auto",
                   help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--seed", type=whole(0, SEED_MAX), default=0,
                   help="seeds the cold-start item draw and both trainings (default 0; at most 2**32 - 1)")
    p.add_argument("--users", type=whole(1), metavar="N",
                   help="evaluate N evenly spread cold test sequences (default: all)")
    p.add_argument("--max-minutes", type=minutes(), metavar="M", help="training budget of the generative model "
                   "(overrides the preset's)")
    p.add_argument("--cuda-graph", action="store_true", help="train from one CUDA graph per step (as train "
                   "--cuda-graph; CUDA only)")
    p.add_argument("--out", metavar="FILE", help="keep the trained checkpoint here (default: not kept)")
    p.add_argument("--checkpoint", metavar="FILE", help="evaluate this checkpoint (written by coldstart --out with "
                   "the same data, --cold and --seed) instead of training")
    p.add_argument("--results", metavar="FILE", help="also write the report to this JSON file")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(handler=run_coldstart)


def run_coldstart(args: argparse.Namespace) -> None:
    from .cold_items import check_share

    check_share(args.cold)
    _paths_check(args.data, args.sids)
    if args.out is not None and args.checkpoint is not None:
        raise UsageError("--out and --checkpoint exclude each other (--checkpoint skips training)")
    if args.results is not None and Path(args.results).suffix.lower() != ".json":
        raise ZeroGRError(f"--results {args.results}: the report is written as .json")
    # checked before the study: a bad path otherwise failed only when its result was written
    for what, path in (("--out", args.out), ("--results", args.results)):
        if path is not None:
            check_output_file(path, what)
    report = run_cold_study(args.data, args.sids, args.cold, preset=args.preset, device=args.device, seed=args.seed,
                            users=args.users, max_minutes=args.max_minutes, out=args.out,
                            checkpoint=args.checkpoint, cuda_graph=args.cuda_graph,
                            log=(lambda line: None) if args.json else print)
    if args.results is not None:
        path = Path(args.results)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report))
        return
    print(format_cold_report(report))
    if args.results is not None:
        print(f"wrote {args.results}")


#: STATIC paper, Table 3, Amazon Beauty, Recall@1 in % (1 B-parameter Gemma-architecture model, RQ-VAE SIDs
#: of 4 × 256, beam 20); keyed by cold share, then method.
PAPER_BEAUTY_RECALL1 = {
    0.02: {"unconstrained": 0.00, "random": 0.42, "dense": 0.88, "constrained": 4.29},
    0.05: {"unconstrained": 0.00, "random": 0.17, "dense": 0.63, "constrained": 1.60},
}


def markdown_table(reports: list[dict]) -> str:
    """Markdown rows, one per report and method: Recall@1/5/10 and NDCG@10 in %, the paper's
    Beauty Recall@1 beside ours where its share is one of the paper's, and the orders' overlap.
    The cold share shown is the share drawn (cold items / catalog items)."""
    lines = ["| cold share | cold test seqs | method | R@1 | R@5 | R@10 | NDCG@10 | paper R@1 (Beauty) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for report in reports:
        paper = PAPER_BEAUTY_RECALL1.get(round(report["cold_share"], 4), {})
        for m in METHODS:
            ours = paper.get("constrained" if m in ("filter-first", "score-first") else m)
            cells = [f"{100 * report['recall'][m][str(k)]:.2f}" for k in KS] + [f"{100 * report['ndcg'][m]['10']:.2f}"]
            lines.append(f"| {100 * _drawn(report):.3g} % | {report['n_cold_test']} | {m} | " + " | ".join(cells)
                         + f" | {'' if ours is None else f'{ours:.2f}'} |")
        lines.append(f"| {100 * _drawn(report):.3g} % | | overlap of the two orders' top-K | "
                     + " | ".join(f"{100 * report['overlap'][str(k)]:.1f}" for k in KS) + " | | |")
    return "\n".join(lines)
