"""Per-step density of the real Amazon Beauty SID catalogs against the synthetic presets.

The catalog-level density of step l is E_l / (S_l · |V_l|) (:meth:`Catalog.step_stats`,
the Density page's catalog rows): the share of the codebook that is valid after a
prefix, every prefix counted once. With a trained model, the invalid probability mass
per step (what scoring first leaves on tokens that lead to no item) comes from a quality
report's ``invalid_mass`` rows.

``python -m zerogr_core.recsys.analysis [--quality FILE ...] [--out FILE]`` writes the
markdown tables (default ``runs/results/beauty-density.md``); ``--top1-users N`` runs
:func:`top1_disagreements` on N evenly spread test users of the bundled model and saves it
(``runs/results/beauty-top1.json``), which the tables then include.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from ..catalog import Catalog
from ..catalog.synth import SYNTH_PRESETS, generate
from .data import REPO_ROOT, leave_one_out
from .semantic_ids import SIDConfig
from .sequences import BEAUTY_DIR, load_sequences, sequence_semantic_ids

DEFAULT_OUT = REPO_ROOT / "runs" / "results" / "beauty-density.md"
DEFAULT_TOP1 = REPO_ROOT / "runs" / "results" / "beauty-top1.json"


def beauty_catalogs() -> dict[str, Catalog]:
    """The three Beauty SID tables: content RQ-KMeans, content RQ-VAE (tiger-cf files) and
    RQ-KMeans built here from the training interactions of ``Beauty.txt``."""
    out = {}
    for name, sids in (("Beauty, content RQ-KMeans (tiger-cf)", "index_rqkmeans.json"),
                       ("Beauty, content RQ-VAE (tiger-cf)", "index_rqvae.json")):
        data = load_sequences(BEAUTY_DIR / "inter.json", BEAUTY_DIR / sids)
        out[name] = sequence_semantic_ids(data, leave_one_out(data)).catalog
    data = load_sequences(BEAUTY_DIR / "Beauty.txt")
    config = SIDConfig(levels=3, codebook_size=256, collab_dim=64, content_weight=0.0)
    out["Beauty, collaborative RQ-KMeans 3×256 + collision (built here)"] = \
        sequence_semantic_ids(data, leave_one_out(data), config).catalog
    return out


def synthetic_catalogs(n_items: int) -> dict[str, Catalog]:
    """Every synthetic preset at ``n_items`` items (seed 0)."""
    return {f"synthetic {kind}, N = {n_items:,}": generate(kind, n_items, seed=0) for kind in SYNTH_PRESETS}


def density_markdown(catalogs: dict[str, Catalog]) -> str:
    """One row per catalog: codebooks and the catalog-level density and mean branching per step."""
    depth = max(c.n_levels for c in catalogs.values())
    head = "| catalog | items | codebooks | " + " | ".join(f"step {s + 1}" for s in range(depth)) + " |"
    lines = [head, "|" + " --- |" * (3 + depth)]
    for name, cat in catalogs.items():
        steps = cat.step_stats()
        cells = [f"{s['density']:.4f} ({s['mean_segment']:.1f})" for s in steps] + [""] * (depth - len(steps))
        lines.append(f"| {name} | {cat.n_items:,} | {'/'.join(map(str, cat.codebook_sizes))} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def invalid_mass_markdown(reports: dict[str, dict]) -> str:
    """Per step of each report: mean / p90 / p99 invalid mass and beam-weighted density."""
    lines = ["| model | step | beams | mean invalid mass | p90 | p99 | beam density |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, rep in reports.items():
        for row in rep["invalid_mass"]:
            lines.append(f"| {name} | {row['step']} | {row['beams']:,} | {row['mean']:.4f} | {row['p90']:.4f} | "
                         f"{row['p99']:.4f} | {row['beam_density']:.4f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- why the top-1 differs
@torch.no_grad()
def teacher_forced(study, history: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-step log-probabilities of the items ``rows`` after one ``history``, under both orders.

    Parameters
    ----------
    study : StudyModel
    history : np.ndarray, shape (h,), int64
        Catalog rows, oldest first.
    rows : np.ndarray, shape (k,), int64
        Catalog rows of the items to score.

    Returns
    -------
    full : np.ndarray, shape (k, L), float64
        log softmax over the level's whole codebook (what scoring first accumulates).
    valid : np.ndarray, shape (k, L), float64
        log softmax over the tokens valid after the item's prefix (what filtering first
        accumulates). ``valid - full = -log(1 - invalid mass)`` at each step, ≥ 0.
    """
    from .validity import PrefixValidity

    heads = study.model.head_weights()
    validity = PrefixValidity(study.catalog)
    fn = study.model.hidden_fn_for([history], study.sids)
    paths = study.sids[torch.as_tensor(rows, device=study.sids.device)][None]     # (1, k, L)
    full, valid = [], []
    for step in range(paths.shape[2]):
        logits = (fn(step, paths[:, :, :step])[0] @ heads[step].T).float()        # (k, |V_l|)
        keep = validity.mask(paths[0, :, :step]) if step else torch.ones_like(logits, dtype=torch.bool)
        token = paths[0, :, step, None]
        full.append(torch.log_softmax(logits, -1).gather(1, token)[:, 0])
        valid.append(torch.log_softmax(logits.masked_fill(~keep, -torch.inf), -1).gather(1, token)[:, 0])
    return torch.stack(full, 1).double().cpu().numpy(), torch.stack(valid, 1).double().cpu().numpy()


