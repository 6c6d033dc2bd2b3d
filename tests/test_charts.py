"""Tables and figures shared by the app's pages and docs/analysis.ipynb (app_support.charts)."""
from __future__ import annotations

import numpy as np
import pytest

from zerogr_core import build_index
from zerogr_core.app_support import benchview, charts
from zerogr_core.app_support.density import beam_weighted_density, segment_lengths
from zerogr_core.app_support.profile import STAGES, comparison, profiled_decode
from zerogr_core.decode.random_requests import random_heads, random_hidden_fn
from zerogr_core.catalog.samples import tiny_catalog
from zerogr_core.catalog.synth import generate


@pytest.fixture(scope="module")
def shared():
    """A catalog with a shared head (band offsets), its index and both decode orders."""
    catalog = generate("search-like", 600, seed=3)
    index = build_index(catalog)
    heads, bands = random_heads(catalog, 16, seed=0)
    runs = {o: profiled_decode(index, heads, 4, o, random_hidden_fn(3, 16, catalog.codebook_sizes, seed=1), 3,
                               band_offsets=bands) for o in charts.ORDERS}
    return catalog, index, runs


def test_shared_head_rows():
    tiny = tiny_catalog()
    assert tiny.band_offsets is None and charts.shared_head_rows(tiny) is None
    catalog = generate("search-like", 600, seed=3)
    rows = max(o + s for o, s in zip(catalog.band_offsets, catalog.codebook_sizes))
    assert charts.shared_head_rows(catalog) == [rows] * catalog.n_levels
    assert rows > max(catalog.codebook_sizes)


def test_density_rows_join_catalog_and_beam_statistics(shared):
    catalog, _, runs = shared
    stats = catalog.step_stats()
    weighted = beam_weighted_density(catalog, runs["filter-first"].states,
                                     projected_rows=charts.shared_head_rows(catalog))
    rows = charts.density_rows(stats, weighted)
    assert [r["step"] for r in rows] == list(range(1, catalog.n_levels + 1))
    for row, s, w in zip(rows, stats, weighted):
        assert row["catalog-level density"] == s["density"] and row["states S"] == s["states"]
        assert row["beam-weighted density"] == w["beam_density"]
        assert row["wasted share"] == pytest.approx(1 - row["logits that can be chosen"]
                                                    / row["logits scored (score first)"])
    fig = charts.density_figure(rows)
    assert {t.name for t in fig.data} == {"catalog-level density", "beam-weighted density"}
    waste = charts.waste_figure(rows)
    assert list(waste.data[0].y) == [r["wasted share"] for r in rows]
    hist = charts.histogram_figure(segment_lengths(catalog))
    total = sum(int(np.sum(t.y)) for t in hist.data)
    assert total == sum(s["states"] for s in stats)  # every state counted once


def test_index_rows_build_rows_and_figures(shared):
    catalog, index, _ = shared
    report = index.report()
    rows = charts.index_step_rows(report)
    assert sum(r["bytes"] for r in rows) == report["total_bytes"]
    assert all(r["bytes"] == (r["as dense"] if r["representation"] == "dense" else r["as sparse"]) for r in rows)
    timed = charts.build_rows("layout", index.build)
    assert {r["builder"] for r in timed} == {"layout"} and len(timed) == 4
    assert sum(r["ms"] for r in timed) == pytest.approx(1e3 * index.build["total_s"])
    assert {t.name for t in charts.breakdown_figure(timed, "build").data} == {r["phase"] for r in timed}
    fig = charts.bytes_comparison_figure(report)
    assert sorted(int(v) for t in fig.data for v in t.y) == sorted(
        [report["total_bytes"], report["sid_table_int16_bytes"], report["static_style_bytes"]])


def test_decode_tables_and_figures(shared):
    catalog, index, runs = shared
    targets = runs["filter-first"].result.item_rows[:, 0].numpy()
    metrics = comparison(runs["filter-first"], runs["score-first"], [1, 4], targets)
    rows = charts.metrics_rows(metrics, [1, 4])
    assert len(rows) == 6 and rows[0] == dict(K="1", measure="overlap@K", value=metrics["overlap"][1])
    assert {r["measure"] for r in charts.metrics_rows({"overlap": metrics["overlap"]}, [1, 4])} == {"overlap@K"}
    assert len(charts.metrics_figure(metrics, [1, 4], 3).data) == 3
    titles = np.array([f"title {i}" for i in range(catalog.n_items)], dtype=object)
    top = runs["filter-first"].result.item_rows[1, :4].numpy()
    cols = charts.top_k_columns(catalog, titles, runs, 1, 4, target=int(top[2]))
    assert list(cols["rank"]) == [1, 2, 3, 4] and set(cols) == {
        "rank", "filter-first", "filter-first log-prob", "score-first", "score-first log-prob"}
    assert cols["filter-first"][2] == f"★ title {top[2]}" and cols["filter-first"][0] == f"title {top[0]}"
    unnamed = charts.top_k_columns(catalog, None, runs, 1, 4)
    assert unnamed["filter-first"][0] == f"item {catalog.item_ids[top[0]]}"
    stage = charts.stage_figure(runs)
    assert {t.name for t in stage.data} <= set(STAGES)
    shown = sum(float(np.sum(t.y)) for t in stage.data)
    assert shown == pytest.approx(sum(r.total_ms for r in runs.values()))


def test_invalid_mass_figure():
    rows = [dict(step=1, mean=0.0, p90=0.0, max=0.0), dict(step=2, mean=0.1, p90=0.3, max=0.9)]
    fig = charts.invalid_mass_figure(rows)
    assert [t.name for t in fig.data] == ["mean", "p90", "max"] and list(fig.data[2].y) == [0.0, 0.9]


def test_benchview_provenance():
    files = [dict(gpu="NVIDIA H200", updated="2026-11-30T01:00:00", started=""),
             dict(gpu="NVIDIA H200", updated="", started="2026-12-01T02:00:00"),
             dict(gpu="none (CPU)", updated="2026-12-01T03:00:00", started="")]
    assert benchview.provenance(files) == dict(gpus=["NVIDIA H200"], cpu_runs=True, when="2026-11-30 – 2026-12-01")
    one = benchview.provenance(files[:1])
    assert one == dict(gpus=["NVIDIA H200"], cpu_runs=False, when="2026-11-30")
    assert benchview.provenance([dict(gpu="none", updated="", started="")]) == dict(
        gpus=["no GPU"], cpu_runs=False, when="unknown date")
