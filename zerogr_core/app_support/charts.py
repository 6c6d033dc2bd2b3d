"""Tables and Plotly figures of the app's analyses.

The Density, Index, Decode and Benchmarks pages and the notebook ``docs/analysis.ipynb``
both draw from here, so the two show the same numbers the same way. Every table is a list
of dicts (one per row, columns as the app labels them); every figure is a
:class:`plotly.graph_objects.Figure`. Plotly and pandas are imported on first use.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..catalog.catalog import Catalog
from .density import histogram_counts
from .latency import SERIES_LABELS
from .profile import STAGES

#: The two decode orders, in the order the pages show them.
ORDERS = ("filter-first", "score-first")


# ---------------------------------------------------------------------------- density
def shared_head_rows(catalog: Catalog) -> list[int] | None:
    """Rows scoring first projects per beam at each step when the head is shared (``None`` if not).

    A shared head (``catalog.band_offsets`` set) holds one band per level; scoring first
    projects all of its rows at every step, as STATIC does.
    """
    if catalog.band_offsets is None:
        return None
    rows = max(o + s for o, s in zip(catalog.band_offsets, catalog.codebook_sizes))
    return [rows] * catalog.n_levels


def density_rows(stats: Sequence[Mapping], weighted: Sequence[Mapping]) -> list[dict]:
    """One row per step: catalog-level density (``Catalog.step_stats``) beside the
    beam-weighted density and wasted logits of a decode (``density.beam_weighted_density``)."""
    return [{"step": s["step"], "|V|": s["codebook"], "states S": s["states"],
             "catalog-level density": s["density"], "active beams": w["active_beams"],
             "mean valid tokens per beam": w["mean_valid"], "beam-weighted density": w["beam_density"],
             "logits scored (score first)": w["scored_logits"], "logits that can be chosen": w["valid_logits"],
             "wasted share": w["wasted_share"]} for s, w in zip(stats, weighted)]


def density_figure(rows: Sequence[Mapping]):
    """Grouped bars per step of catalog-level and beam-weighted density (log scale)."""
    import pandas as pd
    import plotly.express as px

    long = pd.DataFrame(rows).melt(id_vars="step", value_vars=["catalog-level density", "beam-weighted density"],
                                   var_name="measure", value_name="density")
    fig = px.bar(long, x="step", y="density", color="measure", barmode="group", log_y=True,
                 title="Share of the codebook that is valid, per step (log scale)")
    fig.update_layout(xaxis=dict(dtick=1), legend_title_text="", height=380, margin=dict(t=60, b=40))
    return fig


def waste_figure(rows: Sequence[Mapping]):
    """Bars per step of the share of scoring first's logits that no beam can choose."""
    import pandas as pd
    import plotly.express as px

    df = pd.DataFrame(rows)
    fig = px.bar(df, x="step", y="wasted share", text=df["wasted share"].map(lambda v: f"{100 * v:.2f}%"),
                 title="Logits scoring first computes that no beam can choose")
    fig.update_layout(xaxis=dict(dtick=1), yaxis=dict(range=[0, 1.05], tickformat=".0%"), height=380,
                      margin=dict(t=60, b=40))
    fig.update_traces(marker_color="#d9534f", textposition="inside", insidetextanchor="end",
                      textfont_color="white")
    return fig


def histogram_figure(lengths: Sequence[np.ndarray]):
    """One facet per step: how many states have each branching factor (log scale)."""
    import pandas as pd
    import plotly.express as px

    rows = []
    for level, seg in enumerate(lengths):
        values, counts = histogram_counts(np.asarray(seg))
        rows += [dict(step=f"step {level + 1}", length=int(v), states=int(c)) for v, c in zip(values, counts)]
    wrap = min(len(lengths), 4)
    fig = px.bar(pd.DataFrame(rows), x="length", y="states", facet_col="step", facet_col_wrap=wrap, log_y=True,
                 title="Segment lengths (branching factors): states per number of valid next tokens")
    fig.update_xaxes(matches=None, showticklabels=True, title_text="valid next tokens")
    fig.update_yaxes(title_text="")
    rows_needed = -(-len(lengths) // wrap)
    fig.update_layout(height=260 * rows_needed + 80, margin=dict(t=80, b=40))
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))
    return fig


# ---------------------------------------------------------------------------- index
def index_step_rows(report: Mapping) -> list[dict]:
    """One row per step of ``StepIndex.report()``: representation, sizes, density and the
    bytes of the step as built, as sparse and as dense."""
    return [{"step": r["step"], "representation": r["kind"], "|V|": r["codebook"], "states": r["states"],
             "entries": r["entries"], "density": r["density"], "longest segment": r["max_segment"],
             "bytes": r["bytes"], "as sparse": r["sparse_bytes"], "as dense": r["dense_bytes"]}
            for r in report["steps"]]


def build_rows(builder: str, build: Mapping) -> list[dict]:
    """Long rows ``builder, phase, ms`` of one build's timings (``StepIndex.build``), phases as
    :func:`zerogr_core.index.builders.build_phases` splits them."""
    from ..index.builders import build_phases

    return [dict(builder=builder, phase=phase, ms=seconds * 1e3) for phase, seconds in build_phases(build).items()]


def breakdown_figure(rows: Sequence[Mapping], title: str):
    """Stacked build time per builder and phase (rows of :func:`build_rows`)."""
    import pandas as pd
    import plotly.express as px

    from ..index.builders import H2D_PHASE

    df = pd.DataFrame(rows)
    fig = px.bar(df, x="builder", y="ms", color="phase", title=title, text=df["ms"].map(lambda v: f"{v:,.2f}"),
                 category_orders={"phase": ["layout pass", "fill", H2D_PHASE, "assemble"]})
    fig.update_layout(height=360, margin=dict(t=60, b=40), legend_title_text="")
    return fig


