"""Benchmarks page: a live sweep on a GPU, the recorded results otherwise."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pandas as pd
import streamlit as st

from pages._common import device, guarded, slots
from zerogr_core.app_support import benchview
from zerogr_core.app_support.benchrun import LiveSweep, app_suites, live_catalog, live_scale
from zerogr_core.app_support.messages import one_line
from zerogr_core.app_support.sources import app_settings

LIVE_KEY = "bench_live_records"
RECORDED_KEY = "bench_recorded_view"


def show_records(records: list[dict], prefix: str) -> None:
    """The headline table, then one tab per figure, each titled with the question it answers."""
    show_view(benchview.headline_table(records), benchview.figures_of(records), prefix)


def recorded_view() -> tuple[list[dict], list[dict], list]:
    """``(files, table, figures)`` of the recorded results, read and drawn once per session while the
    result files stay as they are (drawing the figures took 0.8 s of every visit to this page)."""
    key = benchview.signature()
    kept = st.session_state.get(RECORDED_KEY)
    if kept is None or kept[0] != key:
        with st.spinner("Reading the recorded results and drawing their figures…"):
            records = benchview.load_records()
            kept = (key, benchview.result_files(), benchview.headline_table(records), benchview.figures_of(records))
        st.session_state[RECORDED_KEY] = kept
    return kept[1:]


def show_view(table: list[dict], figures: list, prefix: str) -> None:
    """:func:`show_records` of a table and figures already built."""
    if table:
        st.markdown("**Whole-decode latency (ms, median) and speedup**")
        st.dataframe(benchview.unmeasured_as_dash(table), hide_index=True)
        st.caption("— : not measured at that shape.")
    drawable = [(title, fig) for title, fig in figures if not isinstance(fig, Exception)]
    for title, fig in figures:
        if isinstance(fig, Exception):
            st.caption(f"{title}: not drawn ({type(fig).__name__}: {fig}).")
    if drawable:
        for i, (tab, (title, fig)) in enumerate(zip(st.tabs([t for t, _ in drawable]), drawable)):
            with tab:
                st.plotly_chart(fig, key=f"{prefix}_{i}")
    if not drawable and not table:
        st.caption("These records hold nothing the figures can draw.")


def recorded_section(live: bool) -> None:
    files, table, figures = recorded_view()
    if not files:
        st.warning("No recorded results in `runs/results/` yet. Run `python -m zerogr_core bench` on a GPU "
                   "machine to produce them.")
        return
    origin = benchview.provenance(files)
    gpus, cpu_runs, when = origin["gpus"], origin["cpu_runs"], origin["when"]
    if not live:
        st.info(f"**No GPU on this machine — these are recorded results, not measured now.** They were measured on "
                f"**{', '.join(gpus)}** ({when}){' (plus CPU runs, marked as such)' if cpu_runs else ''} and "
                "committed under `runs/results/`.", icon=":material/folder:")
    else:
        st.caption(f"Recorded results: {', '.join(gpus)} ({when}).")
    show_view(table, figures, "bench_fig_rec")
    with st.expander("Where these numbers come from: the result files and the commands that wrote them"):
        st.dataframe(pd.DataFrame(files), hide_index=True, column_config={
            "command": st.column_config.TextColumn(width="large")})


def live_section() -> None:
    st.subheader("Run a sweep on this GPU")
    st.caption("Runs `python -m zerogr_core bench` in the app's process (same code path, results in a temporary "
               "folder, never over `runs/results/`). Cached indexes and decoders of the other pages are released "
               "first so the sweep has the GPU's memory.")
    st.session_state.setdefault("bench_suite", "headline")
    st.session_state.setdefault("bench_catalog", "search-like")
    st.session_state.setdefault("bench_scale", "1e6")
    st.session_state.setdefault("bench_batches", "1,8,32")
    st.session_state.setdefault("bench_beams", "128")
    st.session_state.setdefault("bench_dtype", "fp16")
    st.session_state.setdefault("bench_hidden", "1024")
    st.session_state.setdefault("bench_methods", "zerogr,static,unconstrained")
    st.session_state.setdefault("bench_budget", 120)
    c = st.columns(5)
    suite = c[0].selectbox("Suite", app_suites(), key="bench_suite")
    catalog = c[1].text_input("Catalog", key="bench_catalog", help="search-like, watch-like, synthetic-7, a sample "
                                                                   "name, synth:KIND:N, or a catalog file below a "
                                                                   "data folder (as on the Catalog page)")
    scale = c[2].text_input("Scale (SIDs)", key="bench_scale")
    batches = c[3].text_input("Batches", key="bench_batches")
    beams = c[4].text_input("Beam widths", key="bench_beams")
    c = st.columns(4)
    dtype = c[0].selectbox("dtype", ("fp16", "bf16", "fp32"), key="bench_dtype")
    hidden = c[1].text_input("Hidden size", key="bench_hidden")
    methods = c[2].text_input("Methods", key="bench_methods")
    budget = int(c[3].number_input("Time budget (s)", 10, 1800, key="bench_budget"))
    if not st.button("Run the sweep", type="primary", key="btn_bench_run"):
        saved = st.session_state.get(LIVE_KEY)
        if saved:
            st.caption(f"Last live run: `{saved['command']}` ({len(saved['records'])} records).")
            show_records(saved["records"], "bench_fig_live")
        return
    settings = app_settings()
    with st.spinner("Checking the catalog…"):
        catalog = live_catalog(catalog, settings)
    size = live_scale(scale, settings.limits.max_rows, catalog=catalog)
    if size is not None and not scale.strip():
        st.caption(f"Scale: {size:,} SIDs, this app's limit on rows (the bench command's default is larger).")
    argv = ["--suite", suite, "--batch", batches, "--beam", beams, "--dtype", dtype,
            "--hidden", hidden, "--methods", methods, "--budget-s", str(budget)]
    if catalog is not None:
        argv += ["--catalog", catalog]
    if size is not None:
        argv += ["--scale", str(size)]
    out = Path(tempfile.mkdtemp(prefix="zerogr-live-bench-"))
    sweep = LiveSweep(argv, out)
    slots().drop_all()
    sweep.start()
    bar = st.progress(0.0, text=f"`{sweep.command}`")
    log = st.empty()
    chart = st.empty()
    shown = -1
    while not sweep.done:
        time.sleep(1.0)
        records = sweep.records
        bar.progress(sweep.fraction(), text=f"{sweep.elapsed_s:,.0f} s of at most {budget} s · {len(records)} records")
        log.code("\n".join(sweep.lines[-6:]) or "starting…")
        if len(records) != shown:
            shown = len(records)
            figs = [f for _, f in benchview.figures_of(records) if not isinstance(f, Exception)]
            if figs:
                chart.plotly_chart(figs[0])
    bar.progress(1.0, text=f"done in {sweep.elapsed_s:,.0f} s · {len(sweep.records)} records")
    chart.empty()
    if sweep.error:
        st.error(one_line(f"The sweep stopped: {sweep.error}"))
    st.session_state[LIVE_KEY] = dict(command=sweep.command, records=sweep.records)
    show_records(sweep.records, "bench_fig_live")


def main() -> None:
    st.title("Benchmarks")
    st.write("Latency of filtering first (ZeroGR engine) against the baselines — scoring first over a STATIC-style "
             "index, unconstrained decoding, a host-side trie, the naive selective projection — on the same "
             "catalog, hidden states and heads.")
    live = device().type == "cuda"
    if live:
        live_section()
        st.divider()
    st.subheader("Recorded results")
    recorded_section(live)


guarded(main)
