"""Index page: the representation and bytes of every step, the build, per-step overrides."""
from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from pages._common import (OVERRIDES_KEY, cpu_banner, device, fmt_bytes, fmt_relative, get_catalog, get_index,
                           guarded, overrides, slots)
from zerogr_core.app_support import gpu as gpu_info
from zerogr_core.app_support.charts import breakdown_figure, build_rows, bytes_comparison_figure, index_step_rows
from zerogr_core.errors import ZeroGRError
from zerogr_core.index import BUILDERS, IndexConfig, build_index, dense_bytes, h2d_gbps, sparse_bytes

AUTO = "auto (memory rule)"
CHOICES = (AUTO, "sparse", "dense")
#: Refuse overrides whose index would exceed this on the host (no GPU).
HOST_LIMIT = 4 << 30


def planned_kinds(report: dict, chosen: dict) -> list[str]:
    rule = IndexConfig()
    kinds = []
    for row in report["steps"]:
        want = chosen.get(row["step"])
        kinds.append(want if want in ("sparse", "dense") else
                     rule.choose(row["step"] - 1, row["codebook"], row["states"], row["entries"]))
    return kinds


#: Session-state key of the confirmation shown once after "Apply and rebuild".
APPLIED_KEY = "index_applied_note"


def main() -> None:
    st.title("Index")
    catalog, source = get_catalog()
    dev = device()
    st.write(f"Step-sliced index of **{source.label}** ({catalog.n_items:,} items) on **{dev}**. Each step is "
             "either a *sparse* mapping (tokens + segment offsets) or a *dense* successor table; the memory rule "
             "picks dense only where the table is small and dense.")
    cpu_banner("The index is built and kept in host memory with the host builder (the same two layout-guided "
               "passes, no H2D copy), so H2D shows as n/a.")
    index = get_index(catalog, source)
    report = index.report()
    applied = overrides()

    st.subheader("Memory")
    m = st.columns(4)
    m[0].metric("This index", fmt_bytes(report["total_bytes"]))
    m[1].metric("STATIC-style index", fmt_bytes(report["static_style_bytes"]),
                help=f"Dense V² tables over the whole vocabulary V = {report['static_vocab']:,} for the first two "
                     "steps, then CSR [token, next state] int32 pairs (docs/design.md §3, the index layout).")
    m[2].metric("Plain ID table", fmt_bytes(report["sid_table_int16_bytes"]),
                help="The catalog's semantic IDs as a table of int16 (items × levels × 2 bytes): the least any "
                     "index of the catalog could hold.")
    m[3].metric("This index, compared", fmt_relative(report["total_bytes"], report["static_style_bytes"],
                                                     "STATIC-style"))
    steps = pd.DataFrame(index_step_rows(report))
    st.dataframe(steps, hide_index=True, column_config={"density": st.column_config.NumberColumn(format="%.2e")})
    fig = bytes_comparison_figure(report, fmt_bytes)
    left, right = st.columns(2)
    left.plotly_chart(fig, key="idx_fig_total")

    build = report["build"]
    rows = build_rows(f"{build.get('builder', 'layout')} ({build.get('device', dev)})", build)
    right.plotly_chart(breakdown_figure(rows, "Build time of this index (ms)"), key="idx_fig_build")
    rate = h2d_gbps(build)
    copy = ("nothing is copied to a GPU on this machine" if dev.type != "cuda"
            else f"copied to the GPU at {rate or 0:,.1f} GB/s")
    st.caption(f"Total build {build.get('total_s', 0) * 1e3:,.2f} ms · layout pass "
               f"{build.get('layout_pass_s', 0) * 1e3:,.2f} ms · fill {build.get('fill_s', 0) * 1e3:,.2f} ms · "
               f"{copy}.")
    if st.button("Time all three builders (layout, host-copy, serial)", key="btn_idx_time_builders"):
        timed = []
        bar = st.progress(0, text="Timing builders…")
        for i, name in enumerate(BUILDERS):
            built = build_index(catalog, device=dev, builder=name, config=IndexConfig().with_overrides(applied))
            timed += build_rows(name, built.build)
            del built
            bar.progress((i + 1) / len(BUILDERS), text=f"{name} done")
        bar.empty()
        st.session_state["index_builders"] = (source, timed)
    saved = st.session_state.get("index_builders")
    if saved and saved[0] == source:
        st.plotly_chart(breakdown_figure(saved[1], "Build time per builder (ms); the three build byte-identical "
                                                   "indexes"), key="idx_fig_builders")

    st.subheader("Per-step representation")
    st.caption("Override the memory rule for any step. The table and chart show the effect at once; *Apply* "
               "rebuilds the index that the Decode and Rebuild pages use (the previous one is released).")
    cols = st.columns(min(len(report["steps"]), 8))
    chosen = {}
    for i, row in enumerate(report["steps"]):
        key = f"idx_ov_{row['step']}"
        st.session_state.setdefault(key, applied.get(row["step"], AUTO))
        pick = cols[i % len(cols)].selectbox(f"Step {row['step']}", CHOICES, key=key)
        if pick != AUTO:
            chosen[row["step"]] = pick
    kinds = planned_kinds(report, chosen)
    plan_rows = []
    for row, kind in zip(report["steps"], kinds):
        planned = dense_bytes(row["codebook"], row["states"], row["entries"]) if kind == "dense" else \
            sparse_bytes(row["codebook"], row["states"], row["entries"])
        plan_rows.append(dict(step=row["step"], now=row["kind"], planned=kind, **{"bytes now": row["bytes"],
                              "bytes planned": planned, "change": planned - row["bytes"]}))
    plan = pd.DataFrame(plan_rows)
    total_planned = int(plan["bytes planned"].sum())
    delta = total_planned - report["total_bytes"]
    p = st.columns(3)
    p[0].metric("Planned index", fmt_bytes(total_planned),
                delta=None if delta == 0 else ("+" if delta > 0 else "−") + fmt_bytes(abs(delta)),
                delta_color="inverse")
    p[1].metric("Planned index, compared", fmt_relative(total_planned, report["static_style_bytes"], "STATIC-style"))
    p[2].metric("Planned index vs plain IDs", fmt_relative(total_planned, report["sid_table_int16_bytes"],
                                                           "the plain ID table"))
    long = plan.melt(id_vars="step", value_vars=["bytes now", "bytes planned"], var_name="index", value_name="bytes")
    fig = px.bar(long, x="step", y="bytes", color="index", barmode="group", log_y=True,
                 title="Bytes per step: now vs planned (log scale)")
    fig.update_layout(xaxis=dict(dtick=1), height=340, margin=dict(t=60, b=40), legend_title_text="")
    st.plotly_chart(fig, key="idx_fig_plan")
    st.dataframe(plan, hide_index=True)
    if st.button("Apply and rebuild", type="primary", key="btn_idx_apply", disabled=chosen == applied):
        limit = HOST_LIMIT
        if dev.type == "cuda":
            snap = gpu_info.nvml_snapshot() or {}
            limit = int(0.8 * (snap.get("total", 0) - snap.get("used", 0))) or HOST_LIMIT
        if total_planned > limit:
            raise ZeroGRError(f"the planned index needs {fmt_bytes(total_planned)}, more than the "
                              f"{fmt_bytes(limit)} this app allows on {dev}; keep the large steps sparse")
        st.session_state[OVERRIDES_KEY] = chosen
        st.session_state.pop("decode_runs", None)
        with st.spinner("Rebuilding the index with the new representation per step…"):
            index = get_index(catalog, source, over=chosen)
        st.session_state[APPLIED_KEY] = (f"Index rebuilt in {index.build['total_s'] * 1e3:,.1f} ms: "
                                         f"{fmt_bytes(index.report()['total_bytes'])}; the Decode and Rebuild pages "
                                         "use it now.")
        st.rerun()
    applied_note = st.session_state.pop(APPLIED_KEY, None)
    if applied_note:
        st.success(applied_note, icon=":material/check_circle:")
    st.caption(f"Kept in memory for this browser session: {', '.join(slots().slots()) or 'nothing'}; released "
               f"so far: {slots().releases}.")


guarded(main)
