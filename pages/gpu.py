"""GPU page: live memory and utilisation (NVML + torch), and the index's share of it."""
from __future__ import annotations

import time

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from pages._common import fmt_bytes, guarded, slots
from zerogr_core.app_support import gpu as gpu_info
from zerogr_core.app_support.messages import one_line
from zerogr_core.errors import first_line

HISTORY_KEY = "gpu_history"


def held_bytes() -> dict:
    """Bytes of the live heavy objects: the index (and where it lives)."""
    index = slots().peek("index")
    if index is None:
        return dict(index=None, device="—")
    return dict(index=index.nbytes, device=str(index.device))


def gauge(title: str, value: float, total: float, suffix: str = "") -> go.Figure:
    fig = go.Figure(go.Indicator(
        mode="gauge+number", value=value, number=dict(suffix=suffix, valueformat=",.1f"),
        title=dict(text=title), gauge=dict(axis=dict(range=[0, total]), bar=dict(color="#2f6fde"))))
    fig.update_layout(height=230, margin=dict(t=50, b=10, l=30, r=30))
    return fig


def readings() -> tuple[dict | None, dict | None]:
    return gpu_info.nvml_snapshot(), gpu_info.torch_memory()


@st.fragment(run_every=2.0)
def live_panel() -> None:
    try:
        nv, tm = readings()
        held = held_bytes()
        if nv is None and tm is None:
            st.warning("The GPU stopped answering (NVML and torch report nothing).")
            return
        history = st.session_state.setdefault(HISTORY_KEY, [])
        history.append(dict(t=time.strftime("%H:%M:%S"), used=(nv or {}).get("used", 0) / 1e9,
                            allocated=(tm or {}).get("allocated", 0) / 1e9,
                            reserved=(tm or {}).get("reserved", 0) / 1e9, util=(nv or {}).get("gpu_util", 0)))
        del history[:-150]
        st.caption(f"{(nv or {}).get('name', 'GPU')} · refreshed every 2 s · {time.strftime('%H:%M:%S')}")
        cols = st.columns(3)
        if nv:
            total_gb = nv["total"] / 1e9
            cols[0].plotly_chart(gauge("Memory used (NVML, GB)", nv["used"] / 1e9, total_gb), key="gpu_g_mem")
            cols[1].plotly_chart(gauge("Utilisation (%)", nv["gpu_util"], 100), key="gpu_g_util")
        if tm:
            cols[2].plotly_chart(gauge("torch reserved (GB)", tm["reserved"] / 1e9,
                                       (nv or {}).get("total", max(tm["reserved"], 1)) / 1e9), key="gpu_g_res")
        m = st.columns(5)
        m[0].metric("NVML used / total", f"{fmt_bytes((nv or {}).get('used'))} / {fmt_bytes((nv or {}).get('total'))}")
        m[1].metric("torch allocated", fmt_bytes((tm or {}).get("allocated")))
        m[2].metric("torch reserved", fmt_bytes((tm or {}).get("reserved")))
        m[3].metric("Index", fmt_bytes(held["index"]), help=f"on {held['device']}")
        m[4].metric("Utilisation", f"{(nv or {}).get('gpu_util', 0)} %")
        df = pd.DataFrame(history)
        fig = go.Figure()
        for col, name in (("used", "NVML used"), ("reserved", "torch reserved"), ("allocated", "torch allocated")):
            fig.add_trace(go.Scatter(x=df["t"], y=df[col], name=name, mode="lines"))
        fig.update_layout(title="Memory over time (GB)", height=300, margin=dict(t=50, b=30))
        st.plotly_chart(fig, key="gpu_fig_history")
    except Exception as err:  # noqa: BLE001 — a reading must never break the timer
        st.warning(one_line(f"GPU readings failed: {type(err).__name__}: {first_line(err)}"))


def main() -> None:
    st.title("GPU")
    if not gpu_info.has_gpu():
        st.info("**No GPU on this machine.** There is no GPU memory or utilisation to show; the app runs every page "
                "on the CPU with the PyTorch reference path. On a GPU workstation this page shows live NVML "
                "memory (used/total), torch allocated/reserved memory, utilisation and the index's bytes, "
                "refreshed every 2 seconds.", icon=":material/computer:")
        held = held_bytes()
        cols = st.columns(2)
        cols[0].metric("Index in host memory", fmt_bytes(held["index"]))
        cols[1].metric("Live cached objects", ", ".join(slots().slots()) or "none")
        return
    live_panel()
    st.divider()
    st.write(f"Live cached objects: **{', '.join(slots().slots()) or 'none'}** (released so far: "
             f"{slots().releases}).")
    if st.button("Release cached GPU objects", key="btn_gpu_release"):
        n = slots().drop_all()
        st.success(f"Released {n} object(s) and emptied torch's cache.")


guarded(main)