def top1_disagreements(study, histories: list[np.ndarray], *, beam: int = 128, batch_size: int = 64,
                       candidates: int = 5, shrink=(1.0, 0.5, 0.25, 0.1, 0.05)) -> dict:
    """Why filtering first and scoring first return different top-1 items.

    Decodes every history in both orders, then for each request whose top-1 items differ
    (``a`` under filtering first, ``b`` under scoring first) scores both teacher-forced
    under both rules (:func:`teacher_forced`) and classifies the disagreement:

    * ``renormalisation``: each order's top-1 is the better item under its own rule (the
      rules rank a and b oppositely): the renormalisation over valid tokens, ``-Σ log(1 -
      invalid mass)``, outweighs the gap. Inherent to the orders.
    * ``search_score_first`` / ``search_filter_first``: the order's beam lost an item that
      is better under its own rule (beam pruning).
    * ``tie``: the two items' scores agree within 1e-5 under one rule.

    It also checks the decoder's beam score of each top-1 against the teacher-forced score
    (a bug shows as a gap), and estimates how the top-1 agreement would move if the model's
    invalid mass shrank: over the union of both orders' top ``candidates`` items, the item
    maximising ``full + s · (valid - full)`` is compared with scoring first's top-1 for
    each shrink factor ``s`` (s = 1 is filtering first's rule; ``-log(1 - m) ≈ m`` for small
    mass m, so s scales the invalid mass).

    Returns
    -------
    dict
        ``users``, ``differ`` (count), ``classes`` (count per class), ``max_score_error``,
        ``margin_top1_top2`` (per order: min / p10 / median of the beam-score gap between the
        first two items), ``gaps`` (per differing user: the two rules' score gaps and the
        renormalisation term of both items), ``shrink`` ({s: share of users whose top-1
        agrees}).
    """
    from .. import Decoder, build_index

    model = study.model
    index = build_index(study.catalog, device=model.device)
    lists, scores = {}, {}
    for order in ("filter-first", "score-first"):
        decoder = Decoder(index, model.head_weights(), beam, order=order)
        rows, vals = [], []
        for lo in range(0, len(histories), batch_size):
            chunk = histories[lo:lo + batch_size]
            result = decoder.decode(model.hidden_fn_for(chunk, study.sids), len(chunk))
            rows.append(result.item_rows.cpu().numpy())
            vals.append(result.scores.double().cpu().numpy())
        lists[order], scores[order] = np.concatenate(rows), np.concatenate(vals)
    ff, sf = lists["filter-first"], lists["score-first"]
    classes = dict(renormalisation=0, search_score_first=0, search_filter_first=0, tie=0)
    gaps, errors, agree = [], [0.0], {s: 0 for s in shrink}
    for u, history in enumerate(histories):
        pool = np.unique(np.concatenate([ff[u, :candidates], sf[u, :candidates]]))
        pool = pool[pool >= 0]
        full, valid = teacher_forced(study, history, pool)
        total, extra = full.sum(1), (valid - full).sum(1)
        for s in shrink:
            agree[s] += int(pool[np.argmax(total + s * extra)] == sf[u, 0])
        a, b = int(ff[u, 0]), int(sf[u, 0])
        ia, ib = int(np.flatnonzero(pool == a)[0]), int(np.flatnonzero(pool == b)[0])
        errors += [abs(valid[ia].sum() - scores["filter-first"][u, 0]), abs(total[ib] - scores["score-first"][u, 0])]
        if a == b:
            continue
        gap_sf, gap_ff = total[ib] - total[ia], valid[ia].sum() - valid[ib].sum()
        if min(abs(gap_sf), abs(gap_ff)) < 1e-5:
            kind = "tie"
        elif gap_ff >= 0 and gap_sf >= 0:
            kind = "renormalisation"
        elif gap_sf < 0:
            kind = "search_score_first"
        else:
            kind = "search_filter_first"
        classes[kind] += 1
        gaps.append(dict(user=u, kind=kind, score_first_gap=float(gap_sf), filter_first_gap=float(gap_ff),
                         renorm_a=float(extra[ia]), renorm_b=float(extra[ib]),
                         renorm_per_step_a=(valid[ia] - full[ia]).tolist(),
                         renorm_per_step_b=(valid[ib] - full[ib]).tolist()))
    margins = {}
    for order, val in scores.items():
        m = val[:, 0] - val[:, 1]
        margins[order] = dict(min=float(m.min()), p10=float(np.quantile(m, 0.1)), median=float(np.median(m)))
    n = len(histories)
    return dict(users=n, beam=beam, differ=len(gaps), classes=classes, max_score_error=float(max(errors)),
                margin_top1_top2=margins, gaps=gaps, shrink={s: agree[s] / n for s in shrink})


