"""Plotly figures of benchmark results (made after a run, on any machine with Plotly).

Every ``figure_*`` function takes the records of :func:`load_results` and returns a
``plotly.graph_objects.Figure`` (with a "no data" note when the records hold nothing for
it), so docs/results.md, the app's benchmark page and :func:`save_figures` share them.

Command line::

    python -m zerogr_core.bench.figures runs/results            # HTML (+ PNG if kaleido works)
    python -m zerogr_core.bench.figures runs/results --out DIR --no-png
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .results import load_results

METHOD_ORDER = ["zerogr", "static", "static-adapted", "unconstrained", "cpu-trie", "naive-selective"]
COLORS = {"zerogr": "#d62728", "static": "#1f77b4", "static-adapted": "#17becf", "unconstrained": "#7f7f7f",
          "cpu-trie": "#9467bd", "naive-selective": "#ff7f0e", "band-gemm": "#2ca02c", "head-gemm": "#8c564b",
          "band-gemm-head-dtype-out": "#98df8a"}
#: End-to-end methods (``bench-e2e``), in legend order, and their colours.
E2E_COLORS = {"zerogr": "#d62728", "zerogr-partial": "#e377c2", "zerogr-full": "#8c564b", "zerogr-hf-cache": "#ff9896",
              "static": "#1f77b4", "unconstrained": "#7f7f7f", "model-only": "#2ca02c", "hf-constrained": "#9467bd",
              "hf-unconstrained": "#c5b0d5"}
STAGE_COLORS = {"filtering+projection": "#1f77b4", "normalisation": "#ff7f0e", "selection+gather": "#2ca02c"}
STRUCT_COLORS = {"zerogr": "#d62728", "zerogr (all sparse)": "#ff9896", "static-style": "#1f77b4",
                 "sid-table-int16": "#7f7f7f", "host-trie": "#9467bd"}

__all__ = ["load_results", "latency_table", "headline_rows", "figure_speedup", "figure_latency",
           "figure_beam_sweep", "figure_codebook_sweep", "figure_steps", "figure_stages", "figure_ablation",
           "figure_memory", "figure_build", "figure_interference", "figure_e2e", "all_figures", "save_figures"]


# ---------------------------------------------------------------------------- helpers
def _empty(title: str, note: str = "no results for this figure yet") -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=note, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=14))
    fig.update_layout(title=title, xaxis_visible=False, yaxis_visible=False, template="plotly_white", height=320)
    return fig


def _config(r: dict) -> str:
    return f"{str(r.get('dtype', '')).upper()}/H{r.get('hidden')}"


def _ok_latency(records, suites=None):
    for r in records:
        if r.get("kind") == "latency" and r.get("status") == "ok" and (suites is None or r.get("suite") in suites):
            yield r


def latency_table(records: list[dict], suites=("headline",)) -> dict:
    """{(catalog_label, config, beam, codebook, batch): {method: {mode: median_ms}}} (later records win)."""
    table: dict = defaultdict(dict)
    for r in _ok_latency(records, suites):
        key = (r.get("catalog_label"), _config(r), r.get("beam"), r.get("codebook"), int(r["batch"]))
        table[key].setdefault(r["method"], {})[r["mode"]] = r["median_ms"]
    return table


def _best(per_mode: dict):
    if "graph" in per_mode:
        return per_mode["graph"]
    return per_mode.get("eager")


def headline_rows(records: list[dict], suites=("headline",)) -> list[dict]:
    """Rows for the results/app table: per catalog, config and batch, every method's best
    median (graph replay where captured) and zerogr's speedup over each baseline."""
    rows = []
    for (cat, cfg, beam, cb, batch), methods in sorted(latency_table(records, suites).items(),
                                                       key=lambda kv: (str(kv[0][0]), kv[0][1], kv[0][2] or 0,
                                                                       kv[0][3] or 0, kv[0][4])):
        row = dict(catalog=cat, config=cfg, beam=beam, batch=batch)
        z = _best(methods.get("zerogr", {}))
        for m in METHOD_ORDER:
            if m in methods:
                v = _best(methods[m])
                row[f"{m} ms"] = v
                if m != "zerogr" and z:
                    row[f"speedup vs {m}"] = v / z
        rows.append(row)
    return rows


