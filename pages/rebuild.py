"""Rebuild page: refresh the catalog and rebuild the index while decoding keeps serving."""
from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from pages._common import (changed_since_run, check_work, cpu_banner, decode_inputs, device, fmt_bytes, fmt_ms,
                           get_catalog, get_index, guarded, overrides)
from zerogr_core import Decoder
from zerogr_core.app_support.messages import one_line
from zerogr_core.app_support.profile import profiled_decode, steady_cpu_timing
from zerogr_core.app_support.rebuild import rebuild_while_decoding, refresh_catalog
from zerogr_core.index import IndexConfig, build_phases

REPORT_KEY = "rebuild_report"
LIVE_KEY = "rebuild_live"
RUN_LABEL = "Refresh and rebuild while decoding"
LIVE_LABEL = "Run live changes while decoding"


def live_section(catalog, source) -> None:
    """Live catalog versions: deletes, adds and replaces while threads keep decoding."""
    from zerogr_core.app_support.rebuild import live_load_test

    st.subheader("Live catalog: deletes and adds while decoding")
    st.write("Decoders keep serving from a versioned catalog store while the catalog changes: **deletes** take "
             "effect at once (a global deny set merged into every request's lists, no rebuild), **adds** and full "
             "**replaces** build a new index beside the old one and swap it in atomically. Every result carries "
             "the version it ran on and is checked against it.")
    dev = device()
    gpu = dev.type == "cuda"
    st.session_state.setdefault("reb_live_seconds", 3.0)
    st.session_state.setdefault("reb_live_every", 1.0)
    st.session_state.setdefault("reb_live_share", 1.0)
    c = st.columns(3)
    seconds = float(c[0].number_input("Decode for (s, per phase)", 0.5, 30.0, step=0.5, key="reb_live_seconds"))
    every = float(c[1].number_input("Change every (s)", 0.1, 10.0, step=0.1, key="reb_live_every"))
    share = float(c[2].number_input("Items per change (%)", 0.1, 10.0, step=0.1, key="reb_live_share"))
    cfg = dict(seconds=seconds, every=every, share=share)
    if st.button(LIVE_LABEL, key="btn_live_run"):
        hidden, dtype = (1024, "float16") if gpu else (64, "float32")
        inputs = decode_inputs(catalog, dev, bundled=False, batch=4, seed=1, hidden=hidden, dtype=dtype)
        heads, bands, fn = inputs.heads, inputs.band_offsets, inputs.hidden_fn

        def make_decoder(cat, index):
            return Decoder(index, heads, 16, band_offsets=bands, catalog=cat)

        def warmup(dec):  # a GPU engine plans and captures before its version goes live
            dec.decode(fn, 4, lists=dec.request_lists(4))

        with st.spinner("Decoding while the catalog changes…"):
            count = max(1, int(catalog.n_items * share / 100))
            # The CPU path runs one decoding thread (the PyTorch reference shares the cores).
            report = live_load_test(catalog, make_decoder, fn, 4, device=dev, warmup=warmup if gpu else None,
                                    threads=4 if gpu else 1, seconds=seconds, change_every_s=every,
                                    changes_per_step=count)
        st.session_state[LIVE_KEY] = dict(source=source, report=report, cfg=cfg)
    saved = st.session_state.get(LIVE_KEY)
    if not saved or saved["source"] != source:
        return
    changed_since_run(saved.get("cfg"), cfg, LIVE_LABEL)
    r = saved["report"]
    m = st.columns(4)
    m[0].metric("Catalog version", f"{r['versions'][0]} → {r['versions'][1]}", help=f"{r['changes']} changes")
    m[1].metric("Failed requests", f"{r['failed']:,} of {r['requests']:,}")
    m[2].metric("Deleted or invalid items returned", f"{r['deleted'] + r['invalid']:,}")
    m[3].metric("Decode p99 while changing", fmt_ms(r["churn"]["p99_ms"]),
                delta=f"{r['churn']['p99_ms'] - r['idle']['p99_ms']:+.2f} ms vs idle", delta_color="inverse")
    st.dataframe(pd.DataFrame(r["change_log"]).rename(columns={"live": "live items"}), hide_index=True)
    if r["errors"]:
        st.error(one_line("First errors: " + "; ".join(r["errors"])))


