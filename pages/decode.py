"""Decode page: filtering first against scoring first, side by side."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st
import torch

from pages._common import (BUNDLED_MODELS, bundled_dataset, cached_study, cached_test_users, check_work, cpu_banner,
                           decode_inputs, device, fmt_ms, get_catalog, get_index, guarded, index_key, overrides, slots)
from zerogr_core import Decoder
from zerogr_core.app_support import movielens
from zerogr_core.app_support.charts import metrics_figure, stage_figure, top_k_columns
from zerogr_core.app_support.profile import (comparison, invalid_mass, k_values, profiled_decode, steady_cpu_timing,
                                             time_decoder)
from zerogr_core.app_support.requests import DTYPES
from zerogr_core.decode.constraints import RequestLists
from zerogr_core.decode.heads import Heads
from zerogr_core.decode.ops import REFERENCE
from zerogr_core.decode.reference_plan import make_reference_plan, plan_projection, plan_rows
from zerogr_core.recsys.quality import SEEN_NORMALISE

ORDERS = ("filter-first", "score-first")
BUNDLED = "Bundled MovieLens recommender"
#: The model choice of each catalog that comes with a trained recommender.
BUNDLED_LABELS = {"movielens": BUNDLED, "amazon-beauty": "Bundled Amazon Beauty recommender (T5, tiger preset)"}
RANDOM = "Random head"
USERS = "Random test users"
ONE_USER = "One test user"
RANDOM_REQ = "Random requests"
#: Session-state key set while a decode runs, so the page can say when one was cut short.
PENDING_KEY = "decode_pending"


def gpu_decoders(index, heads, bands, beam: int, key: tuple) -> dict:
    """Decoders of both orders on the GPU (filter-first plans and captures a CUDA graph)."""
    return slots().get("decoders", key, lambda: {o: Decoder(index, heads, beam, order=o, band_offsets=bands)
                                                 for o in ORDERS})


def settings(catalog, source) -> dict:
    gpu = device().type == "cuda"
    dataset = bundled_dataset(source)
    models = [BUNDLED_LABELS[dataset], RANDOM] if dataset else [RANDOM]
    if st.session_state.get("dec_model") not in models:
        st.session_state["dec_model"] = models[0]
    st.session_state.setdefault("dec_hidden", 1024 if gpu else 64)
    st.session_state.setdefault("dec_dtype", "float16" if gpu else "float32")
    st.session_state.setdefault("dec_batch", 32 if gpu else 8)
    st.session_state.setdefault("dec_beam", 128 if gpu else 32)
    st.session_state.setdefault("dec_k", 10)
    st.session_state.setdefault("dec_seed", 0)
    c = st.columns([2, 1, 1, 1, 1])
    model = c[0].selectbox("Model", models, key="dec_model")
    bundled = model != RANDOM
    hidden = int(c[1].number_input("Hidden size", 8, 8192, step=8, key="dec_hidden", disabled=bundled))
    dtype = c[2].selectbox("dtype", list(DTYPES), key="dec_dtype", disabled=bundled)
    beam = int(c[3].number_input("Beam width M", 1, 1024, key="dec_beam"))
    c[4].number_input("K (top-K shown)", 1, 1024, key="dec_k")  # read when the results are shown
    c = st.columns([2, 1, 2, 1])
    requests = [USERS, ONE_USER] if bundled else [RANDOM_REQ]
    if st.session_state.get("dec_request") not in requests:
        st.session_state["dec_request"] = requests[0]
    request = c[0].selectbox("Requests", requests, key="dec_request")
    one = request == ONE_USER
    batch = int(c[1].number_input("Batch", 1, 1024, key="dec_batch", disabled=one))
    user = None
    if one:
        users = cached_test_users(str(device()), dataset)
        st.session_state.setdefault("dec_user", int(users.user_ids[0]))
        user = int(c[2].selectbox("Test user", users.user_ids.tolist(), key="dec_user"))
        batch = 1
    seed = int(c[3].number_input("Seed", 0, 10**6, key="dec_seed", disabled=one))
    exclude = bundled and st.checkbox(
        "Exclude each user's history (items already rated or bought)", key="dec_exclude",
        help="A per-request deny list enforced during decoding: prefixes with no item outside the history below "
             "them are never scored or kept. Filtering first keeps the catalog's normalisation, so the other "
             "items rank as with the history kept (the quality study's protocol).")
    if bundled:
        hidden, dtype = None, "float32"
    return dict(source=source, overrides=tuple(sorted(overrides().items())), model=model,
                dataset=dataset if bundled else None, hidden=hidden,
                dtype=dtype, beam=beam, batch=batch, request=request, user=user, seed=seed,
                exclude_history=bool(exclude))


def run_comparison(catalog, source, cfg: dict) -> dict:
    """Both orders on the same requests: a stage-profiled decode each (the top-K lists and the
    stage chart both come from it), the invalid mass scoring first meets, and on a GPU the
    timed CUDA-graph decodes."""
    dev = device()
    check_work(catalog, cfg["batch"], cfg["beam"])
    index = get_index(catalog, source)
    bar = st.progress(0, text="Preparing the model and requests…")
    inputs = decode_inputs(catalog, dev, bundled=cfg["dataset"] is not None, batch=cfg["batch"], seed=cfg["seed"],
                           hidden=cfg["hidden"], dtype=cfg["dtype"], user=cfg["user"], dataset=cfg["dataset"],
                           beam=cfg["beam"])
    heads, bands, fn = inputs.heads, inputs.band_offsets, inputs.hidden_fn
    histories, lists = None, None
    if inputs.user_ids is not None:
        users = cached_test_users(str(dev), cfg["dataset"])
        histories = [users.histories[int(np.flatnonzero(users.user_ids == u)[0])] for u in inputs.user_ids]
        if cfg.get("exclude_history"):
            lists = RequestLists.from_rows(deny=histories, normalise=SEEN_NORMALISE)
    out = dict(cfg=cfg, targets=inputs.targets, user_ids=inputs.user_ids, runs={}, timing={}, plan=None,
               graph_error=None, random=inputs.random, invalid=None, graph_differs=[], histories=histories)
    projection = None
    if dev.type != "cuda":
        bar.progress(5, text="CPU: timing full against selective projection per step (once per shape)…")
        plan = cpu_plan(index, heads, bands, cfg, fn, (index_key(source, overrides(), dev), inputs.model_key))
        projection = plan_projection(plan)
        out["plan"] = plan_rows(plan)
    for i, order in enumerate(ORDERS):
        bar.progress(10 + 30 * i, text=f"{order}: decoding {cfg['batch']} request(s) with beam {cfg['beam']}…")
        with steady_cpu_timing(dev):
            out["runs"][order] = profiled_decode(index, heads, cfg["beam"], order, fn, cfg["batch"],
                                                 band_offsets=bands, lists=lists,
                                                 projection=projection if order == "filter-first" else None)
    bar.progress(70, text="Invalid mass under scoring first…")
    out["invalid"] = invalid_mass(catalog, index, heads, cfg["beam"], fn, cfg["batch"], band_offsets=bands)
    if dev.type == "cuda":
        bar.progress(85, text="GPU: warm-up plan, CUDA-graph capture and timed replays…")
        decoders = gpu_decoders(index, heads, bands, cfg["beam"],
                                (index_key(source, overrides(), dev), inputs.model_key, cfg["beam"]))

        def warm_up_progress(fraction, text):  # the engine plans and compiles at its first decode
            bar.progress(85 + int(10 * fraction), text=f"GPU warm-up: {text}…")

        for order in ORDERS:
            result, timing = time_decoder(decoders[order], fn, cfg["batch"], progress=warm_up_progress,
                                          lists=lists)
            out["timing"][order] = timing
            if not torch.equal(result.item_rows.cpu(), out["runs"][order].result.item_rows.cpu()):
                out["graph_differs"].append(order)
        engine = decoders["filter-first"].gpu_engine
        if engine is not None:
            plan = engine.plans.get(engine.key(cfg["batch"]))  # this shape's (a failed capture is in it)
            out["plan"] = plan.table() if plan is not None else None
            out["graph_error"] = plan.graph_error if plan is not None else None
    bar.progress(100, text="Done")
    bar.empty()
    return out


def show_invalid_mass(res: dict) -> None:
    rows = res.get("invalid")
    if not rows:
        return
    st.subheader("Mass on invalid tokens under scoring first")
    table = pd.DataFrame([{"step": r["step"], "live beams": r["beams"], "mean": r["mean"], "p50": r["p50"],
                           "p90": r["p90"], "max": r["max"], "valid share of the codebook": r["beam_density"]}
                          for r in rows])
    st.dataframe(table, hide_index=True, column_config={
        c: st.column_config.NumberColumn(format="%.3f")
        for c in ("mean", "p50", "p90", "max", "valid share of the codebook")})
    if res.get("random"):
        st.caption("A random head knows nothing of the catalog: at every step it spreads most of its mass over "
                   "tokens that lead to no item. Filtering first renormalises over the valid tokens; scoring "
                   "first normalises over all of them and then masks, so the two orders rank beams differently "
                   "exactly where that invalid mass is large — hence the low overlap here. The paper's claim is "
                   "about trained models, which put little mass on invalid tokens; pick the bundled MovieLens "
                   "recommender to see that case.")
    else:
        st.caption("The less mass a model puts on invalid tokens, the less the two orders can disagree: with "
                   "none at all, renormalising over the valid tokens changes no ranking.")


def cpu_plan(index, heads, bands, cfg: dict, fn, key: tuple):
    """The reference path's per-step plan for this shape: full against selective projection
    timed once on the CPU (one torch thread, as the profiled decodes run), then kept."""
    def factory():
        with steady_cpu_timing(index.device):
            return make_reference_plan(index, Heads.build(heads, index.codebook_sizes, bands), cfg["beam"],
                                       fn, cfg["batch"], ops=REFERENCE)

    return slots().get("cpu_plan", key + (cfg["beam"], cfg["batch"], cfg["dtype"], cfg["hidden"]), factory)


def titles_for(catalog, dataset):
    if dataset is not None:
        return cached_test_users(str(device()), dataset).titles
    return catalog.titles


def top_k_table(catalog, titles, runs: dict, request: int, k: int, target) -> pd.DataFrame:
    data = top_k_columns(catalog, titles, runs, request, k, target)
    return pd.DataFrame(data)


def show_history_hits(res: dict, cfg: dict) -> None:
    """How many returned beams are items of the user's history (0 when excluded)."""
    hits, total = {}, 0
    for order, run in res["runs"].items():
        rows = run.result.item_rows.cpu().numpy()
        hits[order] = sum(int(np.isin(rows[i][rows[i] >= 0], h).sum()) for i, h in enumerate(res["histories"]))
        total = int((rows >= 0).sum())
    rated = sum(len(h) for h in res["histories"])
    state = "excluded during decoding" if cfg.get("exclude_history") else "not excluded"
    st.caption(f"History ({rated:,} items over the requests, {state}): returned beams that are already in the "
               "history: " + ", ".join(f"{o} **{n:,}** of {total:,}" for o, n in hits.items()) + ".")