def _grid(keys, title: str, x_title: str, y_title: str, log_y=False, log_x=False, shared_y=False):
    keys = list(keys)
    cols = min(len(keys), 2) or 1
    rows = -(-len(keys) // cols) or 1
    height = max(420, 340 * rows + 80)
    # Plotly's spacing is a fraction of the figure: keep about 90 px between rows however many there are.
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[str(k) for k in keys], shared_yaxes=shared_y,
                        horizontal_spacing=0.08, vertical_spacing=min(0.14, 90 / height) if rows > 1 else 0.1)
    fig.update_layout(title=title, template="plotly_white", height=height,
                      legend=dict(orientation="h", yanchor="top", y=-0.18 if rows == 1 else -0.08),
                      margin=dict(b=130))
    fig.update_xaxes(title_text=x_title, type="log" if log_x else None)
    fig.update_yaxes(title_text=y_title, type="log" if log_y else None)
    return fig, cols


def _ticks(fig, values) -> None:
    """Label a log x axis at exactly the values measured (batch sizes, beams, codebooks)."""
    values = sorted(v for v in values if v is not None)
    if values:
        fig.update_xaxes(tickvals=values, ticktext=[str(v) for v in values])


def _pos(i: int, cols: int):
    return dict(row=i // cols + 1, col=i % cols + 1)


def _legend(fig: go.Figure) -> go.Figure:
    """One legend entry per series drawn, and none for anything else.

    A trace with no point (a method or stage the records do not hold in that panel) is
    dropped; the traces of one name (the same method in every panel) form one legend group,
    listed once from the first panel that draws it, so a method absent from the first panel
    is still named; the legend shows even for a single series.
    """
    def points(t) -> bool:
        values = t.x if getattr(t, "orientation", None) == "h" else t.y
        return values is not None and any(v is not None for v in values)

    fig.data = [t for t in fig.data if t.type == "table" or points(t)]
    named = set()
    for t in fig.data:
        if t.type == "table":
            continue
        t.legendgroup, t.showlegend = t.name, t.name not in named
        named.add(t.name)
    if named:
        fig.update_layout(showlegend=True)
    return fig


# ---------------------------------------------------------------------------- latency figures
def figure_speedup(records: list[dict], suites=("headline",)) -> go.Figure:
    """Speedup of zerogr (graph replay) over each baseline (its best mode) against batch size,
    one panel per catalog and dtype/hidden configuration."""
    table = latency_table(records, suites)
    panels = defaultdict(lambda: defaultdict(list))
    for (cat, cfg, beam, cb, batch), methods in table.items():
        z = _best(methods.get("zerogr", {}))
        if not z:
            continue
        for m, per_mode in methods.items():
            if m == "zerogr":
                continue
            panels[(cat, cfg, beam)][m].append((batch, _best(per_mode) / z))
    if not panels:
        return _empty("Speedup of zerogr over the baselines")
    keys = sorted(panels, key=str)
    fig, cols = _grid([f"{k[0]} · {k[1]} · beam {k[2]}" for k in keys],
                      "Speedup of zerogr over each baseline (whole decode, model forward excluded)", "batch size",
                      "speedup (×, baseline time / zerogr time)", log_y=True, log_x=True)
    _method_lines(fig, cols, keys, panels)
    for i in range(len(keys)):
        fig.add_hline(y=1.0, line_dash="dot", line_color="black", **_pos(i, cols))
    _ticks(fig, {k[4] for k in table})
    return _legend(fig)


def _method_lines(fig: go.Figure, cols: int, keys: list, panels) -> None:
    """One line per method in each panel: ``panels[key][method]`` holds (x, y, …) points."""
    for i, key in enumerate(keys):
        for m in METHOD_ORDER:
            pts = sorted(panels[key].get(m, []))
            if not pts:
                continue
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=m,
                                     line=dict(color=COLORS.get(m))),
                          **_pos(i, cols))