def main() -> None:
    st.title("Rebuild")
    catalog, source = get_catalog()
    dev = device()
    gpu = dev.type == "cuda"
    st.write(f"Simulate a refresh of **{source.label}** ({catalog.n_items:,} items): remove and add a share of the "
             "items, then rebuild the index in a background thread while a filter-first decode loop keeps running "
             "on the current index. The new index is swapped in when it is complete.")
    cpu_banner("The rebuild uses the host builder (the same layout-guided two passes into host arrays, no "
               "streaming to a GPU), so there is no H2D bandwidth; the decode loop runs the PyTorch reference "
               "path with one torch thread. Both share the CPU cores, which is the interference this page measures.")
    st.session_state.setdefault("reb_add", 5.0)
    st.session_state.setdefault("reb_remove", 5.0)
    st.session_state.setdefault("reb_beam", 128 if gpu else 16)
    st.session_state.setdefault("reb_batch", 32 if gpu else 4)
    st.session_state.setdefault("reb_seconds", 1.0)
    c = st.columns(5)
    add = c[0].number_input("Add (% of items)", 0.0, 100.0, step=1.0, key="reb_add")
    remove = c[1].number_input("Remove (% of items)", 0.0, 99.0, step=1.0, key="reb_remove")
    beam = int(c[2].number_input("Decode beam width", 1, 1024, key="reb_beam"))
    batch = int(c[3].number_input("Decode batch", 1, 1024, key="reb_batch"))
    seconds = float(c[4].number_input("Rebuild window (s)", 0.1, 30.0, step=0.5, key="reb_seconds",
                                      help="Small catalogs rebuild in milliseconds, shorter than one decode, so the "
                                           "rebuild repeats back to back for at least this long."))
    cfg = dict(add=add, remove=remove, beam=beam, batch=batch, seconds=seconds,
               overrides=tuple(sorted(overrides().items())))
    if st.button(RUN_LABEL, type="primary", key="btn_reb_run"):
        hidden = 1024 if gpu else 64
        check_work(catalog, batch, beam, hidden)
        bar = st.progress(0, text="Refreshing the catalog…")
        refreshed, change = refresh_catalog(catalog, add / 100, remove / 100, seed=0)
        index = get_index(catalog, source)
        inputs = decode_inputs(catalog, dev, bundled=False, batch=batch, seed=0, hidden=hidden,
                               dtype="float16" if gpu else "float32")
        heads, bands, fn = inputs.heads, inputs.band_offsets, inputs.hidden_fn
        decoders = {}

        def decode_once(new_index):
            target = index if new_index is None else new_index
            if gpu:
                dec = decoders.get(id(target))
                if dec is None:
                    dec = decoders[id(target)] = Decoder(target, heads, beam, band_offsets=bands)
                dec.decode(fn, batch)
            else:
                profiled_decode(target, heads, beam, "filter-first", fn, batch, band_offsets=bands)

        decode_once(None)  # warm-up (plan + graph capture on a GPU) before timing

        def progress(fraction, text):
            bar.progress(min(100, int(10 + 90 * fraction)), text=text)

        with steady_cpu_timing(dev):
            report = rebuild_while_decoding(refreshed, decode_once, device=dev,
                                            config=IndexConfig().with_overrides(overrides()), min_seconds=seconds,
                                            progress=progress)
        for dec in decoders.values():
            if dec.gpu_engine is not None:
                dec.gpu_engine.release()
        bar.empty()
        report.index = None  # keep the session light; the new index is not made active
        st.session_state[REPORT_KEY] = dict(source=source, change=change, report=report, beam=beam, batch=batch,
                                            cfg=cfg)
    saved = st.session_state.get(REPORT_KEY)
    if not saved or saved["source"] != source:
        st.info(f"Choose the refresh and press **{RUN_LABEL}**.")
        live_section(catalog, source)
        return
    report, change = saved["report"], saved["change"]
    st.subheader("Result")
    changed_since_run(saved.get("cfg"), cfg, RUN_LABEL)
    m = st.columns(4)
    m[0].metric("Items", f"{change['items_after']:,}", delta=f"+{change['added']:,} / −{change['removed']:,}",
                delta_color="off")
    m[1].metric("Rebuild time (median)", fmt_ms(report.rebuild_s * 1e3), help=f"{len(report.builds)} rebuild(s) "
                f"back to back during the window; builder: {report.builder}")
    rate = report.h2d_gbps
    m[2].metric("Copy to the GPU", "— (CPU: nothing to copy)" if rate is None else f"{rate:,.1f} GB/s",
                help="Host-to-device (H2D) bandwidth of the index upload during the rebuild.")
    lat = report.latency_rows()
    during = next(r for r in lat if r["phase"] == "during")
    before = next(r for r in lat if r["phase"] == "before")
    m[3].metric("Decode p99 during rebuild", fmt_ms(during["p99_ms"]),
                delta=None if before["p99_ms"] != before["p99_ms"] else
                f"{during['p99_ms'] - before['p99_ms']:+.2f} ms vs before",
                delta_color="inverse")
    st.dataframe(pd.DataFrame(lat).rename(columns={"p50_ms": "p50 (ms)", "p99_ms": "p99 (ms)", "max_ms": "max (ms)"}),
                 hide_index=True, column_config={c: st.column_config.NumberColumn(format="%.3f")
                                                 for c in ("p50 (ms)", "p99 (ms)", "max (ms)")})
    samples = pd.DataFrame([dict(phase=p, ms=v) for p, vals in (("before", report.before_ms),
                                                               ("during", report.during_ms),
                                                               ("after", report.after_ms)) for v in vals])
    left, right = st.columns(2)
    fig = px.box(samples, x="phase", y="ms", color="phase", points="all",
                 title=f"Decode latency (batch {saved['batch']}, beam {saved['beam']}) before, during and after")
    fig.update_layout(showlegend=False, height=380, margin=dict(t=60, b=40))
    left.plotly_chart(fig, key="reb_fig_latency")
    builds = pd.DataFrame([dict(build=i + 1, phase=k, ms=v * 1e3) for i, b in enumerate(report.builds)
                           for k, v in build_phases(b).items()])
    fig = px.bar(builds, x="build", y="ms", color="phase", title="Each rebuild by phase (ms)")
    fig.update_layout(height=380, margin=dict(t=60, b=40), legend_title_text="")
    right.plotly_chart(fig, key="reb_fig_builds")
    copied = report.builds[-1].get("h2d_bytes") if report.builds else None
    st.caption(f"{len(report.during_ms)} decodes ran during {len(report.builds)} rebuild(s); builder: "
               f"{report.builder}; bytes copied to the device per build: {fmt_bytes(copied) if copied else 'n/a'}.")
    live_section(catalog, source)


guarded(main)
