"""The validity-term ablation: plain training against training with the catalog-validity term.

Two quality reports of the same recipe, data and user sample, one per checkpoint (written by
``python -m zerogr_core quality ... --results DIR``), become one Markdown document: a side-by-side
summary (overlap, Recall and NDCG of both orders, the gaps between the orders, invalid mass per
step, training), each report's per-K table and the invalid mass per step. docs/results.md quotes the
summary table; a test checks that it matches the committed reports.

``python -m zerogr_core.recsys.ablation [REPORT ...] [--out FILE]`` (default: the two Amazon
Beauty ``cpu`` preset reports under ``runs/results/beauty-ablation/``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import ZeroGRError
from .data import REPO_ROOT

ABLATION_DIR = REPO_ROOT / "runs" / "results" / "beauty-ablation"
DEFAULT_OUT = REPO_ROOT / "runs" / "results" / "beauty-ablation.md"
#: The script that trains the checkpoints and writes the default reports and document.
SCRIPT = REPO_ROOT / "runs" / "beauty_ablation.sh"
DEFAULT_REPORTS = (ABLATION_DIR / "quality-amazon-beauty-cpu.json",
                   ABLATION_DIR / "rerun" / "quality-amazon-beauty-cpu.json",
                   ABLATION_DIR / "quality-amazon-beauty-cpu-validity0.625.json",
                   ABLATION_DIR / "rerun" / "quality-amazon-beauty-cpu-validity0.625.json")


def script_commands(script: Path = SCRIPT) -> list[str]:
    """The commands of ``script`` (comments, ``set`` and blank lines left out)."""
    return [line for line in script.read_text().splitlines()
            if line.strip() and not line.startswith(("#", "set "))]


def validity_weight(report: dict) -> float:
    """The validity-term weight a report's checkpoint was trained with (0: plain)."""
    return float(report["config"]["train"].get("validity_weight", 0.0))


def run_label(report: dict) -> str:
    """Column label of a report: the checkpoint file and its training objective."""
    weight = validity_weight(report)
    term = f"validity term W = {weight:g}" if weight > 0 else "plain"
    return f"{term} (`{Path(report['checkpoint']).name}`)"


def _pair(report: dict, metric: str, k: str) -> str:
    return f"{report[f'{metric}_filter_first'][k]:.4f} / {report[f'{metric}_score_first'][k]:.4f}"


def _invalid(report: dict) -> str:
    return " / ".join(f"{100 * row['mean']:.1f}" for row in report["invalid_mass"][1:]) + " %"


#: Summary rows: label → cell of one report. A label's {first_k}, {last_k} and {selection_k} are the
#: reports' (they share one recipe and Ks): the Ks measured and the K the model selection decoded.
SUMMARY_ROWS = (
    ("overlap@1", lambda r: f"{100 * r['overlap']['1']:.2f} %"),
    ("overlap@10", lambda r: f"{100 * r['overlap']['10']:.2f} %"),
    ("min overlap over K = {first_k} … {last_k}", lambda r: f"{100 * r['bars']['min_overlap']:.2f} %"),
    ("Recall@5 filter-first / score-first", lambda r: _pair(r, "recall", "5")),
    ("Recall@10 filter-first / score-first", lambda r: _pair(r, "recall", "10")),
    ("NDCG@5 filter-first / score-first", lambda r: _pair(r, "ndcg", "5")),
    ("NDCG@10 filter-first / score-first", lambda r: _pair(r, "ndcg", "10")),
    ("max over K of \\|ΔRecall@K\\| / \\|ΔNDCG@K\\|",
     lambda r: f"{r['bars']['max_recall_gap_pp']:.2f} / {r['bars']['max_ndcg_gap_pp']:.2f} pt"),
    ("Recall@10 popularity", lambda r: f"{r['recall_popularity']['10']:.4f}"),
    ("mean invalid mass under scoring first, steps 2 / 3 / 4", _invalid),
    ("kept epoch, validation Recall@{selection_k} / NDCG@{selection_k}",
     lambda r: f"{r['selection']['epoch']}, {r['selection']['recall']:.4f} / {r['selection']['ndcg']:.4f}"),
    ("training", lambda r: f"{r['training']['epochs_run']} epochs, {r['training']['seconds'] / 60:.1f} min "
                           f"on {r['training']['device']}"),
)


#: The Ks the summary rows read: every report must hold them.
SUMMARY_KS = ("1", "5", "10")