def figure_latency(records: list[dict], suites=("headline",)) -> go.Figure:
    """Median whole-decode latency of every method against batch size (log-log)."""
    table = latency_table(records, suites)
    panels = defaultdict(lambda: defaultdict(list))
    for (cat, cfg, beam, cb, batch), methods in table.items():
        for m, per_mode in methods.items():
            panels[(cat, cfg, beam)][m].append((batch, _best(per_mode), "graph" in per_mode))
    if not panels:
        return _empty("Decode latency")
    keys = sorted(panels, key=str)
    fig, cols = _grid([f"{k[0]} · {k[1]} · beam {k[2]}" for k in keys],
                      "Decode latency, all steps (median; graph replay where capturable, else eager)", "batch size",
                      "latency (ms)", log_y=True, log_x=True)
    _method_lines(fig, cols, keys, panels)
    _ticks(fig, {k[4] for k in table})
    return _legend(fig)


def _sweep(records, suite: str, field: str, title: str, x_title: str) -> go.Figure:
    panels = defaultdict(lambda: defaultdict(dict))
    for r in _ok_latency(records, (suite,)):
        x = r.get(field) if field != "codebook" else (r.get("codebook") or int(str(r.get("codebooks")).split("/")[0]))
        key = (_config(r), int(r["batch"]))
        panels[key][r["method"]].setdefault(x, {})[r["mode"]] = r["median_ms"]
    if not panels:
        return _empty(title)
    keys = sorted(panels, key=lambda k: (k[0], k[1]))
    fig, cols = _grid([f"{k[0]} · batch {k[1]}" for k in keys], title, x_title, "latency (ms)", log_y=True,
                      log_x=True)
    _ticks(fig, {x for per in panels.values() for pm in per.values() for x in pm})
    for i, key in enumerate(keys):
        for m in METHOD_ORDER:
            pts = sorted((x, _best(pm)) for x, pm in panels[key].get(m, {}).items())
            if not pts:
                continue
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=m,
                                     line=dict(color=COLORS.get(m))),
                          **_pos(i, cols))
    return _legend(fig)


def figure_beam_sweep(records: list[dict]) -> go.Figure:
    """Latency of every method against beam width (synthetic-7 by default)."""
    return _sweep(records, "beam-sweep", "beam", "Beam-width sweep (synthetic-7)", "beam width M")


def figure_codebook_sweep(records: list[dict]) -> go.Figure:
    """Latency of every method against the codebook size V of synthetic-7."""
    return _sweep(records, "codebook-sweep", "codebook", "Codebook-size sweep (synthetic-7)", "codebook size V")


# ---------------------------------------------------------------------------- per step / stage
def figure_steps(records: list[dict], mode: str | None = None) -> go.Figure:
    """Per-step latency of each method (each step's own graph; eager where not capturable)."""
    panels = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r.get("kind") != "step" or r.get("step") == "sum":
            continue
        key = (r.get("catalog_label"), _config(r), int(r["batch"]))
        per = panels[key][r["method"]].setdefault(int(r["step"]), {})
        per[r["mode"]] = r["median_us"]
    if not panels:
        return _empty("Per-step latency")
    keys = sorted(panels, key=str)
    fig, cols = _grid([f"{k[0]} · {k[1]} · batch {k[2]}" for k in keys],
                      "Per-step latency (each step timed alone; graph replay where capturable)", "step",
                      "latency (µs)", log_y=True)
    methods = METHOD_ORDER + ["band-gemm", "band-gemm-head-dtype-out", "head-gemm"]
    for i, key in enumerate(keys):
        for m in methods:
            steps = panels[key].get(m)
            if not steps:
                continue
            xs = sorted(steps)
            ys = [(steps[s].get(mode) if mode else _best(steps[s])) for s in xs]
            fig.add_trace(go.Bar(x=[f"step {s}" for s in xs], y=ys, name=m,
                                 marker_color=COLORS.get(m)), **_pos(i, cols))
    fig.update_layout(barmode="group")
    return _legend(fig)


