"""Result files: a JSON Lines log appended record by record, plus one JSON document and one CSV.

``python -m zerogr_core.bench.write_csv FILE.json`` writes a committed run's CSV back beside its JSON.

Every record is appended to ``<name>.jsonl`` (line 1: the run header) and flushed at once;
``<name>.json`` and ``<name>.csv`` are rewritten at most every few seconds and when the run
ends. A run stopped at any point (a time limit on the GPU machine) therefore leaves every
record it finished in the ``.jsonl`` file, and :func:`load_results` reads whichever of the
two holds more. JSON layout::

    {"format": "zerogr-bench/1", "env": {...}, "run_command": "python -m zerogr_core bench …",
     "started": ISO time, "updated": ISO time, "finished": bool, "records": [{...}, ...]}

Every record is self-contained: it repeats the environment (GPU, driver, versions), the
catalog statistics, the seed and the command that regenerates it. The CSV has one row per
record over the union of the record keys (nested values as JSON text).
"""
from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import math
import os
import time
from pathlib import Path

FORMAT = "zerogr-bench/1"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _plain(value):
    """JSON-safe value: numpy/torch scalars to Python, NaN/inf to None or strings."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    return value


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class ResultWriter:
    """Collects records: appends each to the JSON Lines log at once, rewrites ``json_path``
    and ``csv_path`` at most every ``every_s`` seconds and on :meth:`close`.

    Parameters
    ----------
    json_path, csv_path : Path or None
        The JSON Lines log is ``json_path`` with the suffix ``.jsonl``.
    env : dict
        Machine and software description (also copied into every record).
    run_command : str
    every_s : float
    """

    def __init__(self, json_path: Path | None, csv_path: Path | None, env: dict, run_command: str,
                 every_s: float = 5.0):
        self.json_path = Path(json_path) if json_path else None
        self.csv_path = Path(csv_path) if csv_path else None
        self.jsonl_path = self.json_path.with_suffix(".jsonl") if self.json_path else None
        for p in (self.json_path, self.csv_path):
            if p is not None:
                p.parent.mkdir(parents=True, exist_ok=True)
        self.env, self.run_command = env, run_command
        self.started = _now()
        self.records: list[dict] = []
        self.finished = False
        self.every_s = every_s
        self._last = 0.0
        self._log = None
        if self.jsonl_path is not None:
            self._log = open(self.jsonl_path, "w")
            header = dict(format=FORMAT, env=_plain(env), run_command=run_command, started=self.started)
            self._log.write(json.dumps(header) + "\n")
            self._log.flush()
        self.flush()

    def add(self, record: dict) -> dict:
        rec = _plain(record)
        self.records.append(rec)
        if self._log is not None:
            self._log.write(json.dumps(rec) + "\n")
            self._log.flush()
        if time.monotonic() - self._last >= self.every_s:
            self.flush()
        return rec

    def close(self) -> None:
        self.finished = True
        self.flush()
        if self._log is not None:
            self._log.close()
            self._log = None

    def document(self) -> dict:
        return dict(format=FORMAT, env=_plain(self.env), run_command=self.run_command, started=self.started,
                    updated=_now(), finished=self.finished, records=self.records)

    def flush(self) -> None:
        self._last = time.monotonic()
        if self.json_path is not None:
            _atomic_write(self.json_path, json.dumps(self.document(), indent=1))
        if self.csv_path is not None:
            _atomic_write(self.csv_path, records_to_csv(self.records))


def records_to_csv(records: list[dict]) -> str:
    """CSV text of ``records`` over the union of their keys (first-seen order)."""
    columns: list[str] = []
    seen = set()
    for rec in records:
        for key in rec:
            if key not in seen:
                seen.add(key)
                columns.append(key)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for rec in records:
        row = []
        for key in columns:
            value = rec.get(key, "")
            if isinstance(value, (dict, list)):
                value = json.dumps(value, separators=(",", ":"))
            elif value is None:
                value = ""
            row.append(value)
        writer.writerow(row)
    return buf.getvalue()


def _read_json(file: Path) -> tuple[dict, list[dict]] | None:
    try:
        doc = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    return doc, list(doc.get("records", []))


def _read_jsonl(file: Path) -> tuple[dict, list[dict]] | None:
    try:
        lines = file.read_text().splitlines()
    except OSError:
        return None
    header, records = None, []
    for i, line in enumerate(lines):
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if i == 0:
            if not isinstance(item, dict) or item.get("format") != FORMAT:
                return None
            header = item
            continue
        records.append(item)
    return (header, records) if header is not None else None


def load_results(path) -> list[dict]:
    """Every record of the benchmark result files under ``path`` (a file or a folder,
    searched recursively), each with ``source`` set to its file name and ``run_started``
    to its run's start time (ISO 8601, UTC; ``""`` when the file does not say).

    For each run, the ``.json`` document or its ``.jsonl`` log is read, whichever holds
    more records (the log is complete even when the run was killed). Files that are not
    benchmark results are skipped.
    """
    path = Path(path)
    files = [path] if path.is_file() else sorted(list(path.rglob("*.json")) + list(path.rglob("*.jsonl")))
    by_run: dict = {}
    for file in files:
        read = _read_jsonl(file) if file.suffix == ".jsonl" else _read_json(file)
        if read is None:
            continue
        key = file.with_suffix("")
        if key not in by_run or len(read[1]) > len(by_run[key][2]):
            by_run[key] = (file, *read)
    out = []
    for _, (file, header, records) in sorted(by_run.items(), key=lambda kv: str(kv[0])):
        for rec in records:
            rec = dict(rec)
            rec.setdefault("source", file.with_suffix(".json").name)
            rec.setdefault("run_started", str(header.get("started") or ""))
            out.append(rec)
    return out


def write_csv(file) -> Path:
    """Write ``<name>.csv`` beside the result document ``<name>.json`` (or log ``<name>.jsonl``): one
    row per record, as the run itself wrote it. Committed runs keep only the ``.json``; this gives
    the table back. Raises ``ValueError`` (one line naming the file) for anything else."""
    file = Path(file)
    read = _read_jsonl(file) if file.suffix == ".jsonl" else _read_json(file) if file.suffix == ".json" else None
    if read is None:
        raise ValueError(f"{file}: not a benchmark result file (a {FORMAT} .json or .jsonl)")
    out = file.with_suffix(".csv")
    _atomic_write(out, records_to_csv(read[1]))
    return out


def write_csvs(path) -> list[Path]:
    """:func:`write_csv` of ``path``, or of every result document under it when it is a folder (other
    JSON files there are left alone); the CSVs written. Raises ``ValueError`` naming ``path`` when a
    folder holds no result document."""
    path = Path(path)
    if not path.is_dir():
        return [write_csv(path)]
    found = [f for f in sorted(path.rglob("*.json")) if _read_json(f) is not None]
    if not found:
        raise ValueError(f"{path}: no benchmark result file under this folder")
    return [write_csv(f) for f in found]
