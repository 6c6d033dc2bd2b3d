"""Learning curves of sequence-model checkpoints, from the history each one records.

A checkpoint written by :func:`~zerogr_core.recsys.seqrec.train_sequences` keeps, per
epoch, the training loss, the validation loss, the learning rate at the epoch's end, the
elapsed time and, every ``eval_every`` epochs, validation Recall@10 / NDCG@10 by
constrained beam search; plus the recipe (preset, seed) and which epoch was kept. This
module turns that record into a Markdown table and a Plotly figure, so the curves are
regenerated from the shipped file alone:

``python -m zerogr_core.recsys.curves CHECKPOINT [CHECKPOINT ...] [--out FILE.md] [--html FILE.html]``
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ZeroGRError
from .data import REPO_ROOT

DEFAULT_CHECKPOINTS = (REPO_ROOT / "sample_catalogs" / "amazon-beauty" / "model.pt",
                       REPO_ROOT / "sample_catalogs" / "amazon-beauty" / "model-cpu.pt")
DEFAULT_OUT = REPO_ROOT / "runs" / "results" / "beauty-learning-curves.md"


def read_history(path: str | Path) -> dict:
    """The recipe, selection and per-epoch history of a sequence checkpoint (weights not kept).

    Raises
    ------
    ZeroGRError
        Missing or foreign file, or a checkpoint without a history.
    """
    from .seqrec import CHECKPOINT_FORMAT
    from .train import read_checkpoint

    blob = read_checkpoint(Path(path), CHECKPOINT_FORMAT)
    if not blob.get("history"):
        raise ZeroGRError(f"{path}: the checkpoint records no training history")
    return dict(path=str(path), preset=blob["study"]["name"], train=blob["study"]["train"],
                selection=blob["selection"], history=blob["history"], device=blob.get("device", "?"),
                torch=blob.get("torch", "?"), train_seconds=blob.get("train_seconds"))


def objective(train: dict) -> str:
    """The training objective of a recipe, in words."""
    weight = train.get("validity_weight", 0.0)
    return (f"cross-entropy plus the validity term, W = {weight:g} (the train loss is the whole objective, the "
            "valid loss the cross-entropy alone)") if weight > 0 else "plain cross-entropy"


def run_name(run: dict) -> str:
    """Legend name of a run: its preset, marked when trained with the validity term."""
    weight = run["train"].get("validity_weight", 0.0)
    return f"{run['preset']} + validity {weight:g}" if weight > 0 else run["preset"]


def curve_markdown(run: dict) -> str:
    """One table row per epoch; validation ranking cells are empty on epochs without a decode."""
    tc, sel = run["train"], run["selection"]
    lines = [f"### `{run['preset']}` preset ({Path(run['path']).name})", "",
             f"Trained on {run['device']} (torch {run['torch']}), seed {tc['seed']}, batch {tc['batch_size']}, "
             f"peak lr {tc['lr']:g}, budget {tc['max_minutes'] if tc['max_minutes'] is not None else 'none'} min; "
             f"validation decodes of {tc['eval_users']:,} users at beam {tc['eval_beam']} every "
             f"{tc['eval_every']} epoch(s); {objective(tc)}. Kept epoch {sel['epoch']} (validation NDCG@{sel.get('k', 10)} "
             f"{sel['ndcg']:.4f}, Recall@{sel.get('k', 10)} {sel['recall']:.4f}); stopped by {sel['stopped']}.", "",
             "| epoch | minutes | lr at end | train loss | valid loss | valid Recall@10 | valid NDCG@10 |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for h in run["history"]:
        valid_loss = h["valid_loss"][0] if isinstance(h["valid_loss"], list) else h["valid_loss"]
        ranking = (f"{h['valid_recall']:.4f} | {h['valid_ndcg']:.4f}" if "valid_ndcg" in h else " | ")
        kept = " (kept)" if h["epoch"] == sel["epoch"] else ""
        lines.append(f"| {h['epoch']}{kept} | {h['elapsed_s'] / 60:.1f} | {h['lr']:.2e} | {h['train_loss']:.4f} | "
                     f"{valid_loss:.4f} | {ranking} |")
    return "\n".join(lines)


def curves_figure(runs: list[dict]):
    """Plotly figure: losses, validation Recall@10 / NDCG@10 and learning rate against minutes."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=3, subplot_titles=("Loss per token", "Validation ranking (beam search)",
                                                         "Learning rate"))
    for run in runs:
        hist, name = run["history"], run_name(run)
        minutes = [h["elapsed_s"] / 60 for h in hist]
        fig.add_trace(go.Scatter(x=minutes, y=[h["train_loss"] for h in hist], name=f"{name} train loss"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=minutes, y=[h["valid_loss"][0] if isinstance(h["valid_loss"], list)
                                               else h["valid_loss"] for h in hist],
                                 name=f"{name} valid loss", line=dict(dash="dot")), row=1, col=1)
        ranked = [h for h in hist if "valid_ndcg" in h]
        for key, dash in (("valid_recall", "solid"), ("valid_ndcg", "dot")):
            fig.add_trace(go.Scatter(x=[h["elapsed_s"] / 60 for h in ranked], y=[h[key] for h in ranked],
                                     mode="lines+markers", line=dict(dash=dash),
                                     name=f"{name} {'Recall@10' if key == 'valid_recall' else 'NDCG@10'}"),
                          row=1, col=2)
        fig.add_trace(go.Scatter(x=minutes, y=[h["lr"] for h in hist], name=f"{name} lr"), row=1, col=3)
    for col in (1, 2, 3):
        fig.update_xaxes(title_text="minutes of training", row=1, col=col)
    fig.update_layout(height=450, width=1350, title="Learning curves of the Amazon Beauty checkpoints")
    return fig


def curves_document(checkpoints) -> tuple[str, list[dict]]:
    """The Markdown document of ``checkpoints`` (with the command that regenerates it) and their runs."""
    runs = [read_history(p) for p in checkpoints]
    shown = []
    for p in checkpoints:
        full = Path(p).resolve()
        shown.append(str(full.relative_to(REPO_ROOT)) if full.is_relative_to(REPO_ROOT) else str(p))
    text = ["# Amazon Beauty: learning curves of the shipped checkpoints", "",
            "From each checkpoint's recorded history (`meta.history`); regenerate with "
            f"`python -m zerogr_core.recsys.curves {' '.join(shown)}`.", ""]
    for run in runs:
        text += [curve_markdown(run), ""]
    return "\n".join(text), runs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoints", nargs="*", default=[str(p) for p in DEFAULT_CHECKPOINTS],
                        help="sequence checkpoints (default: the bundled Amazon Beauty models)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="Markdown tables to write")
    parser.add_argument("--html", help="Plotly figure to write (default: the --out path with .html)")
    args = parser.parse_args(argv)
    text, runs = curves_document(args.checkpoints)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    html = Path(args.html) if args.html else out.with_suffix(".html")
    curves_figure(runs).write_html(str(html), include_plotlyjs="cdn")
    print(f"wrote {out} and {html}")


if __name__ == "__main__":
    try:
        main()
    except ZeroGRError as err:
        raise SystemExit(f"error: {err}") from None