def figure_stages(records: list[dict]) -> go.Figure:
    """zerogr per step, stacked: filtering+projection, normalisation, selection+gather
    (unfused, each timed in its own graph); the fused step time as a marker."""
    panels = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r.get("kind") != "stage" or r.get("step") == "sum":
            continue
        key = (r.get("catalog_label"), _config(r), int(r["batch"]))
        panels[key][int(r["step"])][r["stage"]] = r["median_us"]
    if not panels:
        return _empty("Per-stage latency")
    keys = sorted(panels, key=str)
    fig, cols = _grid([f"{k[0]} · {k[1]} · batch {k[2]}" for k in keys],
                      "zerogr per step and stage (unfused stages stacked; ◆ = fused step)", "step", "latency (µs)")
    for i, key in enumerate(keys):
        steps = sorted(panels[key])
        xs = [f"step {s}" for s in steps]
        for stage, color in STAGE_COLORS.items():
            fig.add_trace(go.Bar(x=xs, y=[panels[key][s].get(stage) for s in steps], name=stage,
                                 marker_color=color), **_pos(i, cols))
        fig.add_trace(go.Scatter(x=xs, y=[panels[key][s].get("fused step") for s in steps], mode="markers",
                                 name="fused step",
                                 marker=dict(symbol="diamond", size=10, color="black")), **_pos(i, cols))
    fig.update_layout(barmode="stack")
    return _legend(fig)


def figure_ablation(records: list[dict]) -> go.Figure:
    """The step-2 ablation (the paper's Table 1) as a table: full projection vs naive
    selective vs slot-based selective, projection alone / with filtering / whole step."""
    rows = defaultdict(dict)
    for r in records:
        if r.get("kind") != "ablation":
            continue
        key = (r.get("catalog_label"), _config(r), int(r["batch"]), r.get("valid_logits"), r.get("full_logits"))
        cell = rows[(key, r["variant"])]
        prev = cell.get(r["part"])
        if prev is None or r["mode"] == "graph":
            cell[r["part"]] = (r["median_us"], r["mode"])
    if not rows:
        return _empty("Step-2 ablation")
    order = {"full projection": 0, "dense full projection": 1, "naive selective": 2, "slot-based selective": 3}
    items = sorted(rows.items(), key=lambda kv: (str(kv[0][0]), order.get(kv[0][1], 9)))
    cols = {k: [] for k in ("catalog", "config", "batch", "valid / full logits", "variant", "projection (µs)",
                            "filtering+projection (µs)", "whole step (µs)")}
    for (key, variant), parts in items:
        cols["catalog"].append(key[0])
        cols["config"].append(key[1])
        cols["batch"].append(key[2])
        cols["valid / full logits"].append(f"{key[3]:,} / {key[4]:,}" if key[3] is not None else "—")
        cols["variant"].append(variant)
        for part in ("projection", "filtering+projection", "whole step"):
            v = parts.get(part)
            text = "—" if v is None else f"{v[0]:.1f}" + (" (eager)" if v[1] == "eager" else "")
            cols[f"{part} (µs)"].append(text)
    fig = go.Figure(go.Table(header=dict(values=list(cols), fill_color="#dbe6f3", align="left"),
                             cells=dict(values=list(cols.values()), align="left")))
    fig.update_layout(title="Step-2 ablation: full projection vs naive selective vs slot-based selective",
                      height=200 + 40 * len(items))
    return _legend(fig)


