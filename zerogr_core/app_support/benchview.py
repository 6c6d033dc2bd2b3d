"""Recorded benchmark results for the app's Benchmarks page.

Reads the result files of :mod:`zerogr_core.bench` (``runs/results/*.json``, format
``zerogr-bench/1``): which GPU, when, with what command, and the records themselves;
and finds the Plotly figure builders of :mod:`zerogr_core.bench.figures`.
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "runs" / "results"


def result_files(folder: str | Path | None = None) -> list[dict]:
    """One row per benchmark result file under ``folder`` (default :data:`RESULTS_DIR`): file,
    GPU, driver, torch, started, updated, finished, records, command. Other files are skipped."""
    folder = Path(folder if folder is not None else RESULTS_DIR)
    if not folder.exists():
        return []
    rows = []
    for file in sorted(folder.rglob("*.json")):
        try:
            doc = json.loads(file.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or not str(doc.get("format", "")).startswith("zerogr-bench/"):
            continue
        env = doc.get("env") or {}
        rows.append(dict(file=str(file.relative_to(folder)), gpu=env.get("gpu", "n/a"), driver=env.get("driver", "n/a"),
                         torch=env.get("torch", "n/a"), started=doc.get("started", ""),
                         updated=doc.get("updated", ""), finished=bool(doc.get("finished")),
                         records=len(doc.get("records") or []), command=doc.get("run_command", "")))
    return rows


def signature(folder: str | Path | None = None) -> tuple:
    """What the result files under ``folder`` (default :data:`RESULTS_DIR`) are now: each one's
    path, size and modification time. A page keeps what it drew from the files while this stays
    the same, and reads them again when a run adds or rewrites one."""
    folder = Path(folder if folder is not None else RESULTS_DIR)
    if not folder.exists():
        return ()
    out = []
    for file in sorted(folder.rglob("*.json")):
        try:
            stat = file.stat()
        except OSError:
            continue
        out.append((str(file.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
    return tuple(out)


def load_records(folder: str | Path | None = None) -> list[dict]:
    """Every record under ``folder`` (default :data:`RESULTS_DIR`), via
    :func:`zerogr_core.bench.load_results`."""
    from ..bench import load_results

    folder = Path(folder if folder is not None else RESULTS_DIR)
    return load_results(folder) if folder.exists() else []


def figure_builders() -> list[tuple[str, object]]:
    """``(name, function)`` of every ``figure_*`` function in :mod:`zerogr_core.bench.figures`
    (empty when that module is not there)."""
    try:
        from ..bench import figures
    except Exception:  # noqa: BLE001 — an absent or broken figures module means no figures
        return []
    out = []
    for name, fn in inspect.getmembers(figures, inspect.isfunction):
        if name.startswith("figure_") and fn.__module__ == figures.__name__:
            out.append((name, fn))
    return out


#: The question each benchmark figure answers (its tab title on the Benchmarks page).
QUESTIONS = {
    "speedup": "How much faster is filtering first?",
    "latency": "How long does a whole decode take?",
    "beam_sweep": "How does latency grow with the beam width?",
    "codebook_sweep": "How does latency grow with the codebook?",
    "steps": "Which step costs the most?",
    "stages": "Where does a step's time go?",
    "ablation": "Which projection wins at step 2?",
    "memory": "How much memory does each index take?",
    "build": "How fast is the index built?",
    "interference": "Does a rebuild slow decoding down?",
    "e2e": "How long is a request, model included?",
}


def title_of(name: str) -> str:
    """The question a ``figure_<name>`` answers, or its name in words when it has none."""
    key = name.removeprefix("figure_")
    return QUESTIONS.get(key, key.replace("_", " ").capitalize())


def figures_of(records: list[dict]) -> list[tuple[str, object]]:
    """``(title, figure)`` of every benchmark figure that has data for ``records``.

    Uses :func:`zerogr_core.bench.figures.all_figures` when present, else every
    ``figure_*`` builder; figures without traces (the "no data" placeholders) are dropped.
    Raises nothing: a figure that fails to build is reported as ``(title, exception)``.
    """
    out = []
    try:
        from ..bench import figures
    except Exception:  # noqa: BLE001
        return out
    if hasattr(figures, "all_figures"):
        try:
            items = list(figures.all_figures(records).items())
        except Exception as exc:  # noqa: BLE001
            return [("benchmark figures", exc)]
        for name, fig in items:
            if fig is not None and len(getattr(fig, "data", ())) > 0:
                out.append((title_of("figure_" + name), fig))
        return out
    for name, build in figure_builders():
        try:
            fig = build(records)
        except Exception as exc:  # noqa: BLE001
            out.append((title_of(name), exc))
            continue
        if fig is not None and len(getattr(fig, "data", ())) > 0:
            out.append((title_of(name), fig))
    return out


def headline_table(records: list[dict]) -> list[dict]:
    """The results/app latency table (``figures.headline_rows``), or ``[]``."""
    try:
        from ..bench.figures import headline_rows

        return headline_rows(records)
    except Exception:  # noqa: BLE001
        return []


def unmeasured_as_dash(table: list[dict]):
    """The headline table as a DataFrame with "—" in every cell that was not measured.

    A column with a dash is turned into text here, whole: left mixed (numbers and "—"), it
    cannot become an Arrow column, and Streamlit would log a traceback on every view
    before converting it the same way.

    Parameters
    ----------
    table : list of dict
        Rows of :func:`headline_table`.

    Returns
    -------
    pandas.DataFrame
    """
    import pandas as pd

    frame = pd.DataFrame(table)
    for column in frame.columns:
        missing = frame[column].isna()
        if missing.any():
            frame[column] = frame[column].astype(str).where(~missing, "—")
    return frame


def provenance(files: list[dict]) -> dict:
    """Where and when the recorded results of :func:`result_files` were measured.

    Returns
    -------
    dict
        ``gpus`` (the GPUs named, or ``["no GPU"]``), ``cpu_runs`` (whether some files were
        measured without a GPU) and ``when`` (a date, a date range, or ``"unknown date"``).
    """
    machines = sorted({f["gpu"] for f in files})
    gpus = [g for g in machines if not g.lower().startswith("none")] or ["no GPU"]
    dates = sorted(d[:10] for f in files for d in (f["updated"] or f["started"],) if d)
    when = dates[0] if dates and dates[0] == dates[-1] else (f"{dates[0]} – {dates[-1]}" if dates else "unknown date")
    return dict(gpus=gpus, cpu_runs=len(gpus) < len(machines), when=when)