def show_results(catalog, source, res: dict) -> None:
    cfg, runs = res["cfg"], res["runs"]
    # K never exceeds the beam, nor the catalog (a list of 12 items cannot fill a top-20).
    limit = max(1, min(cfg["beam"], catalog.n_items))
    k = min(int(st.session_state.get("dec_k", 10)), limit)
    ks = sorted(set(k_values(limit) + [k]))
    metrics = comparison(runs["filter-first"], runs["score-first"], ks, res["targets"])
    gpu = bool(res["timing"])
    m = st.columns(4)
    m[0].metric(f"Overlap@{k}", f"{100 * metrics['overlap'][k]:.1f} %")
    m[1].metric(f"Requests whose top-{k} sets differ", f"{100 * metrics['share_differ'][k]:.0f} %")
    for col, order in zip(m[2:], ORDERS):
        if gpu:
            t = res["timing"][order]
            label = "CUDA graph" if order == "filter-first" and not res.get("graph_error") else "eager"
            col.metric(f"{order} latency ({label})", fmt_ms(t["median_ms"]),
                       help=f"median of {t['runs']} synchronised decodes; first call (plan + capture) "
                            f"{fmt_ms(t['warmup_ms'])}; model forward included")
        else:
            col.metric(f"{order} latency (CPU, reference)", fmt_ms(runs[order].total_ms),
                       help="sum of the stage timings below, model forward included")

    if res.get("histories") is not None:
        show_history_hits(res, cfg)
    titles = titles_for(catalog, cfg.get("dataset"))
    n = cfg["batch"]
    labels = [f"request {i + 1}" + (f" (user {res['user_ids'][i]})" if res["user_ids"] is not None else "")
              for i in range(n)]
    pick = st.selectbox("Show the top-K lists of", range(n), format_func=lambda i: labels[i], key="dec_show") \
        if n > 1 else 0
    pick = min(int(pick or 0), n - 1)
    target = None if res["targets"] is None else int(res["targets"][pick])
    if target is not None:
        name = titles[target] if titles is not None else target
        st.caption(f"★ marks the held-out test item of this user: **{name}**.")
    st.dataframe(top_k_table(catalog, titles, runs, pick, k, target), hide_index=True, column_config={
        "filter-first log-prob": st.column_config.NumberColumn(format="%.4f"),
        "score-first log-prob": st.column_config.NumberColumn(format="%.4f")})
    st.caption("Filtering first normalises over the valid tokens only, so its log-probabilities are higher than "
               "scoring first's; the question is whether the *ranking* changes.")

    left, right = st.columns(2)
    fig = metrics_figure(metrics, ks, n)
    left.plotly_chart(fig, key="dec_fig_metrics")
    fig = stage_figure(runs)
    right.plotly_chart(fig, key="dec_fig_latency")
    if res.get("graph_differs"):
        st.warning("The timed CUDA-graph decode of " + " and ".join(res["graph_differs"]) + " returned other items "
                   "than the profiled decode shown above (rounding on near-ties can reorder beams).")
    st.caption(f"Stage timings: {runs['filter-first'].path}" + (
        ", synchronised around each stage (an eager profile; the metrics above time the CUDA-graph replay)"
        if gpu else " with one torch thread; the model's forward pass is the *model* stage. On a CPU the "
        "reference selective projection (a gather per candidate) can cost more than one small GEMM over the "
        "codebook, so filtering first times both per step (the plan below) and keeps the faster, as the GPU "
        "engine does at warm-up; these CPU latencies still say little about the GPU engine."))

    st.subheader("Warm-up plan per step")
    if gpu:
        if res["plan"]:
            st.dataframe(pd.DataFrame(res["plan"]), hide_index=True)
            st.caption("Timed at warm-up for this shape (batch, beam, dtype, hidden size); the fastest option per "
                       "step is fixed and the whole decode is captured in one CUDA graph.")
        if res.get("graph_error"):
            st.warning(f"The decode could not be captured in a CUDA graph and runs eagerly (this shape is not "
                       f"captured again): {res['graph_error']}")
    else:
        st.dataframe(pd.DataFrame(res["plan"]), hide_index=True)
        st.caption("No GPU: filtering first runs the PyTorch reference ops. Each step's projection — one GEMM "
                   "over the level's codebook, or selective projection of the valid tokens only — was timed once "
                   "for this shape (batch, beam, dtype, hidden size) on this CPU and the faster one is used; both "
                   "give the same float32 logits, so the plan changes the latency, never the beams. Top-k is "
                   "torch's stable sort.")

    show_invalid_mass(res)

    if res["targets"] is not None:
        study = cached_study(str(device()), cfg["dataset"])
        recorded = movielens.recorded_metrics(study)
        if recorded:
            st.subheader("Recorded at training time")
            ks_r = [str(x) for x in recorded["ks"]]
            table = pd.DataFrame({"K": ks_r,
                                  "overlap@K": [recorded["overlap"][x] for x in ks_r],
                                  "Recall@K filter-first": [recorded["recall_filter_first"][x] for x in ks_r],
                                  "Recall@K score-first": [recorded["recall_score_first"][x] for x in ks_r],
                                  "Recall@K popularity": [recorded["recall_popularity"][x] for x in ks_r]})
            st.dataframe(table, hide_index=True)
            st.caption(f"The checkpoint's own evaluation: {recorded['users']} fixed test users, beam "
                       f"{recorded['beam']}.")