def check_comparable(reports: list[dict], paths) -> None:
    """Refuse reports that differ in anything but the checkpoint (data, users, beam, Ks, recipe)."""
    first = reports[0]

    def recipe(r):
        train = {k: v for k, v in r["config"]["train"].items() if k != "validity_weight"}
        return dict(r["config"], train=train)

    for rep, path in zip(reports[1:], paths[1:]):
        for what, get in (("data", lambda r: r["data"]["fingerprint"]), ("users", lambda r: r["users"]),
                          ("beam", lambda r: r["beam"]), ("k", lambda r: r["k"]), ("recipe", recipe)):
            if get(rep) != get(first):
                raise ZeroGRError(f"{path}: field {what!r} differs from {paths[0]}'s; an ablation compares one "
                                  f"recipe on one user sample")


def summary_table(reports: list[dict]) -> str:
    """Side-by-side Markdown table, one column per report."""
    head = f"{reports[0]['users']:,} test users, beam {reports[0]['beam']}"
    lines = [f"| {head} | " + " | ".join(run_label(r) for r in reports) + " |",
             "|" + " --- |" * (1 + len(reports))]
    ks = reports[0]["k"]
    # a validation decode under beam 10 selected at K = 5; reports written before selection.k, at 10
    names = dict(first_k=ks[0], last_k=ks[-1], selection_k=reports[0]["selection"].get("k", 10))
    for label, cell in SUMMARY_ROWS:
        lines.append(f"| {label.format(**names)} | " + " | ".join(cell(r) for r in reports) + " |")
    return "\n".join(lines)


def ablation_document(paths) -> str:
    """The Markdown document of the reports at ``paths`` (the first is the baseline).

    Raises
    ------
    ZeroGRError
        A missing or foreign report, reports of different recipes or user samples, or reports
        without the Ks the summary compares (:data:`SUMMARY_KS`).
    """
    from .analysis import invalid_mass_markdown
    from .quality import markdown_table

    paths = [Path(p) for p in paths]
    reports = []
    for path in paths:
        if not path.is_file():
            raise ZeroGRError(f"{path}: quality report not found")
        try:
            reports.append(json.loads(path.read_text()))
        except json.JSONDecodeError as exc:
            raise ZeroGRError(f"{path}: not a JSON quality report (line {exc.lineno})") from None
        if "config" not in reports[-1] or "selection" not in reports[-1]:
            raise ZeroGRError(f"{path}: not a sequence-model quality report (no config or selection)")
    if len(reports) < 2:
        raise ZeroGRError("an ablation needs two or more quality reports")
    check_comparable(reports, paths)
    measured = [str(k) for k in reports[0]["k"]]
    if not set(SUMMARY_KS) <= set(measured):
        # a report of quality --beam under 10 holds no K = 10: the summary failed with KeyError: '10'
        raise ZeroGRError(f"{paths[0]}: field 'k' is {reports[0]['k']}; the summary compares K = "
                          f"{', '.join(SUMMARY_KS)}: write the reports with quality --beam 10 or more")
    shown = [str(p.resolve().relative_to(REPO_ROOT)) if p.resolve().is_relative_to(REPO_ROOT) else str(p)
             for p in paths]
    tc = reports[0]["config"]["train"]
    text = ["# Amazon Beauty: the catalog-validity term as an ablation", "",
            f"Same data, recipe (`{reports[0]['preset']}` preset: {tc['epochs']} epochs, batch {tc['batch_size']}, "
            f"peak lr {tc['lr']:g}, seed {tc['seed']}, budget {tc['max_minutes']} min) and "
            f"{reports[0]['users']:,} evenly spread test users (leave-one-out, full ranking by constrained beam "
            f"search, beam {reports[0]['beam']}, both orders); only the training objective differs. "
            "Filtering first / scoring first in each pair. Validation scores are the model-selection decode's "
            f"({tc['eval_users']:,} validation users, beam {tc['eval_beam']}); training minutes are wall-clock on "
            "shared CPU cores, so they vary with the machine's load.", "",
            f"Produced by `bash {SCRIPT.relative_to(REPO_ROOT)}` (repository root, two CPU cores):", "",
            "```bash", *script_commands(), "```", "",
            "Reports: " + ", ".join(f"`{s}`" for s in shown) + ".", "",
            summary_table(reports), ""]
    for rep in reports:
        text += [f"## {run_label(rep)}", "", markdown_table(rep), ""]
    text += ["## Invalid probability mass per step under scoring first", "",
             invalid_mass_markdown({run_label(r): r for r in reports}), ""]
    return "\n".join(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reports", nargs="*", default=[str(p) for p in DEFAULT_REPORTS],
                        help="quality reports, the baseline first (default: the Beauty cpu-preset pair)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="Markdown document to write")
    args = parser.parse_args(argv)
    text = ablation_document(args.reports)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    try:
        main()
    except ZeroGRError as err:
        raise SystemExit(f"error: {err}") from None