# ---------------------------------------------------------------------------- memory / build / interference
def figure_memory(records: list[dict]) -> go.Figure:
    """Index bytes per step and in total: zerogr vs STATIC-style vs int16 SID table (log scale)."""
    panels = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r.get("kind") == "memory":
            step = "total" if r.get("step") == "total" else f"step {r['step']}"
            panels[r.get("catalog_label")][r["structure"]][step] = r["bytes"]
    if not panels:
        return _empty("Index memory")
    keys = sorted(panels, key=str)
    fig, cols = _grid(keys, "Index memory: zerogr vs STATIC-style vs the int16 SID table", "", "bytes", log_y=True)
    for i, key in enumerate(keys):
        for struct, color in STRUCT_COLORS.items():
            per = panels[key].get(struct)
            if not per:
                continue
            xs = sorted((k for k in per if k != "total"), key=lambda s: int(s.split()[1])) + ["total"]
            fig.add_trace(go.Bar(x=xs, y=[per.get(x) for x in xs], name=struct,
                                 marker_color=color), **_pos(i, cols))
    fig.update_layout(barmode="group")
    return _legend(fig)


def figure_build(records: list[dict]) -> go.Figure:
    """Index construction time per builder, and the H2D bandwidth an update window needs."""
    builds = [r for r in records if r.get("kind") == "build" and r.get("total_s") is not None
              and r.get("builder") != "catalog generation"]
    bw = [r for r in records if r.get("kind") == "bandwidth"]
    if not builds and not bw:
        return _empty("Index construction")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.28,
                        subplot_titles=["construction time (s)", "H2D bandwidth to ship within a window (MB/s)"])
    cats = sorted({r.get("catalog_label") for r in builds + bw}, key=str)
    for cat in cats:
        rows = [r for r in builds if r.get("catalog_label") == cat]
        fig.add_trace(go.Bar(y=[r["builder"] for r in rows], x=[r["total_s"] for r in rows], orientation="h",
                             name=f"{cat} build", text=[f"{r['total_s']:.2f} s" for r in rows],
                             textposition="auto"), row=1, col=1)
        rows = [r for r in bw if r.get("catalog_label") == cat]
        for window in ("60s", "90s"):
            fig.add_trace(go.Bar(y=[r["structure"] for r in rows], x=[r[f"window_{window}_gbps"] * 1e3 for r in rows],
                                 orientation="h", name=f"{cat} within {window}"), row=1, col=2)
    pinned = [r.get("h2d_pinned_gbps") for r in bw if r.get("h2d_pinned_gbps")]
    if pinned:
        fig.add_annotation(text=f"measured pinned H2D: {max(pinned):.1f} GB/s", xref="paper", yref="paper",
                           x=1.0, y=-0.18, showarrow=False)
    fig.update_xaxes(type="log", row=1, col=2)
    fig.update_layout(title="Index construction: layout-guided streaming vs full host vs serial vs STATIC-style",
                      template="plotly_white", height=420, barmode="group")
    return _legend(fig)


def figure_interference(records: list[dict]) -> go.Figure:
    """Decode p50/p99 with and without a concurrent index rebuild."""
    rows = [r for r in records if r.get("kind") == "interference"]
    if not rows:
        return _empty("Decode latency during a rebuild")
    fig = go.Figure()
    labels = [f"{r.get('catalog_label')} {_config(r)} b{r['batch']}<br>{r['condition']}" for r in rows]
    for q, name in (("median_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9")):
        fig.add_trace(go.Bar(x=labels, y=[r.get(q) for r in rows], name=name))
    fig.update_layout(title="zerogr decode latency while the index is rebuilt (background thread)",
                      yaxis_title="latency (ms)", barmode="group", template="plotly_white", height=420)
    return _legend(fig)