def main() -> None:
    st.title("Decode")
    catalog, source = get_catalog()
    st.write(f"Decode **{source.label}** in both orders with the same model and requests. *Filtering first* looks "
             "up each beam's valid tokens and scores only those; *scoring first* scores the whole codebook, "
             "normalises, then masks.")
    cpu_banner("Both orders run the PyTorch reference path on the CPU; latencies are CPU latencies and there is "
               "no CUDA graph. Filtering first plans its projection per step on this CPU (see the plan below).")
    module = BUNDLED_MODELS.get(source.name) if source.kind == "sample" else None
    if module is not None and not module.available():
        st.warning(module.MISSING)
    cfg = settings(catalog, source)
    if st.session_state.pop(PENDING_KEY, None) is not None:
        # Streamlit stops a page's script when the user leaves it: the run never finished.
        st.warning("The last decode was interrupted (the page was left before it finished); its result is lost. "
                   "Press **Run both orders** to run it again.")
    if st.button("Run both orders", type="primary", key="btn_dec_run"):
        st.session_state[PENDING_KEY] = cfg
        st.session_state["decode_runs"] = run_comparison(catalog, source, cfg)
        st.session_state.pop(PENDING_KEY, None)
    res = st.session_state.get("decode_runs")
    if res is None:
        st.info("Choose the settings and press **Run both orders**.")
        return
    if res["cfg"] != cfg:
        st.caption("The settings changed since this run; press **Run both orders** to update.")
    show_results(catalog, source, res)


guarded(main)
