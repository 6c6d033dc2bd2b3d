"""The end-to-end table of docs/results.md, printed from ``bench-e2e`` result files.

    python -m zerogr_core.bench.e2e_table runs/results/e2e [--shapes 1x128,32x128] [--dtypes float32,tf32]

One row per model, catalog, model dtype, prefill placement and shape (batch × beam), with
each method's median from its latest run and its ratio to ZeroGR's median **in that same run**
(the model alone: its median only), so that no ratio mixes two runs; the ZeroGR column is its
latest run. ``tests/test_readme_results.py`` reruns the
command docs/results.md quotes and compares the output with its table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: Table columns: method → header.
COLUMNS = (("zerogr", "ZeroGR"), ("hf-constrained", "HF constrained"), ("hf-unconstrained", "HF unconstrained"),
           ("static", "STATIC-style, our loop"), ("unconstrained", "unconstrained, our loop"),
           ("model-only", "model alone"))
MODELS = {"t5": "T5", "decoder-only": "decoder-only"}
NOT_RUN = "not run"


def _ms(v: float) -> str:
    if v >= 1000:
        return f"{v:,.0f} ms"
    return f"{v:.1f} ms" if v >= 100 else f"{v:.2f} ms"


def _ratio(r: float) -> str:
    if r >= 100:
        return f"{r:,.0f}×"
    return f"{r:.1f}×" if r >= 10 else f"{r:.2f}×"


def _catalog(record: dict) -> str:
    n = int(record["n_items"])
    if record["catalog"].startswith("tiger"):
        return f"4×256, {n / 1e6:g}·10^6" if n != 10 ** 6 else "4×256, 10^6"
    return f"search-like {n / 1e7:g}·10^7"


def load(folder: Path) -> list[dict]:
    """Every timed and derived record of the ``e2e-*.json`` files in ``folder``, each with
    ``run``: its file and the run's start time."""
    records = []
    for path in sorted(Path(folder).glob("e2e-*.json")):
        if "__quick" in path.name:
            continue
        blob = json.loads(path.read_text())
        started = str(blob.get("started", ""))
        records += [dict(r, run=(str(path), started)) for r in blob["records"] if r.get("suite") == "e2e"]
    return records


def table(records: list[dict], shapes=None, dtypes=None) -> str:
    """Markdown table of the records (see the module docstring).

    Parameters
    ----------
    records : list of dict
        ``bench-e2e`` records (``method``, ``median_ms``, ``batch``, ``beam``, ``model_kind``,
        ``catalog``, ``n_items``, ``dtype``, ``prefill``).
    shapes : collection of (batch, beam), optional
        Only these shapes (default: all).
    dtypes : collection of str, optional
        Only these model dtypes (``float32``, ``tf32``, ``bfloat16``; default: all).
    """
    cells: dict = {}
    zerogr_of_run: dict = {}
    for r in records:
        if "median_ms" not in r or r.get("error"):
            continue
        shape = (int(r["batch"]), int(r["beam"]))
        if (shapes and shape not in shapes) or (dtypes and r["dtype"] not in dtypes):
            continue
        key = (r["model_kind"], _catalog(r), r["dtype"], r.get("prefill", "outside the graph"), shape)
        run = r.get("run", ("", ""))
        if r["method"] == "zerogr":
            zerogr_of_run[(key, run)] = float(r["median_ms"])
        held = cells.setdefault(key, {}).get(r["method"])
        if held is None or run[1] >= held[1][1]:   # the latest run wins
            cells[key][r["method"]] = (float(r["median_ms"]), run)
    order = {"t5": 0, "decoder-only": 1}
    lines = ["| model, catalog | model dtype | prefill | batch × beam | " + " | ".join(h for _, h in COLUMNS) + " |",
             "|" + " --- |" * (4 + len(COLUMNS))]
    for key in sorted(cells, key=lambda k: (order.get(k[0], 9), k[1], k[2], k[3], k[4][1], k[4][0])):
        kind, catalog, dtype, prefill, (batch, beam) = key
        got = cells[key]
        row = []
        for method, _ in COLUMNS:
            if method not in got:
                row.append(NOT_RUN)
                continue
            v, run = got[method]
            z = zerogr_of_run.get((key, run))
            if method in ("zerogr", "model-only") or z is None:
                row.append(_ms(v))
            else:
                row.append(f"{_ms(v)} ({_ratio(v / z)})")
        where = prefill.replace(" the graph", "")
        lines.append(f"| {MODELS.get(kind, kind)}, {catalog} | {dtype} | {where} | {batch} × {beam} | "
                     + " | ".join(row) + " |")
    return "\n".join(lines)


def _shapes(text: str | None):
    if not text:
        return None
    out = set()
    for part in text.split(","):
        b, _, m = part.strip().partition("x")
        if not (b.isdigit() and m.isdigit()):
            raise SystemExit(f"error: --shapes: expected BATCHxBEAM, got {part.strip()!r}")
        out.add((int(b), int(m)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Print the end-to-end table of docs/results.md from bench-e2e results.")
    p.add_argument("folders", nargs="+", help="folders holding e2e-*.json result files")
    p.add_argument("--shapes", default=None, help="comma list of BATCHxBEAM (default: all)")
    p.add_argument("--dtypes", default=None, help="comma list of model dtypes (float32, tf32, bfloat16)")
    args = p.parse_args(argv)
    records = []
    for folder in args.folders:
        if not Path(folder).is_dir():
            print(f"error: {folder}: no such folder", file=sys.stderr)
            return 2
        records += load(Path(folder))
    dtypes = set(args.dtypes.split(",")) if args.dtypes else None
    print(table(records, _shapes(args.shapes), dtypes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