def bytes_comparison_figure(report: Mapping, fmt_bytes=None):
    """Total bytes of the index against the int16 SID table and the STATIC-style index (log scale)."""
    import pandas as pd
    import plotly.express as px

    from .gpu import human_bytes

    fmt_bytes = fmt_bytes or human_bytes
    comp = pd.DataFrame(dict(structure=["ZeroGR index", "SID table (int16)", "STATIC-style index"],
                             bytes=[report["total_bytes"], report["sid_table_int16_bytes"],
                                    report["static_style_bytes"]]))
    fig = px.bar(comp, x="structure", y="bytes", log_y=True, text=comp["bytes"].map(fmt_bytes),
                 color="structure", title="Total bytes (log scale)")
    fig.update_layout(showlegend=False, height=360, margin=dict(t=60, b=40))
    return fig


# ---------------------------------------------------------------------------- decode
def top_k_columns(catalog: Catalog, titles, runs: Mapping, request: int, k: int, target=None) -> dict:
    """The top-``k`` lists of one request in every order, best first, as table columns.

    Items are named by ``titles`` (catalog row → title, may be ``None``) or by item id; the
    held-out ``target`` row is marked ★; ``—`` is an unfilled beam.

    Returns
    -------
    dict
        ``rank`` and, per order, ``<order>`` (names) and ``<order> log-prob``.
    """
    data = {"rank": np.arange(1, k + 1)}
    for order, run in runs.items():
        rows = run.result.item_rows[request, :k].cpu().numpy()
        scores = run.result.scores[request, :k].float().cpu().numpy()
        names = []
        for r in rows:
            if r < 0:
                names.append("—")
                continue
            label = str(titles[r]) if titles is not None and titles[r] else f"item {catalog.item_ids[r]}"
            names.append(("★ " if target is not None and r == target else "") + label)
        data[order] = names
        data[f"{order} log-prob"] = scores
    return data


def metrics_rows(metrics: Mapping, ks: Sequence[int]) -> list[dict]:
    """Long rows ``K, measure, value`` of :func:`profile.comparison`'s overlap@K (and Recall@K
    of each order when it was given targets)."""
    rows = [dict(K=str(k), measure="overlap@K", value=metrics["overlap"][k]) for k in ks]
    if "recall_a" in metrics:
        rows += [dict(K=str(k), measure="Recall@K filter-first", value=metrics["recall_a"][k]) for k in ks]
        rows += [dict(K=str(k), measure="Recall@K score-first", value=metrics["recall_b"][k]) for k in ks]
    return rows


def metrics_figure(metrics: Mapping, ks: Sequence[int], n_requests: int):
    """Grouped bars of overlap@K and Recall@K per K."""
    import pandas as pd
    import plotly.express as px

    fig = px.bar(pd.DataFrame(metrics_rows(metrics, ks)), x="K", y="value", color="measure", barmode="group",
                 title=f"Overlap@K and Recall@K over the {n_requests} request(s) of this run")
    fig.update_layout(yaxis=dict(range=[0, 1.05], tickformat=".0%"), xaxis=dict(type="category"), height=380,
                      legend_title_text="", margin=dict(t=60, b=40))
    return fig


def stage_figure(runs: Mapping):
    """Stacked per-step latency by stage, one facet per order (``runs``: order → DecodeRun)."""
    import pandas as pd
    import plotly.express as px

    orders = [o for o in ORDERS if o in runs]
    lat = pd.DataFrame([r for order in orders for r in runs[order].per_step()])
    fig = px.bar(lat, x="step", y="ms", color="stage", facet_col="order", category_orders={
        "stage": list(STAGES), "order": orders}, title="Per-step latency by stage (ms)")
    fig.update_layout(height=380, legend_title_text="", margin=dict(t=60, b=40))
    fig.update_xaxes(dtick=1)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))
    return fig


def invalid_mass_figure(rows: Sequence[Mapping]):
    """Mean, p90 and max invalid mass per step (``recsys.quality.InvalidMass.summary()`` rows)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    steps = [f"step {r['step']}" for r in rows]
    for stat in ("mean", "p90", "max"):
        fig.add_trace(go.Bar(x=steps, y=[r[stat] for r in rows], name=stat))
    fig.update_layout(barmode="group", title="Softmax mass on invalid tokens under scoring first, per live beam",
                      yaxis=dict(tickformat=".1%", title="invalid mass"), height=360, legend_title_text="",
                      margin=dict(t=60, b=40))
    return fig


def latency_figure(latencies: Mapping):
    """Every timed whole decode of each series as points over a box (``latencies``: series →
    Latency: the two orders and, where it ran, scoring first over the valid tokens only)."""
    import pandas as pd
    import plotly.express as px

    shown = [s for s in SERIES_LABELS if s in latencies]
    data = pd.DataFrame([dict(order=SERIES_LABELS[s], ms=ms) for s in shown for ms in latencies[s].samples_ms])
    fig = px.box(data, x="order", y="ms", color="order", points="all",
                 category_orders={"order": [SERIES_LABELS[s] for s in shown]},
                 title="Whole-decode latency, every timed run (ms)")
    fig.update_layout(showlegend=False, height=380, margin=dict(t=60, b=40), xaxis_title="", yaxis_title="ms")
    return fig
