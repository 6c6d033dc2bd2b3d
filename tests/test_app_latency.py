"""What the Decode page asks of the library and measures: the Decoder's timer, on_step and
plan-table hooks, the planner's noise rule, and the latency protocol and its winner."""
from __future__ import annotations

import pytest
import torch

from zerogr_core import Decoder, build_index
from zerogr_core.app_support.latency import (ORDERS, SERIES_LABELS, VALID_TOKENS, Latency, LatencyProtocol, order_runs,
                                             time_orders, winner)
from zerogr_core.app_support.profile import profile_decode
from zerogr_core.app_support.requests import random_heads, random_hidden_fn
from zerogr_core.catalog.synth import generate
from zerogr_core.decode.ops import STAGES
from zerogr_core.decode.planner import beyond_noise
from zerogr_core.errors import ZeroGRError
from zerogr_core.timing import StageTimer


@pytest.fixture(scope="module")
def small():
    catalog = generate("synthetic-7", 400, seed=3, codebook=16)
    index = build_index(catalog)
    heads, bands = random_heads(catalog, 16, seed=1)
    return catalog, index, heads, bands


def fn_of(catalog, batch=3, seed=2):
    return random_hidden_fn(batch, 16, catalog.codebook_sizes, seed=seed)


@pytest.mark.parametrize("order", ["filter-first", "score-first"])
def test_timer_and_on_step_hooks_leave_the_beams_alone(small, order):
    catalog, index, heads, bands = small
    dec = Decoder(index, heads, 4, order=order, band_offsets=bands)
    plain = dec.decode(fn_of(catalog), 3)
    timer, seen = StageTimer("cpu"), []
    got = dec.decode(fn_of(catalog), 3, timer=timer, on_step=lambda step, states: seen.append((step, states.clone())))
    assert torch.equal(got.item_rows, plain.item_rows)
    torch.testing.assert_close(got.scores, plain.scores, rtol=1e-5, atol=1e-5)
    assert [s for s, _ in seen] == list(range(index.n_levels))
    assert seen[0][1].shape == (3,) and all(states.shape == (3 * 4,) for _, states in seen[1:])
    assert {r["stage"] for r in timer.rows} <= set(STAGES) and {"model", "select"} <= {r["stage"] for r in timer.rows}
    assert {r["step"] for r in timer.rows} == set(range(1, index.n_levels + 1))
    assert timer.total_ms == pytest.approx(sum(r["ms"] for r in timer.rows))


def test_plan_table_names_the_projection_of_every_step(small):
    catalog, index, heads, bands = small
    for projection in (None, "full", "selective"):
        dec = Decoder(index, heads, 4, band_offsets=bands, projection=projection)
        rows = dec.plan_table(fn_of(catalog), 3)
        assert [r["step"] for r in rows] == list(range(1, index.n_levels + 1))
        assert all(r["projection"] in ("full", "selective") for r in rows)
        if projection is not None:
            assert {r["projection"] for r in rows} == {projection}
        run = profile_decode(dec, fn_of(catalog), 3)
        assert run.projection == tuple(r["projection"] for r in rows)
    assert dec.graph_error(3) is None  # no GPU engine: nothing was captured, nothing failed


def test_the_planner_keeps_the_default_within_noise():
    default, other = "dense+full / reference", "dense+selective / reference"
    # 5 % apart with a 20 % spread: noise, the default stays
    assert beyond_noise({default: [100, 120, 125], other: [95, 115, 130]}, default) == default
    # twice as fast, beyond any spread: the other option wins
    assert beyond_noise({default: [100, 104, 108], other: [50, 52, 51]}, default) == other
    # the default is the fastest: kept
    assert beyond_noise({default: [40, 41], other: [50, 51]}, default) == default


def test_winner_only_beyond_noise():
    apart = {"filter-first": Latency("a", [1.0, 1.1, 1.05] * 10), "score-first": Latency("b", [2.0, 2.2, 2.1] * 10)}
    assert winner(apart) == ("filter-first", pytest.approx(2.1 / 1.05))
    overlap = {"filter-first": Latency("a", [1.0, 1.5, 2.0] * 10), "score-first": Latency("b", [1.2, 1.6, 2.2] * 10)}
    best, ratio = winner(overlap)
    assert best is None and ratio == pytest.approx(1.6 / 1.5)


