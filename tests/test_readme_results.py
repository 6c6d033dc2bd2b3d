"""The tables of docs/results.md quote the committed result files.

Every "X ms (R×)" cell of the two decode-latency tables in docs/results.md must round from the
median latency (best of graph and eager) of the latest run's matching records in ``runs/results/``,
and R from the ratio of the baseline's to zerogr's. A rerun that changes the files, or an
edit that drifts from them, fails here.
"""
import re
from pathlib import Path

import pytest

from zerogr_core.bench.results import load_results

ROOT = Path(__file__).resolve().parents[1]
#: The document whose tables quote the results (the README links to it).
RESULTS_DOC = ROOT / "docs" / "results.md"
CELL = re.compile(r"\*{0,2}([\d.,]+) ms\*{0,2}(?: \(([\d.]+)×\))?")
HEADLINE_METHODS = ["zerogr", "static", "static-adapted", "unconstrained", "cpu-trie"]
OTHER_METHODS = ["zerogr", "static", "static-adapted", "unconstrained"]
NOT_RUN = "not run"


@pytest.fixture(scope="module")
def medians():
    """``{(catalog_label, dtype, batch, beam, method): median ms}`` of the latest run that
    measured each cell (the best median of that run's records): a rerun with newer code
    replaces an older, perhaps faster, figure instead of hiding behind it."""
    latest: dict = {}
    for rec in load_results(ROOT / "runs" / "results"):
        if rec.get("kind") != "latency" or rec.get("status", "ok") != "ok" or rec.get("quick"):
            continue
        key = (rec["catalog_label"], rec["dtype"], rec["batch"], rec["beam"], rec["method"])
        seen = latest.get(key)
        if seen is None or rec["run_started"] > seen[0]:
            latest[key] = (rec["run_started"], rec["median_ms"])
        elif rec["run_started"] == seen[0]:
            latest[key] = (seen[0], min(seen[1], rec["median_ms"]))
    return {key: ms for key, (_, ms) in latest.items()}


def table_rows(heading: str) -> list[list[str]]:
    """Body rows of the first Markdown table after the line that starts with ``heading``."""
    lines = RESULTS_DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows, seen = [], False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            seen = True
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not set(cells[0]) <= set("- "):
                rows.append(cells)
        elif seen:
            break
    return rows[1:]  # drop the header


def shown_precision(text: str) -> float:
    """Half a unit of the last digit shown."""
    return 0.5 * 10 ** -(len(text.split(".")[1]) if "." in text else 0)


def check_cells(cells: list[str], methods: list[str], labels: list[str], dtype: str, batch: int, beam: int,
                medians: dict) -> None:
    def median(method):
        found = [medians[k] for k in ((lab, dtype, batch, beam, method) for lab in labels) if k in medians]
        assert found, f"no result for {method} {labels} {dtype} batch {batch} beam {beam}"
        return found

    zerogr_options = median("zerogr")
    for method, cell in zip(methods, cells):
        if cell == NOT_RUN:  # allowed only where the results hold no measurement at all
            assert not any((lab, dtype, batch, beam, method) in medians for lab in labels), \
                f"results.md: shows {method} {labels[0]} {dtype} b{batch} as not run, but results exist"
            continue
        m = CELL.fullmatch(cell)
        assert m, f"results.md: cell {cell!r} ({method}) is not 'X ms (R×)'"
        ms = float(m.group(1).replace(",", ""))
        options = median(method)
        assert any(abs(v - ms) <= shown_precision(m.group(1)) + 1e-9 for v in options), \
            f"results.md: {method} {labels[0]} {dtype} b{batch} beam {beam}: {ms} ms, results {options}"
        if m.group(2):
            ratios = [v / z for v in options for z in zerogr_options]
            assert any(abs(r - float(m.group(2))) <= shown_precision(m.group(2)) + 1e-9 for r in ratios), \
                f"results.md: {method} {labels[0]} {dtype} b{batch}: ×{m.group(2)}, results {ratios}"


def setting(text: str) -> tuple[str, int, int]:
    dtype = "fp16" if "FP16" in text else "fp32"
    batch = re.search(r"batch (\d+)", text)
    beam = re.search(r"beam (\d+)", text)
    return dtype, int(batch.group(1)) if batch else 32, int(beam.group(1)) if beam else 128


def test_headline_table_quotes_the_results(medians):
    rows = table_rows("## Decode latency on one NVIDIA H200")
    assert len(rows) >= 3
    for row in rows:
        dtype, batch, beam = setting(row[0])
        check_cells(row[1:6], HEADLINE_METHODS, ["search-like-19269255"], dtype, batch, beam, medians)