def top1_markdown(diag: dict) -> str:
    """The diagnosis of :func:`top1_disagreements` as text and tables."""
    n, d = diag["users"], diag["differ"]
    c = diag["classes"]
    gaps = diag["gaps"]
    lines = [f"{n} evenly spread test users, beam {diag['beam']}: the top-1 items differ for {d} "
             f"({100 * d / n:.1f} %). Classified by scoring both items teacher-forced under both rules:", "",
             "| renormalisation (rules rank the two oppositely) | score-first beam lost its best | "
             "filter-first beam lost its best | tie (< 1e-5) |", "| --- | --- | --- | --- |",
             f"| {c['renormalisation']} | {c['search_score_first']} | {c['search_filter_first']} | {c['tie']} |", "",
             f"Largest gap between a decoder's beam score and the teacher-forced score of its top-1: "
             f"{diag['max_score_error']:.1e} nats."]
    if gaps:
        gap_sf = np.array([g["score_first_gap"] for g in gaps])
        swing = np.array([g["renorm_a"] - g["renorm_b"] for g in gaps])
        per_a = np.mean([g["renorm_per_step_a"] for g in gaps], axis=0)
        per_b = np.mean([g["renorm_per_step_b"] for g in gaps], axis=0)
        lines.append(f"On the differing users, scoring first prefers its item by a median {np.median(gap_sf):.4f} "
                     f"nats (max {gap_sf.max():.4f}); the renormalisation term favours filtering first's item by a "
                     f"median {np.median(swing):.4f} nats (max {swing.max():.4f}). Mean renormalisation per step "
                     f"(−log of the valid mass), filtering first's item: {' / '.join(f'{v:.4f}' for v in per_a)}; "
                     f"scoring first's item: {' / '.join(f'{v:.4f}' for v in per_b)}.")
    m = diag["margin_top1_top2"]
    lines += ["Beam-score gap between the first two items, all users: " + "; ".join(
        f"{o} min {v['min']:.4f}, p10 {v['p10']:.4f}, median {v['median']:.4f} nats" for o, v in m.items()) + ".",
        "", "Top-1 agreement if the invalid mass shrank by a factor s (rule `full + s · renormalisation` over "
        "both orders' top-5 items; s = 1 is filtering first):", "",
        "| s | " + " | ".join(f"{s:g}" for s in diag["shrink"]) + " |",
        "|" + " --- |" * (1 + len(diag["shrink"])),
        "| top-1 agreement | " + " | ".join(f"{100 * v:.1f} %" for v in diag["shrink"].values()) + " |"]
    return "\n".join(lines)