def test_winner_decides_between_the_two_orders_only():
    """The GPU's third series (scoring first over the valid tokens) neither wins nor hides a winner."""
    apart = {"filter-first": Latency("a", [1.0, 1.1, 1.05] * 10), "score-first": Latency("b", [2.0, 2.2, 2.1] * 10)}
    fastest = dict(apart, **{VALID_TOKENS: Latency("c", [0.1, 0.11, 0.105] * 10)})
    assert winner(fastest) == winner(apart) == ("filter-first", pytest.approx(2.1 / 1.05))
    # overlapping the winner's band, or slower than both: still the orders' verdict and ratio
    for third in ([1.0, 1.1, 1.05] * 10, [9.0, 9.9, 9.5] * 10):
        assert winner(dict(apart, **{VALID_TOKENS: Latency("c", third)})) == winner(apart)
    overlap = {"filter-first": Latency("a", [1.0, 1.5, 2.0] * 10), "score-first": Latency("b", [1.2, 1.6, 2.2] * 10)}
    assert winner(dict(overlap, **{VALID_TOKENS: Latency("c", [5.0] * 30)}))[0] is None
    # asked to, it ranks the series named
    assert winner(fastest, among=("filter-first", VALID_TOKENS))[0] == VALID_TOKENS


def test_the_latency_chart_draws_every_timed_series():
    from zerogr_core.app_support.charts import latency_figure

    two = {"filter-first": Latency("a", [1.0, 1.1]), "score-first": Latency("b", [2.0, 2.1])}
    three = dict(two, **{VALID_TOKENS: Latency("c", [1.5, 1.6])})
    for latencies in (two, three):
        fig = latency_figure(latencies)
        drawn = [trace.name for trace in fig.data]
        assert drawn == [SERIES_LABELS[s] for s in latencies]
        assert [len(trace.y) for trace in fig.data] == [2] * len(latencies)
    assert SERIES_LABELS[VALID_TOKENS] == "scoring first, valid tokens only (STATIC adapted)"


def test_time_orders_meets_the_protocol_in_turns(small):
    catalog, index, heads, bands = small
    decoders = {o: Decoder(index, heads, 4, order=o, band_offsets=bands) for o in ("filter-first", "score-first")}
    runs, notes = order_runs(catalog, decoders, fn_of(catalog), 3)
    assert notes == [] and {label for label, _ in runs.values()} == {"PyTorch reference loop, step by step (CPU)"}
    assert tuple(runs) == ORDERS  # on a CPU the two orders alone: no graphed baseline to time
    protocol = LatencyProtocol(min_repeats=4, min_seconds=0.05, max_seconds=30)
    seen = []
    got = time_orders(runs, "cpu", protocol, progress=seen.append)
    counts = {o: len(lat.samples_ms) for o, lat in got.items()}
    assert counts["filter-first"] == counts["score-first"] >= 4  # in turns: one each per round
    assert min(sum(lat.samples_ms) for lat in got.values()) >= 50  # ≥ min_seconds of work each
    assert all(0 <= f <= 1 for f in seen)
    with pytest.raises(ZeroGRError, match="min_repeats"):
        LatencyProtocol(min_repeats=1)


@pytest.mark.parametrize("series", [ORDERS, ORDERS + (VALID_TOKENS,)])
def test_the_decode_page_shows_each_timed_series(monkeypatch, series):
    """The page's latency block with the two orders (a CPU) and with the valid-token STATIC
    beside them (a GPU): a metric per series naming its implementation, the faster order
    between the two orders only, and what the third series is there for."""
    from streamlit.testing.v1 import AppTest

    # the page's functions, not its flow: importing the page must not run it
    monkeypatch.setattr("pages._common.guarded", lambda main: None)

    def script():
        import sys

        import streamlit as st

        from pages.decode import show_latency

        sys.modules.pop("pages.decode")  # imported with guarded stubbed: not a page to keep
        show_latency(st.session_state["res"])

    samples = {"filter-first": [1.0, 1.1, 1.05], "score-first": [2.0, 2.2, 2.1], VALID_TOKENS: [0.5, 0.55, 0.52]}
    latency = {s: Latency(f"ran {s}", samples[s] * 10) for s in series}
    at = AppTest.from_function(script, default_timeout=60)
    at.session_state["res"] = dict(latency=latency, notes=[])
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = {m.label: m.value for m in at.metric}
    assert list(shown) == [f"{SERIES_LABELS[s]} latency (median)" for s in series] + ["Faster order"]
    assert shown["Faster order"] == "filter-first"  # the valid-token series is faster still, but not an order
    captions = [c.value for c in at.caption]
    assert all(any(c.startswith(f"ran {s}; 10–90 %") for c in captions) for s in series), captions
    explained = any("returns filtering first's beams" in c and "cost of the order alone" in c for c in captions)
    assert explained == (VALID_TOKENS in series)
    assert any("2.00× faster" in c for c in captions)  # filter-first against score-first, not the third