CATALOGS = {"search-like, 10^9 SIDs": ["search-like-1e9"], "search-like, 10^8 SIDs": ["search-like-1e8"], "watch-like, 2·10^7 SIDs": ["watch-like-2e7"]}


def labels_of(text: str) -> list[str]:
    if text in CATALOGS:
        return CATALOGS[text]
    v = re.fullmatch(r"synthetic-7, 10\^7 SIDs, V (\d+)", text)
    assert v, f"unknown catalog in results.md table: {text!r}"
    return ["synthetic-7-1e7", f"synthetic-7-1e7-V{v.group(1)}"] if v.group(1) == "2048" \
        else [f"synthetic-7-1e7-V{v.group(1)}"]


def test_other_catalogs_table_quotes_the_results(medians):
    rows = table_rows("**Other catalogs and scales**")
    assert len(rows) >= 10
    for row in rows:
        dtype, batch, beam = setting(row[1])
        check_cells(row[2:6], OTHER_METHODS, labels_of(row[0]), dtype, batch, beam, medians)


#: Quality tables of results.md: the line the table follows → the report it quotes.
QUALITY_TABLES = {
    "## Quality: filtering first vs scoring first on MovieLens": "runs/results/quality.json",
    "**`tiger` preset, trained on the H200**": "runs/results/quality-amazon-beauty-tiger.json",
    "**`cpu` preset, trained here**": "runs/cpu_results/quality-amazon-beauty-cpu.json",
}


@pytest.mark.parametrize("heading", list(QUALITY_TABLES))
def test_quality_tables_quote_the_reports(heading):
    """Every cell of a quality table of results.md rounds from its committed report."""
    import json

    from zerogr_core.recsys.quality import TABLE_ROWS

    path = ROOT / QUALITY_TABLES[heading]
    lines = RESULTS_DOC.read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(heading)]
    assert len(starts) == 1, f"results.md: expected one line starting with {heading!r}"
    assert path.is_file(), f"results.md: quotes {path.relative_to(ROOT)}, which is not in the tree"
    report = json.loads(path.read_text())
    table = []
    for line in lines[starts[0] + 1:]:
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip("|").split("|")])
        elif table:
            break
    assert table and table[0][0] == "K", f"no K table after {heading!r}"
    ks = table[0][1:]
    assert ks == [str(k) for k in report["k"]]
    keys = dict(TABLE_ROWS)
    for row in table[2:]:
        key = keys[row[0]]
        for k, cell in zip(ks, row[1:]):
            shown = cell.removesuffix(" %")
            value = 100 * report[key][k] if key == "overlap" else report[key][k]
            assert abs(float(shown) - value) <= shown_precision(shown) + 1e-9, \
                f"results.md: {row[0]} K={k}: {cell}, {path.name} has {value}"


def test_ablation_table_quotes_the_reports():
    """The validity-term ablation table is the one the committed reports give, and the
    committed ablation document is what ``python -m zerogr_core.recsys.ablation`` writes."""
    import json

    from zerogr_core.recsys.ablation import DEFAULT_OUT, DEFAULT_REPORTS, ablation_document, summary_table

    table = summary_table([json.loads(p.read_text()) for p in DEFAULT_REPORTS])
    readme = RESULTS_DOC.read_text(encoding="utf-8")
    assert readme.count(table) == 1, "results.md's ablation table differs from summary_table of the reports"
    assert DEFAULT_OUT.read_text() == ablation_document(DEFAULT_REPORTS), "rerun python -m zerogr_core.recsys.ablation"


def test_end_to_end_table_is_what_its_command_prints(capsys):
    """The end-to-end table of results.md equals what the command it quotes prints from the results."""
    import shlex

    from zerogr_core.bench import e2e_table

    text = RESULTS_DOC.read_text(encoding="utf-8")
    section = text[text.index("## End to end with a model"):]
    command = re.search(r"`python -m zerogr_core\.bench\.e2e_table ([^`]+)`", section)
    assert command, "the end-to-end section must quote the command that prints its table"
    args = shlex.split(command.group(1))
    args = [str(ROOT / a) if not a.startswith("-") and (ROOT / a).exists() else a for a in args]
    assert e2e_table.main(args) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| model, catalog |"))
    shown = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        shown.append(line)
    assert shown == printed, "results.md's end-to-end table differs from the results; rerun the quoted command"
