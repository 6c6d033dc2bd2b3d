"""The quality study: filtering first against scoring first on a trained recommender.

For every user the model decodes the next item with beam search (M = 128 by default) in
both orders through :class:`zerogr_core.Decoder`. For K in :data:`KS` the study reports
the overlap of the two top-K lists, Recall@K and NDCG@K of each order and of a popularity
baseline, and the share of users whose top-K lists differ. During the scoring-first
decode it also measures, for every live beam at every step, the probability mass the
model puts on tokens that lead to no catalog item (*invalid mass*): filtering first
renormalises exactly that mass away, so it is what lets the two orders disagree.

The popularity baseline ranks items by training interactions and skips the items the user
has already rated (a stronger baseline than raw popularity, which is reported beside it as
``recall_popularity_unfiltered``); the model's lists are not filtered.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from .. import Decoder, build_index
from ..decode.constraints import RequestLists
from ..decode.heads import Heads
from ..errors import ZeroGRError
from .validity import PrefixValidity

KS = (1, 5, 10, 20, 50, 128)
ORDERS = ("filter-first", "score-first")


@dataclass(frozen=True)
class QualityBars:
    """The bars a quality report is checked against.

    Attributes
    ----------
    name : str
        Preset name, recorded in the report.
    max_gap_pp : float
        Largest |ΔRecall@K| and |ΔNDCG@K| between the orders, in percentage points, over every K.
    min_overlap : float
        Smallest overlap@K between the orders' lists, over every K (a fraction).
    min_recall_at10, min_ndcg_at10 : float or None
        Floors on filtering first's Recall@10 and NDCG@10 (None: no floor).
    """

    name: str
    max_gap_pp: float = 0.5
    min_overlap: float = 0.99
    min_recall_at10: float | None = None
    min_ndcg_at10: float | None = None

    @classmethod
    def preset(cls, name: str) -> "QualityBars":
        """``"study"`` (the claim's bars, any data set: gaps ≤ 0.5 pt, overlap ≥ 99 %) or
        ``"amazon-beauty"`` (the standard benchmark's: gaps ≤ 0.3 pt, overlap ≥ 99.5 %,
        Recall@10 ≥ 0.060 and NDCG@10 ≥ 0.032 with filtering first, the range that
        independent TIGER ports publish)."""
        if name == "study":
            return cls("study")
        if name == "amazon-beauty":
            return cls("amazon-beauty", max_gap_pp=0.3, min_overlap=0.995, min_recall_at10=0.060, min_ndcg_at10=0.032)
        raise ZeroGRError(f"unknown quality bars {name!r} (choose from study, amazon-beauty)")

    @classmethod
    def for_dataset(cls, dataset: str | None) -> "QualityBars":
        """The bars of a bundled data set by name; the study's bars for any other data."""
        return cls.preset("amazon-beauty" if dataset == "amazon-beauty" else "study")



@dataclass
class InvalidMass:
    """Per-step invalid mass of the beams of a scoring-first decode.

    Attributes
    ----------
    values : list of list of torch.Tensor
        ``values[l]`` holds one (n,) float32 tensor per decoded batch: the softmax mass on
        invalid tokens of each live beam at step l.
    densities : list of list of torch.Tensor
        Same shape: the share of level l's codebook that is valid after each beam.
    """

    values: list = field(default_factory=list)
    densities: list = field(default_factory=list)

    def wrap(self, hidden_fn, heads, validity: PrefixValidity, keep: int | None = None):
        """A ``hidden_fn`` that records the mass and valid density, then passes through.

        ``heads``: per-level heads, or a :class:`~zerogr_core.decode.heads.Heads` (a shared
        head is normalised whole, as scoring first does; its band holds the valid tokens).
        ``keep``: record the first ``keep`` requests only (the others pad the batch).
        """
        def recording(step: int, prefixes: torch.Tensor) -> torch.Tensor:
            full = hidden_fn(step, prefixes)
            hidden, prefixes = (full, prefixes) if keep is None else (full[:keep], prefixes[:keep])
            flat = prefixes.reshape(prefixes.shape[0] * prefixes.shape[1], step)
            alive = (flat >= 0).all(dim=1)
            h = hidden.reshape(-1, hidden.shape[-1])[alive]
            weight, band = heads.normaliser(step) if isinstance(heads, Heads) else (heads[step], 0)
            probs = torch.softmax((h @ weight.T).float(), dim=-1)
            band_valid = validity.mask(flat[alive])
            valid = band_valid
            if valid.shape[1] != probs.shape[1]:  # the band of a shared head
                valid = torch.zeros_like(probs, dtype=torch.bool)
                valid[:, band:band + band_valid.shape[1]] = band_valid
            while len(self.values) <= step:
                self.values.append([])
                self.densities.append([])
            self.values[step].append((probs * ~valid).sum(dim=1).cpu())
            self.densities[step].append(band_valid.float().mean(dim=1).cpu())
            return full

        return recording

    def summary(self) -> list[dict]:
        """Per step (1-based): beams, mean/p50/p90/p99/max invalid mass, mean valid density.

        A step where no beam was alive (every request's deny list held its whole catalog
        subtree, e.g. a user who has every item) has no row: there is no mass to measure.
        """
        out = []
        for step, (vals, dens) in enumerate(zip(self.values, self.densities)):
            v = torch.cat(vals).double().numpy()
            if not v.size:
                continue
            q50, q90, q99 = np.quantile(v, [0.5, 0.9, 0.99])
            out.append(dict(step=step + 1, beams=int(v.size), mean=float(v.mean()), p50=float(q50),
                            p90=float(q90), p99=float(q99), max=float(v.max()),
                            beam_density=float(torch.cat(dens).double().mean())))
        return out


SEEN_NORMALISE = "catalog"
"""How a request's history is denied under ``skip_seen``: filtering first keeps the catalog's
normalisation, so the other items rank as with the history kept
(:class:`~zerogr_core.decode.constraints.RequestLists`)."""


def decode_rows(study, histories: list[np.ndarray], order: str, beam: int, batch_size: int,
                index=None, invalid: InvalidMass | None = None, skip_seen: bool = False,
                seen_normalise: str = SEEN_NORMALISE, clock: dict | None = None,
                allow_rows: np.ndarray | None = None, allow_normalise: str = "request") -> np.ndarray:
    """Beam-search the next item of every history.

    Every call decodes ``batch_size`` requests (the last batch is padded by repeating its
    last history, whose beams are dropped), so the run has one shape: one plan, and no
    tail shape planned or compiled for a single call. The next batch (its model inputs
    and its lists) is prepared on the host while the current one decodes on the device.

    Parameters
    ----------
    study : StudyModel
    histories : list of np.ndarray (h_u,) int64
        Catalog rows, oldest first, each non-empty.
    order : {"filter-first", "score-first"}
    beam : int
    batch_size : int
        Requests per decode call.
    index : StepIndex, optional
        Built on the model's device when omitted.
    invalid : InvalidMass, optional
        Filled with the per-beam invalid mass (use with scoring first).
    skip_seen : bool
        Never return an item of the request's own history: each history is the request's
        deny list, enforced inside the decode (:mod:`zerogr_core.decode.constraints`), so
        no beam is spent on an item the user already has. Filtering first keeps the
        catalog's normalisation (``normalise="catalog"``): the other items score as they
        would with the history kept, as when a ranking is filtered afterwards.
    seen_normalise : {"catalog", "request"}
        ``"request"`` normalises filtering first over the request's remaining tokens instead
        (:class:`~zerogr_core.decode.constraints.RequestLists`).
    clock : dict, optional
        Filled with seconds: ``first_call_s`` (the first batch: planning, compiling),
        ``decode_s`` (the other batches' decodes, until their rows are on the host) and
        ``overhead_s`` (host work outside them: model inputs, lists, padding), and ``batches``.
    allow_rows : np.ndarray, shape (A,), int64, optional
        Catalog rows every request is restricted to (one allow list shared by the batch,
        e.g. the cold-start items), enforced inside the decode. Not with ``skip_seen``.
    allow_normalise : {"request", "catalog"}
        What filtering first normalises over under ``allow_rows``: each step's allowed
        tokens (the default), or the catalog's valid tokens, the other items dropped.

    Returns
    -------
    np.ndarray, shape (U, beam), int64
        Catalog rows best first; -1 for unfilled beams.
    """
    if allow_rows is not None and skip_seen:
        raise ZeroGRError("decode_rows: give allow_rows or skip_seen, not both")
    model = study.model
    if index is None:
        index = build_index(study.catalog, device=model.device)
    heads = model.head_weights()
    # A model that stages its requests in static buffers gives one hidden_fn for the run:
    # the engine captures one graph and replays it every batch. A new closure per batch
    # (other models, or the invalid-mass recorder) could be replayed for one batch only, and
    # capturing per batch costs two warm-up decodes and a capture: those decode eagerly.
    staged = model.staged(batch_size, study.sids) if hasattr(model, "staged") and invalid is None else None
    eager = staged is None and order == "filter-first" and index.device.type == "cuda"
    decoder = Decoder(index, heads, beam, order=order, engine="eager" if eager else "auto")
    validity = PrefixValidity(study.catalog) if invalid is not None else None
    out = np.full((len(histories), beam), -1, dtype=np.int64)
    clock = {} if clock is None else clock
    clock.update(first_call_s=0.0, decode_s=0.0, overhead_s=0.0, batches=0)

    def prepare(lo: int):
        chunk = histories[lo:lo + batch_size]
        chunk = chunk + [chunk[-1]] * (batch_size - len(chunk))  # one shape for the whole run
        if allow_rows is not None:
            lists = RequestLists.from_rows(allow=[allow_rows] * len(chunk), normalise=allow_normalise)
        else:
            lists = RequestLists.from_rows(deny=chunk, normalise=seen_normalise) if skip_seen else None
        if staged is not None:
            return chunk, lists
        hidden_fn = model.hidden_fn_for(chunk, study.sids)
        if invalid is not None:
            hidden_fn = invalid.wrap(hidden_fn, heads, validity, keep=len(histories) - lo)
        return hidden_fn, lists

    starts = list(range(0, len(histories), batch_size))
    t0 = time.perf_counter()
    ready = prepare(0) if starts else None
    clock["overhead_s"] += time.perf_counter() - t0
    for i, lo in enumerate(starts):
        t0 = time.perf_counter()
        hidden_fn, lists = ready
        if staged is not None:
            staged.load(hidden_fn)  # stream-ordered after the previous decode
            hidden_fn = staged
        result = decoder.decode(hidden_fn, batch_size, lists=lists)  # asynchronous on a GPU
        t1 = time.perf_counter()
        ready = prepare(starts[i + 1]) if i + 1 < len(starts) else None
        t2 = time.perf_counter()
        n = min(batch_size, len(histories) - lo)
        out[lo:lo + n] = result.item_rows[:n].cpu().numpy()
        t3 = time.perf_counter()
        clock["first_call_s" if i == 0 else "decode_s"] += (t1 - t0) + (t3 - t2)
        clock["overhead_s"] += t2 - t1
        clock["batches"] += 1
    return out


def ranking_metrics(lists: np.ndarray, targets: np.ndarray, ks: Sequence[int]) -> tuple[dict, dict]:
    """Recall@K and NDCG@K of one held-out item per user.

    Parameters
    ----------
    lists : np.ndarray, shape (U, M), int64
        Ranked catalog rows (-1 = empty slot).
    targets : np.ndarray, shape (U,), int64
    ks : sequence of int

    Returns
    -------
    recall, ndcg : dict
        K → float.
    """
    hit = lists == targets[:, None]
    found = hit.any(axis=1)
    rank = hit.argmax(axis=1) + 1          # 1-based; meaningful where found
    gain = 1.0 / np.log2(rank + 1.0)
    recall = {k: float((found & (rank <= k)).mean()) for k in ks}
    ndcg = {k: float(np.where(found & (rank <= k), gain, 0.0).mean()) for k in ks}
    return recall, ndcg


def overlap_metrics(a: np.ndarray, b: np.ndarray, ks: Sequence[int],
                    most: int | None = None) -> tuple[dict, dict, dict]:
    """How far two ranked lists per user agree.

    Parameters
    ----------
    a, b : np.ndarray, shape (U, M), int64
        -1 marks an empty place.
    ks : sequence of int
    most : int, optional
        The most items a list can hold, e.g. the size of the allowed set both were
        restricted to (default: no limit).

    Returns
    -------
    overlap : dict
        K → mean over users of |top-K(a) ∩ top-K(b)| / min(K, ``most``): the share of the
        places both lists can fill that hold the same items.
    share_differ : dict
        K → share of users whose top-K *sets* differ.
    share_order_differ : dict
        K → share of users whose top-K *lists* (order included) differ.
    """
    overlap, differ, order_differ = {}, {}, {}
    for k in ks:
        common = np.array([np.intersect1d(x[:k][x[:k] >= 0], y[:k]).size for x, y in zip(a, b)])
        # a set of fewer than K items leaves places no list can fill: they are not disagreement
        overlap[k] = float((common / min(k, most if most is not None else k)).mean())
        differ[k] = float(np.mean([set(x[:k]) != set(y[:k]) for x, y in zip(a, b)]))
        order_differ[k] = float((a[:, :k] != b[:, :k]).any(axis=1).mean())
    return overlap, differ, order_differ


def popularity_lists(train_counts: np.ndarray, row_of_item: np.ndarray, histories: list[np.ndarray],
                     depth: int, skip_seen: bool = True) -> np.ndarray:
    """Most-rated items first, by default skipping each user's own history.

    Parameters
    ----------
    train_counts : np.ndarray, shape (N,), int64
        Training interactions per item index.
    row_of_item : np.ndarray, shape (N,), int64
    histories : list of np.ndarray
        Catalog rows the user has rated.
    depth : int
        List length.
    skip_seen : bool
        Leave out the items of each user's history.

    Returns
    -------
    np.ndarray, shape (U, depth), int64
        Catalog rows; -1 fills the tail when fewer than ``depth`` items are left.
    """
    ranked = row_of_item[np.argsort(-train_counts, kind="stable")]
    if not skip_seen:
        return np.tile(ranked[:depth], (len(histories), 1))
    out = np.full((len(histories), depth), -1, dtype=np.int64)   # -1: catalog smaller than depth
    for u, hist in enumerate(histories):
        head = ranked[:depth + hist.size]
        kept = head[~np.isin(head, hist)][:depth]
        out[u, :kept.size] = kept
    return out


def evaluate(study, split, users: np.ndarray, stage: str, row_of_item: np.ndarray, *, beam: int = 128,
             batch_size: int = 64, ks: Sequence[int] = KS, measure_invalid: bool = True,
             quality_bars: QualityBars | None = None, skip_seen: bool = False,
             seen_normalise: str = SEEN_NORMALISE) -> dict:
    """Decode ``users`` in both orders and compute every metric of the study.

    Parameters
    ----------
    study : StudyModel
    split : LeaveOneOut
    users : np.ndarray, shape (U,), int64
        User rows to evaluate.
    stage : {"valid", "test"}
    row_of_item : np.ndarray, shape (N,), int64
    beam, batch_size : int
    ks : sequence of int
        Each ≤ ``beam``.
    measure_invalid : bool
        Record the invalid mass of the scoring-first decode.
    quality_bars : QualityBars, optional
        What ``bars`` checks (default: the study's bars).
    skip_seen : bool
        Both orders leave out each user's history items (the full-ranking protocol of
        sequential recommendation); the popularity baseline always does.
    seen_normalise : {"catalog", "request"}
        How the history is denied (:func:`decode_rows`).

    Returns
    -------
    dict
        ``skip_seen``, ``seen_normalise`` (what filtering first normalised a request over
        when its history was denied), ``k``, ``overlap``, ``recall_filter_first``, ``recall_score_first``,
        ``ndcg_filter_first``, ``ndcg_score_first``, ``recall_popularity``,
        ``ndcg_popularity``, ``recall_popularity_unfiltered``, ``ndcg_popularity_unfiltered``,
        ``share_differ``, ``share_order_differ`` (each keyed by K),
        ``invalid_mass`` (per step), ``top10_filter_first`` (U × 10 item ids), ``timing``.
    """
    if max(ks) > beam:
        raise ZeroGRError(f"--beam {beam} is smaller than the largest K ({max(ks)})")
    histories = [row_of_item[split.history(int(u), stage)] for u in users]
    targets = row_of_item[split.targets(stage)[users]]
    index = build_index(study.catalog, device=study.model.device)
    lists, timing = {}, {}
    invalid = InvalidMass() if measure_invalid else None
    for order in ORDERS:
        start = time.perf_counter()
        clock: dict = {}
        lists[order] = decode_rows(study, histories, order, beam, batch_size, index,
                                   invalid if order == "score-first" else None, skip_seen=skip_seen,
                                   seen_normalise=seen_normalise, clock=clock)
        timing[f"{order}_s"] = time.perf_counter() - start
        for part in ("first_call_s", "decode_s", "overhead_s"):
            timing[f"{order}_{part}"] = clock[part]
    overlap, differ, order_differ = overlap_metrics(lists["filter-first"], lists["score-first"], ks)
    rec_ff, ndcg_ff = ranking_metrics(lists["filter-first"], targets, ks)
    rec_sf, ndcg_sf = ranking_metrics(lists["score-first"], targets, ks)
    counts = split.train_counts(row_of_item.size)
    rec_pop, ndcg_pop = ranking_metrics(popularity_lists(counts, row_of_item, histories, max(ks)), targets, ks)
    rec_raw, ndcg_raw = ranking_metrics(
        popularity_lists(counts, row_of_item, histories, max(ks), skip_seen=False), targets, ks)
    key = lambda d: {str(k): v for k, v in d.items()}  # noqa: E731 — JSON keys are strings
    report = dict(
        k=list(ks), overlap=key(overlap), recall_filter_first=key(rec_ff), recall_score_first=key(rec_sf),
        ndcg_filter_first=key(ndcg_ff), ndcg_score_first=key(ndcg_sf), recall_popularity=key(rec_pop),
        ndcg_popularity=key(ndcg_pop), recall_popularity_unfiltered=key(rec_raw),
        ndcg_popularity_unfiltered=key(ndcg_raw), share_differ=key(differ), share_order_differ=key(order_differ),
        stage=stage, users=int(len(users)), beam=beam, skip_seen=skip_seen,
        seen_normalise=seen_normalise if skip_seen else None,
        top10_filter_first=study.catalog.item_ids[np.maximum(lists["filter-first"][:, :10], 0)].tolist(),
        timing=timing)
    if invalid is not None:
        report["invalid_mass"] = invalid.summary()
    report["bars"] = bars(report, quality_bars)
    return report


def bars(report: dict, spec: QualityBars | None = None) -> dict:
    """Check a report from :func:`evaluate` against ``spec`` (default: the study's bars).

    Returns
    -------
    dict
        ``preset`` and its thresholds (``max_gap_pp``, ``min_overlap_bar``, and
        ``min_recall_at10``/``min_ndcg_at10`` where set), the measured ``max_recall_gap_pp``,
        ``max_ndcg_gap_pp``, ``min_overlap``, and a boolean per bar: ``recall_gap_ok``,
        ``ndcg_gap_ok``, ``overlap_ok``, ``beats_popularity`` (Recall@10 of both orders
        above popularity's), and ``recall_ok``/``ndcg_ok`` where a floor is set (at K = 10,
        or the largest K below it when 10 was not measured); ``at_k``: the K those last
        bars compared, so a report of a beam under 10 is not labelled @10.
    """
    spec = spec or QualityBars.preset("study")
    ks = [str(k) for k in report["k"]]
    gap_recall = max(abs(report["recall_filter_first"][k] - report["recall_score_first"][k]) for k in ks)
    gap_ndcg = max(abs(report["ndcg_filter_first"][k] - report["ndcg_score_first"][k]) for k in ks)
    min_overlap = min(report["overlap"][k] for k in ks)
    at10 = "10" if "10" in ks else ks[-1]
    out = dict(preset=spec.name, at_k=int(at10), max_gap_pp=spec.max_gap_pp, min_overlap_bar=spec.min_overlap,
               max_recall_gap_pp=100 * gap_recall, max_ndcg_gap_pp=100 * gap_ndcg, min_overlap=min_overlap,
               recall_gap_ok=100 * gap_recall <= spec.max_gap_pp, ndcg_gap_ok=100 * gap_ndcg <= spec.max_gap_pp,
               overlap_ok=min_overlap >= spec.min_overlap,
               beats_popularity=min(report["recall_filter_first"][at10], report["recall_score_first"][at10])
               > report["recall_popularity"][at10])
    if spec.min_recall_at10 is not None:
        out.update(min_recall_at10=spec.min_recall_at10,
                   recall_ok=report["recall_filter_first"][at10] >= spec.min_recall_at10)
    if spec.min_ndcg_at10 is not None:
        out.update(min_ndcg_at10=spec.min_ndcg_at10, ndcg_ok=report["ndcg_filter_first"][at10] >= spec.min_ndcg_at10)
    return out


#: Rows of the quality tables of docs/results.md: label → report key (overlap in per cent).
TABLE_ROWS = (("overlap@K (filter-first vs score-first)", "overlap"), ("Recall@K filter-first", "recall_filter_first"),
              ("Recall@K score-first", "recall_score_first"), ("NDCG@K filter-first", "ndcg_filter_first"),
              ("NDCG@K score-first", "ndcg_score_first"), ("Recall@K popularity", "recall_popularity"),
              ("NDCG@K popularity", "ndcg_popularity"))


def markdown_table(report: dict, rows=TABLE_ROWS) -> str:
    """The results table of a study report: one column per K, overlap in per cent (two
    decimals), Recall and NDCG with four decimals."""
    ks = [str(k) for k in report["k"]]
    lines = ["| K | " + " | ".join(ks) + " |", "|" + " --- |" * (1 + len(ks))]
    for label, key in rows:
        cells = [f"{100 * report[key][k]:.2f} %" if key == "overlap" else f"{report[key][k]:.4f}" for k in ks]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def study_report(study, data, split, users: np.ndarray, row_of_item: np.ndarray, *, beam: int = 128,
                 batch_size: int = 64, ks: Sequence[int] = KS, checkpoint=None,
                 quality_bars: QualityBars | None = None, skip_seen: bool = False,
                 seen_normalise: str = SEEN_NORMALISE) -> dict:
    """:func:`evaluate` on the test stage, plus what produced it (data, SIDs, model, training).

    Returns
    -------
    dict
        The keys of :func:`evaluate` (without the per-user lists) and ``data``, ``sid``,
        ``model``, ``config`` (the study preset), ``training`` (time, device, final
        validation loss), ``checkpoint``, ``seed``, ``device``, ``torch``.
    """
    report = evaluate(study, split, users, "test", row_of_item, beam=beam, batch_size=batch_size, ks=ks,
                      quality_bars=quality_bars, skip_seen=skip_seen, seen_normalise=seen_normalise)
    del report["top10_filter_first"]
    meta = study.meta
    report.update(
        data=data.summary(),
        sid=meta["sid_report"],
        model=study.model.describe(),
        config=meta["study"],
        training=dict(seconds=meta["train_seconds"],
                      median_epoch_s=float(np.median([h["seconds"] for h in meta["history"]])),
                      device=meta["device"], torch=meta["torch"], epochs_run=len(meta["history"]),
                      final_valid_loss=meta["history"][-1]["valid_loss"]),
        checkpoint=str(checkpoint) if checkpoint is not None else "bundled (sample_catalogs/movielens/model.pt)",
        seed=meta["study"]["train"]["seed"], device=str(study.model.device), torch=str(torch.__version__))
    return report


def write_plot(report: dict, path) -> None:
    """Write the study's figure as a self-contained-but-for-plotly.js HTML page.

    Four panels: overlap@K with the report's overlap bar; Recall@K and NDCG@K for both orders and
    popularity; the invalid mass per step (mean, p90, p99) under scoring first.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ks = [str(k) for k in report["k"]]
    x = [int(k) for k in ks]
    fig = make_subplots(rows=2, cols=2, subplot_titles=(
        "Overlap@K, filtering first vs scoring first", "Recall@K", "NDCG@K",
        "Invalid mass per step under scoring first"))
    fig.add_trace(go.Scatter(x=x, y=[100 * report["overlap"][k] for k in ks], mode="lines+markers",
                             name="overlap %"), row=1, col=1)
    bar = report.get("bars", {}).get("min_overlap_bar", QualityBars.preset("study").min_overlap)
    fig.add_hline(y=100 * bar, line_dash="dash", annotation_text=f"{100 * bar:g} % bar", row=1, col=1)
    styles = (("filter_first", "filter first", "solid"), ("score_first", "score first", "dot"),
              ("popularity", "popularity", "dash"),
              ("popularity_unfiltered", "popularity, rated items kept", "dashdot"))
    for col, metric in ((2, "recall"), (1, "ndcg")):
        row = 1 if metric == "recall" else 2
        for key, label, dash in styles:
            fig.add_trace(go.Scatter(x=x, y=[report[f"{metric}_{key}"][k] for k in ks], mode="lines+markers",
                                     name=f"{metric.upper() if metric == 'ndcg' else 'Recall'} {label}",
                                     line=dict(dash=dash)), row=row, col=col)
    steps = [f"step {r['step']}" for r in report["invalid_mass"]]
    for stat in ("mean", "p90", "p99"):
        fig.add_trace(go.Bar(x=steps, y=[r[stat] for r in report["invalid_mass"]], name=f"invalid mass {stat}"),
                      row=2, col=2)
    for row, col in ((1, 1), (1, 2), (2, 1)):
        fig.update_xaxes(type="log", title_text="K", row=row, col=col)
    b = report["bars"]
    fig.update_layout(
        height=800, width=1200, barmode="group",
        title=(f"{report['data']['layout']}: {report['users']} users, beam {report['beam']} — min overlap "
               f"{100 * b['min_overlap']:.2f} %, max |ΔRecall| {b['max_recall_gap_pp']:.2f} pp, "
               f"max |ΔNDCG| {b['max_ndcg_gap_pp']:.2f} pp"))
    fig.write_html(str(path), include_plotlyjs="cdn")