def beauty_top1(n_users: int, beam: int) -> dict:
    """:func:`top1_disagreements` of the bundled Beauty checkpoint on ``n_users`` spread test users."""
    from .seqrec import BEAUTY_CHECKPOINT, load_data, load_sequence_checkpoint, rows_for
    from .train import fixed_users

    study = load_sequence_checkpoint(BEAUTY_CHECKPOINT, device="cpu")
    data = load_data(None, None, "amazon-beauty")
    split = leave_one_out(data)
    row_of_item = rows_for(study, data, BEAUTY_CHECKPOINT)
    users = fixed_users(split.n_users, n_users)
    return top1_disagreements(study, [row_of_item[split.history(int(u), "test")] for u in users], beam=beam)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quality", nargs="*", default=[], metavar="FILE",
                        help="quality reports (JSON) whose invalid mass per step to tabulate")
    parser.add_argument("--top1-users", type=int, metavar="N",
                        help="diagnose the top-1 disagreements of the bundled Beauty model on N test users and save "
                             "the diagnosis to --top1 (default runs/results/beauty-top1.json)")
    parser.add_argument("--beam", type=int, default=128, help="beam width of that diagnosis (default 128)")
    parser.add_argument("--top1", metavar="FILE", default=str(DEFAULT_TOP1),
                        help="diagnosis JSON to tabulate (written first with --top1-users; skipped when absent)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    beauty = beauty_catalogs()
    n = next(iter(beauty.values())).n_items
    text = ["# Amazon Beauty: per-step density of a real SID catalog", "",
            "Catalog-level density E_l / (S_l·|V_l|) per step, with the mean number of valid tokens per "
            "prefix in brackets (`catalog.step_stats`, the Density page's catalog density). The synthetic "
            f"presets are generated at the same item count ({n:,}).", "",
            density_markdown({**beauty, **synthetic_catalogs(n)}), ""]
    if args.quality:
        reports = {}
        for path in args.quality:
            rep = json.loads(Path(path).read_text())
            reports[f"{rep.get('preset', '?')} preset, {rep['users']:,} users"] = rep
        text += ["## Invalid probability mass per step under scoring first (beam 128, test users)", "",
                 invalid_mass_markdown(reports), ""]
    top1 = Path(args.top1)
    if args.top1_users:
        top1.parent.mkdir(parents=True, exist_ok=True)
        top1.write_text(json.dumps(beauty_top1(args.top1_users, args.beam), indent=1) + "\n")
    if top1.is_file():
        diag = json.loads(top1.read_text())
        diag["shrink"] = {float(k): v for k, v in diag["shrink"].items()}
        text += ["## Why the top-1 items of the two orders differ (bundled `tiger` model)", "",
                 top1_markdown(diag), "",
                 f"From `{top1.name}`, written by `python -m zerogr_core.recsys.analysis --top1-users "
                 f"{diag['users']} --beam {diag['beam']}` (add the `--quality` files above).", ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