# ---------------------------------------------------------------------------- all together
def figure_e2e(records: list[dict]) -> go.Figure:
    """End-to-end latency (model included) of every ``bench-e2e`` method against batch size,
    one panel per model, catalog, dtype and beam width (log-log; later records win)."""
    panels = defaultdict(dict)
    for r in records:
        if r.get("suite") != "e2e" or r.get("method") not in E2E_COLORS or not r.get("median_ms"):
            continue
        key = (r.get("model_kind") or r.get("model"), r.get("catalog"), r.get("dtype"), r.get("beam"))
        panels[key].setdefault(r["method"], {})[int(r["batch"])] = r["median_ms"]
    if not panels:
        return _empty("End-to-end latency, model included")
    keys = sorted(panels, key=str)
    fig, cols = _grid([f"{k[0]} · {k[1]} · {k[2]} · beam {k[3]}" for k in keys],
                      "End-to-end latency, model included (median)", "batch size", "latency (ms)", log_y=True,
                      log_x=True)
    batches = set()
    for i, key in enumerate(keys):
        for m, color in E2E_COLORS.items():
            pts = sorted(panels[key].get(m, {}).items())
            batches.update(b for b, _ in pts)
            if pts:
                fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=m,
                                         line=dict(color=color)), **_pos(i, cols))
    _ticks(fig, batches)
    return _legend(fig)


def all_figures(records: list[dict]) -> dict:
    """Every figure, by file stem."""
    return {"speedup": figure_speedup(records), "latency": figure_latency(records),
            "beam_sweep": figure_beam_sweep(records), "codebook_sweep": figure_codebook_sweep(records),
            "steps": figure_steps(records), "stages": figure_stages(records), "ablation": figure_ablation(records),
            "memory": figure_memory(records), "build": figure_build(records),
            "interference": figure_interference(records), "e2e": figure_e2e(records)}


def save_figures(records: list[dict], out_dir, png: bool = True, only=None) -> dict:
    """Write every figure (or those named in ``only``) as HTML, and as PNG when kaleido can render it.

    Returns
    -------
    dict
        ``{"html": [paths], "png": [paths], "png_error": str or None}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {"html": [], "png": [], "png_error": None}
    for stem, fig in all_figures(records).items():
        if only and stem not in only:
            continue
        html = out / f"{stem}.html"
        fig.write_html(html, include_plotlyjs="cdn")
        written["html"].append(str(html))
        if png and written["png_error"] is None:
            try:
                path = out / f"{stem}.png"
                fig.write_image(path, width=1200, height=fig.layout.height or 500, scale=1)
                written["png"].append(str(path))
            except Exception as exc:  # noqa: BLE001 - kaleido or its browser missing
                written["png_error"] = f"{type(exc).__name__}: {exc}"
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerogr_core.bench.figures",
                                     description="Make the benchmark figures from result JSON files.")
    parser.add_argument("results", nargs="+", help="result files or folders (searched recursively)")
    parser.add_argument("--out", default=None, help="output folder (default: figures/ beside the first RESULTS)")
    parser.add_argument("--no-png", action="store_true", help="HTML only")
    parser.add_argument("--only", default=None, metavar="STEM,…",
                        help="write only these figures (e.g. e2e); the others are left as they are")
    args = parser.parse_args(argv)
    only = None
    if args.only:
        stems = set(all_figures([]))
        only = {x.strip() for x in args.only.split(",") if x.strip()}
        if not only or only - stems:
            print(f"error: --only: choose from {', '.join(sorted(stems))}")
            return 2
    records = [r for path in args.results for r in load_results(path)]
    if not records:
        print(f"no benchmark results under {' '.join(args.results)}")
        return 1
    src = Path(args.results[0])
    out = Path(args.out) if args.out else (src if src.is_dir() else src.parent) / "figures"
    written = save_figures(records, out, png=not args.no_png, only=only)
    print(f"{len(records)} records → {len(written['html'])} HTML and {len(written['png'])} PNG figures in {out}")
    if written["png_error"]:
        print(f"PNG export skipped: {written['png_error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
