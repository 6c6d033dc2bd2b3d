"""Decode page: filtering first against scoring first, side by side."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st
import torch

from pages._common import (BUNDLED_MODELS, bundled_dataset, cached_study, cached_test_users, changed_since_run,
                           check_model, check_work, cpu_banner, decode_inputs, device, fmt_bytes, fmt_ms, get_catalog,
                           get_index, guarded, index_key, keep_choice, overrides, slots)
from zerogr_core import Decoder
from zerogr_core.recsys import movielens
from zerogr_core.app_support import gpu as gpu_info
from zerogr_core.app_support.charts import latency_figure, metrics_figure, stage_figure, top_k_columns
from zerogr_core.app_support.labels import NO_TITLES_NOTE, has_real_titles, popularity_labels
from zerogr_core.app_support.latency import (LATENCY_PROTOCOLS, PROTOCOL_LABELS, SERIES_LABELS, VALID_TOKENS,
                                             order_runs, time_orders, winner)
from zerogr_core.app_support.profile import comparison, invalid_mass, k_values, profile_decode, steady_cpu_timing
from zerogr_core.app_support.own_model import own_model_inputs
from zerogr_core.app_support.messages import one_line
from zerogr_core.app_support.item_sets import ITEM_SETS, ItemSet, decode_constraints, register_set
from zerogr_core.app_support.llm_model import (LLM_SHAPES, LLMSpec, build_llm, llm_dtype, llm_inputs, model_params,
                                               weight_bytes)
from zerogr_core.app_support.requests import DTYPES
from zerogr_core.app_support.sources import app_settings
from zerogr_core.errors import ZeroGRError
from zerogr_core.models.checkpoint_folder import OFFSETS_FILE, load_model, model_folder, parse_offsets

ORDERS = ("filter-first", "score-first")
BUNDLED = "Bundled MovieLens recommender"
#: The model choice of each catalog that comes with a trained recommender.
BUNDLED_LABELS = {"movielens": BUNDLED, "amazon-beauty": "Bundled Amazon Beauty recommender (T5, tiger preset)"}
RANDOM = "Random head (latency only: random weights, overlap is meaningless)"
OWN = "Your model (a transformers checkpoint folder on the server)"
QWEN3 = "Qwen3 architecture, LLM scale (random weights: latency only, overlap is meaningless)"
RANDOM_PROMPTS = "Random prompts (seeded token ids)"
RANDOM_CONTEXTS = "Random contexts (seeded token ids)"
USERS = "Random test users"
ONE_USER = "One test user"
RANDOM_REQ = "Random requests"
RUN_LABEL = "Run both orders"
#: Session-state key set while a decode runs, so the page can say when one was cut short.
PENDING_KEY = "decode_pending"


@st.cache_resource(max_entries=1, show_spinner="Loading your model…")
def cached_own_model(folder, device_name: str):
    """The user's checkpoint, loaded once per folder state and device (one kept at a time)."""
    return load_model(folder, device_name)


@st.cache_resource(max_entries=1, show_spinner="Building the Qwen3 model (random weights)…")
def cached_llm(shape: str, dtype: str, codebook_sizes: tuple, device_name: str):
    """The Qwen3 shape with random weights, built once per shape, dtype, SID bands and device (one kept)."""
    return build_llm(shape, dtype, codebook_sizes, device_name)


def order_decoders(catalog, index, heads, bands, beam: int, item_set: ItemSet, key: tuple) -> tuple[dict, object]:
    """Decoders of both orders over the active index (on a GPU, filtering first plans and
    captures a CUDA graph at its first decode), with ``item_set`` registered on both, kept
    in the session's slot; and the set's catalog rows (None for all items)."""
    def factory():
        decoders = {o: Decoder(index, heads, beam, order=o, band_offsets=bands, catalog=catalog) for o in ORDERS}
        return decoders, register_set(decoders, item_set, catalog)

    return slots().get("decoders", key + (item_set,), factory)


def settings(catalog, source) -> dict:
    gpu = device().type == "cuda"
    dataset = bundled_dataset(source)
    models = ([BUNDLED_LABELS[dataset]] if dataset else []) + [RANDOM, QWEN3, OWN]
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
    own, llm = model == OWN, model == QWEN3
    bundled = model not in (RANDOM, OWN, QWEN3)
    hidden = int(c[1].number_input("Hidden size", 8, 8192, step=8, key="dec_hidden", disabled=model != RANDOM))
    dtype = c[2].selectbox("dtype", list(DTYPES), key="dec_dtype", disabled=model != RANDOM)
    beam = int(c[3].number_input("Beam width M", 1, 1024, key="dec_beam"))
    c[4].number_input("K (top-K shown)", 1, 1024, key="dec_k")  # read when the results are shown
    c = st.columns([2, 1, 2, 1])
    folder = offsets = spec = blocked = None
    if own:
        folder, offsets, blocked = own_model_settings(catalog)
    if llm:
        spec = llm_settings(gpu)
    requests = ([USERS, ONE_USER] if bundled else [RANDOM_PROMPTS] if own else [RANDOM_CONTEXTS] if llm
                else [RANDOM_REQ])
    if st.session_state.get("dec_request") not in requests:
        st.session_state["dec_request"] = requests[0]
    request = c[0].selectbox("Requests", requests, key="dec_request")
    one = request == ONE_USER
    batch = int(c[1].number_input("Batch", 1, 1024, key="dec_batch", disabled=one))
    user = None
    if one:
        users = cached_test_users(str(device()), dataset)
        keep_choice("dec_user", users.user_ids.tolist())  # a user of the other bundled data set
        st.session_state.setdefault("dec_user", int(users.user_ids[0]))
        user = int(c[2].selectbox("Test user", users.user_ids.tolist(), key="dec_user"))
        batch = 1
    seed = int(c[3].number_input("Seed", 0, 10**6, key="dec_seed", disabled=one))
    exclude = bundled and st.checkbox(
        "Exclude each user's history (items already rated or bought)", key="dec_exclude",
        help="A per-request deny list enforced during decoding: prefixes with no item outside the history below "
             "them are never scored or kept. Filtering first keeps the catalog's normalisation, so the other "
             "items rank as with the history kept (the quality study's protocol).")
    item_set = item_set_settings()
    st.session_state.setdefault("dec_timing", "page")
    timing = st.radio("Latency measurement", list(PROTOCOL_LABELS), format_func=PROTOCOL_LABELS.get,
                      key="dec_timing", horizontal=True,
                      help="Whole decodes of the two orders run in turns, so both see the same load; the page "
                           "names a faster order only when the two spreads do not overlap.")
    if model != RANDOM:
        hidden, dtype = None, spec.dtype if llm else "float32"
    return dict(source=source, overrides=tuple(sorted(overrides().items())), model=model,
                dataset=dataset if bundled else None, hidden=hidden,
                dtype=dtype, beam=beam, batch=batch, request=request, user=user, seed=seed,
                exclude_history=bool(exclude), timing=timing, folder=folder, offsets=offsets, llm=spec,
                item_set=item_set, blocked=blocked)


def llm_settings(gpu: bool) -> LLMSpec:
    """The Qwen3 shape and context length (the 1.7B shape by default on a GPU, tiny on a CPU)."""
    st.session_state.setdefault("dec_llm_shape", "qwen3-1.7b" if gpu else "tiny")
    st.session_state.setdefault("dec_context", 1000 if gpu else 64)
    c = st.columns([3, 1])
    shape = c[0].selectbox("Qwen3 shape", list(LLM_SHAPES), format_func=LLM_SHAPES.get, key="dec_llm_shape")
    context = int(c[1].number_input("Context tokens", 1, 32768, key="dec_context",
                                    help="Tokens of each request's context, prefilled once (its keys and values "
                                         "stored once per request, not per beam) before the SID tokens."))
    dtype = llm_dtype(gpu)
    fp8 = st.checkbox("FP8 projections", key="dec_llm_fp8", disabled=dtype != "bfloat16",
                      help="Each layer's weight GEMMs on float8 weights and activations with one scale per row: "
                           "faster at large batches, less accurate (a bfloat16 model on a GPU of compute "
                           "capability 8.9 or later). Both orders use the same projections.")
    partial = st.checkbox("Last step on the branching beams only", value=True, key="dec_llm_partial",
                          help="Filtering first runs the last step's layers only on the beams whose prefix holds more "
                               "than one item: the others score 0 for their only item whatever the model says. The "
                               "same items; scoring first always runs every beam.")
    st.caption(f"A `transformers` Qwen3ForCausalLM of this shape with **random weights** (no checkpoint is "
               f"shipped), in {dtype}{' with FP8 projections' if fp8 else ''}, the catalog's SID tokens appended "
               "to its vocabulary (one band per level). Latency and memory are the shape's; the lists mean "
               "nothing. Requests are seeded random contexts; both orders decode from the same prefill, timed on "
               "its own.")
    return LLMSpec(shape, context, dtype, "fp8" if fp8 else "model", partial)


def item_set_settings() -> ItemSet:
    """Which items both orders may return: the whole catalog or a seeded cold-start share."""
    st.session_state.setdefault("dec_item_set", "all")
    st.session_state.setdefault("dec_cold_share", 2.0)
    st.session_state.setdefault("dec_cold_seed", 0)
    c = st.columns([3, 1, 1])
    kind = c[0].selectbox("Restrict the decode to", list(ITEM_SETS), format_func=ITEM_SETS.get, key="dec_item_set",
                          help="Both orders are constrained to the set during decoding (registered once on both "
                               "decoders as an allow set, named by every request). Filtering first normalises "
                               "each step over the set's tokens, scoring first over the whole codebook before "
                               "masking: the smaller the set, the more the two can disagree.")
    cold = kind == "cold"
    share = float(c[1].number_input("Cold share (%)", 0.01, 99.0, step=0.5, key="dec_cold_share", disabled=not cold))
    seed = int(c[2].number_input("Draw seed", 0, 10**6, key="dec_cold_seed", disabled=not cold))
    return ItemSet(kind, share / 100, seed) if cold else ItemSet()


def own_model_settings(catalog) -> tuple:
    """The checkpoint folder and SID token offsets of the user's model, and what keeps it from running.

    Returns
    -------
    tuple
        ``(folder, offsets, problem)``: ``problem`` is None when both are usable, else the one line that
        says what to fix (shown here, by the field it names, so that a bad path does not stop the page:
        the settings below stay and the Run button is disabled until it is fixed).
    """
    roots = app_settings().roots
    st.caption(f"A folder written by `save_pretrained` (T5 or a causal LM) below a data folder "
               f"({', '.join(f'`{r}`' for r in roots)}), whose vocabulary holds the SID tokens. A `{OFFSETS_FILE}` "
               "beside the weights may give the offsets: `{\"token_offsets\": [10, 266, 522]}`.")
    c = st.columns([3, 2])
    path = c[0].text_input("Checkpoint folder", key="dec_model_path", placeholder=str(roots[-1] / "my_model"))
    if not path.strip():
        st.info("Give the folder of your model to decode with it.", icon=":material/folder_open:")
        return None, None, "model folder: give the folder of your model first"
    try:
        folder = model_folder(path, roots)
    except ZeroGRError as err:
        problem = one_line(str(err))
        c[0].error(problem, icon=":material/error:")
        return None, None, problem
    if folder.token_offsets is not None and not st.session_state.get("dec_offsets"):
        st.session_state["dec_offsets"] = ", ".join(map(str, folder.token_offsets))
    text = c[1].text_input(f"SID token offsets ({catalog.n_levels} levels)", key="dec_offsets",
                           help="Vocabulary id of token 0 of each SID level: level ℓ's token t is id "
                                "offset[ℓ] + t.")
    try:
        return folder, parse_offsets(text), None
    except ZeroGRError as err:
        problem = one_line(str(err))
        c[1].error(problem, icon=":material/error:")
        return folder, None, problem


def run_comparison(catalog, source, cfg: dict) -> dict:
    """Both orders on the same requests, through one :class:`~zerogr_core.Decoder` each: a
    stage-profiled decode (the top-K lists and the stage chart come from it), the invalid
    mass scoring first meets, and whole decodes timed in turns until the ranking is stable."""
    dev = device()
    if cfg.get("blocked"):  # the button is disabled then; a click that still comes is refused the same way
        raise ZeroGRError(cfg["blocked"])
    check_work(catalog, cfg["batch"], cfg["beam"], cfg["hidden"])  # hidden: the random head's, else None
    spec, weights = cfg.get("llm"), None
    if cfg["model"] == QWEN3:
        check_model(spec.shape, model_params(spec, catalog.codebook_sizes), cfg["batch"], spec.context)
    index = get_index(catalog, source)
    gpu_info.reset_peak()
    with st.status("Comparing the two orders…", expanded=True) as status:
        bar = st.progress(0, text="Preparing the model and requests…")
        if cfg["model"] == QWEN3:
            model, preset = cached_llm(spec.shape, spec.dtype, tuple(int(v) for v in catalog.codebook_sizes),
                                       str(dev))
            bar.progress(2, text=f"Prefilling {cfg['batch']} context(s) of {spec.context:,} tokens…")
            inputs = llm_inputs(model, preset, spec, dev, cfg["batch"], cfg["beam"], cfg["seed"])
            weights = weight_bytes(model)
        elif cfg["model"] == OWN:
            inputs = own_model_inputs(cached_own_model(cfg["folder"], str(dev)), cfg["folder"], cfg["offsets"],
                                      catalog, dev, cfg["batch"], cfg["beam"], cfg["seed"])
        else:
            inputs = decode_inputs(catalog, dev, bundled=cfg["dataset"] is not None, batch=cfg["batch"],
                                   seed=cfg["seed"], hidden=cfg["hidden"], dtype=cfg["dtype"], user=cfg["user"],
                                   dataset=cfg["dataset"], beam=cfg["beam"])
        fn, batch = inputs.hidden_fn, cfg["batch"]
        histories = None
        if inputs.user_ids is not None:
            users = cached_test_users(str(dev), cfg["dataset"])
            histories = [users.histories[int(np.flatnonzero(users.user_ids == u)[0])] for u in inputs.user_ids]
        item_set = cfg.get("item_set") or ItemSet()
        if item_set.restricted:
            bar.progress(3, text="Registering the item set on both decoders…")
        decoders, set_rows = order_decoders(catalog, index, inputs.heads, inputs.band_offsets, cfg["beam"], item_set,
                                            (index_key(source, overrides(), dev), inputs.model_key, cfg["beam"]))
        limits = decode_constraints(item_set, catalog, histories, exclude_history=bool(cfg.get("exclude_history")))
        out = dict(cfg=cfg, targets=inputs.targets, user_ids=inputs.user_ids, runs={}, random=inputs.random,
                   histories=histories, set_rows=set_rows, prefill_ms=inputs.prefill_ms, weight_bytes=weights)
        engine = decoders["filter-first"].gpu_engine
        if engine is not None:
            engine.progress = lambda fraction, text: bar.progress(5 + int(15 * fraction),
                                                                  text=f"GPU warm-up: {text}…")
        try:
            bar.progress(5, text="Planning filtering first for this shape…")
            with steady_cpu_timing(dev):
                out["plan"] = decoders["filter-first"].plan_table(fn, batch)
                for i, order in enumerate(ORDERS):
                    bar.progress(20 + 10 * i, text=f"{order}: a stage-timed decode of {batch} request(s)…")
                    out["runs"][order] = profile_decode(decoders[order], fn, batch, **limits)
                bar.progress(40, text="Invalid mass under scoring first…")
                out["invalid"] = invalid_mass(catalog, decoders["score-first"], fn, batch)
                bar.progress(45, text="Warming up the timed decodes…")
                runs, out["notes"] = order_runs(catalog, decoders, fn, batch, **limits)
                protocol = LATENCY_PROTOCOLS[cfg.get("timing", "page")]
                out["latency"] = time_orders(runs, dev, protocol, progress=lambda f: bar.progress(
                    50 + int(49 * f), text=f"Timing whole decodes in turns (≥ {protocol.min_repeats} each, "
                                           f"≥ {protocol.min_seconds:g} s of work)…"))
        finally:
            if engine is not None:
                engine.progress = None
        out["graph_error"] = decoders["filter-first"].graph_error(batch)
        out["memory"] = gpu_info.torch_memory()
        bar.empty()
        status.update(label="Both orders compared", state="complete", expanded=False)
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


def show_latency(res: dict) -> None:
    """Median latency of each timed series with its spread and which implementation ran, the
    faster of the two orders (if any beyond noise), and every timed run as a distribution.
    On a GPU without item lists the series include scoring first over the valid tokens only."""
    latency = res["latency"]
    best, ratio = winner(latency)
    shown = [s for s in SERIES_LABELS if s in latency]
    cols = st.columns(len(shown) + 1)
    for col, series in zip(cols, shown):
        lat = latency[series]
        stats = lat.stats
        band = f"{fmt_ms(stats['p10_ms'])} – {fmt_ms(stats['p90_ms'])}"
        col.metric(f"{SERIES_LABELS[series]} latency (median)", fmt_ms(stats["median_ms"]),
                   help=f"{lat.implementation}. Median of {stats['n']} whole decodes (model forward included), "
                        f"timed in turns with the other series; 10–90 % of the runs took {band}.")
        col.caption(f"{lat.implementation}; 10–90 %: {band}")
    if best is None:
        cols[-1].metric("Faster order", "no clear winner", help="The 10–90 % bands of the two orders overlap: "
                        "the difference is within the run-to-run noise, and another run could rank them either way.")
    else:
        cols[-1].metric("Faster order", best, help="Its slowest 10 % of runs are still faster than the other "
                        "order's fastest 10 %.")
        cols[-1].caption(f"{ratio:.2f}× faster (median) than the other order")
    if VALID_TOKENS in latency:
        st.caption(f"“{SERIES_LABELS[VALID_TOKENS]}” scores first but takes the softmax over the valid tokens "
                   "only, as filtering first normalises: it returns filtering first's beams, so its gap to "
                   "filtering first is the cost of the order alone. The faster order is named between the two "
                   "orders only.")
    for note in res.get("notes") or ():
        st.caption(note)
    st.plotly_chart(latency_figure(latency), key="dec_fig_distribution")


def show_model_memory(res: dict) -> None:
    """The Qwen3 prefill (shared by both orders, so outside the timed decodes), the model's
    weights and the GPU memory the comparison reached."""
    spec, memory = res["cfg"].get("llm"), res.get("memory")
    if spec is None and memory is None:
        return
    cols = st.columns(3)
    if spec is not None:
        cols[0].metric("Prefill (both orders' requests)", fmt_ms(res.get("prefill_ms")),
                       help=f"One prefill of {res['cfg']['batch']} context(s) of {spec.context:,} tokens, the "
                            "context keys and values stored once per request; both orders decode from it, so the "
                            "latencies above are the decodes alone.")
        cols[1].metric(f"Weights ({spec.shape}, {spec.dtype})", fmt_bytes(res.get("weight_bytes")))
    if memory is not None:
        cols[2].metric("GPU memory peak (this comparison)", fmt_bytes(memory["peak"]),
                       help=f"torch's peak allocated bytes since the run started (model, index, decoders, graphs); "
                            f"allocated now {fmt_bytes(memory['allocated'])}, reserved {fmt_bytes(memory['reserved'])}. "
                            "The GPU page shows the device's own readings.")
    else:
        cols[2].metric("GPU memory peak", "no GPU", help="This machine has no GPU: the model runs in host memory.")


def show_item_set(catalog, res: dict) -> None:
    """How many items the decode was restricted to, and that both orders kept to them."""
    rows = res.get("set_rows")
    if rows is None:
        return
    item_set = res["cfg"]["item_set"]
    kept = []
    for order, run in res["runs"].items():
        got = run.result.item_rows.cpu().numpy()
        got = got[got >= 0]
        kept.append(f"{order} **{int(np.isin(got, rows).sum()):,}** of {got.size:,}")
    st.info(f"Both orders constrained to {item_set.describe(rows.size, catalog.n_items)}: returned beams in the "
            f"set: {', '.join(kept)}. Filtering first normalises each step over the set's tokens, scoring first "
            "over the whole codebook before masking; the overlap above is how often that changed a list.",
            icon=":material/filter_alt:")


def titles_for(catalog, dataset) -> tuple:
    """Item labels of the lists (titles where the data has them, else number and popularity),
    and whether they are real titles."""
    if dataset is None:
        return catalog.titles, catalog.titles is not None
    users = cached_test_users(str(device()), dataset)
    if has_real_titles(users.titles, catalog.item_ids):
        return users.titles, True
    return popularity_labels(catalog.item_ids, users.histories), False


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
    # K never exceeds the longest list either order returned: a list of 12 items (a small catalog or
    # item set) cannot fill a top-20, and overlap@K would count the empty places as disagreement.
    filled = max(int((run.result.item_rows >= 0).sum(dim=1).max()) for run in runs.values())
    limit = max(1, min(cfg["beam"], filled))
    k = min(int(st.session_state.get("dec_k", 10)), limit)
    ks = sorted(set(k_values(limit) + [k]))
    metrics = comparison(runs["filter-first"], runs["score-first"], ks, res["targets"])
    gpu = device().type == "cuda"
    m = st.columns(2)
    m[0].metric(f"Lists that agree (overlap@{k})", f"{100 * metrics['overlap'][k]:.1f} %",
                help=f"Overlap@{k}: the share of the top-{k} items the two orders have in common, averaged over "
                     "the requests. 100 % means the order of filtering and scoring never changed a list.")
    m[1].metric(f"Requests whose top-{k} differs", f"{100 * metrics['share_differ'][k]:.0f} %",
                help=f"Requests whose top-{k} item sets are not the same under the two orders.")
    if res.get("random"):
        st.warning("**Latency only: random weights, overlap is meaningless.** A random head knows nothing of the "
                   "catalog, so how often the two orders agree says nothing about a trained recommender. Pick a "
                   "bundled recommender to compare the lists.", icon=":material/casino:")
    show_latency(res)
    show_model_memory(res)
    show_item_set(catalog, res)
    if res.get("histories") is not None:
        show_history_hits(res, cfg)
    titles, real_titles = titles_for(catalog, cfg.get("dataset"))
    n = cfg["batch"]
    labels = [f"request {i + 1}" + (f" (user {res['user_ids'][i]})" if res["user_ids"] is not None else "")
              for i in range(n)]
    keep_choice("dec_show", range(n))  # a request of an earlier, larger batch
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
    if cfg.get("dataset") and not real_titles:
        st.caption(NO_TITLES_NOTE)

    left, right = st.columns(2)
    fig = metrics_figure(metrics, ks, n)
    left.plotly_chart(fig, key="dec_fig_metrics")
    fig = stage_figure(runs)
    right.plotly_chart(fig, key="dec_fig_latency")
    st.caption(f"Per-stage profile: {runs['filter-first'].path}, one decode per order" + (
        ", the device synchronised around each stage (an eager profile; the latency above times whole graphs)"
        if gpu else " with one torch thread; the model's forward pass is the *model* stage") + ".")

    st.subheader("How filtering first runs each step")
    plan = pd.DataFrame(res["plan"]).rename(columns={
        "representation": "index layout", "projection": "scores computed", "planned": "chosen by"})
    if "scores computed" in plan:
        plan["scores computed"] = plan["scores computed"].map(
            {"full": "whole codebook (one GEMM)", "selective": "valid tokens only"}).fillna(plan["scores computed"])
    st.dataframe(plan, hide_index=True, column_config={
        "index layout": st.column_config.TextColumn(help="How the step-sliced index stores this step: *dense* (a "
                                                         "row of slots per prefix) or *sparse* (CSR segments)."),
        "scores computed": st.column_config.TextColumn(help="Projection: *full* multiplies the hidden state by the "
                                                            "whole level head, *selective* only the valid rows.")})
    if gpu:
        st.caption("Timed at warm-up for this shape (batch, beam, dtype, hidden size); the fastest option per "
                   "step is fixed and the whole decode is captured in one CUDA graph.")
        if res.get("graph_error"):
            st.warning(f"The decode could not be captured in a CUDA graph and runs eagerly (this shape is not "
                       f"captured again): {res['graph_error']}")
    else:
        st.caption("No GPU: filtering first runs the PyTorch reference ops. Outside the test interpreter each "
                   "step's two projections are timed on this CPU and the faster is kept only when it beats the "
                   "default by more than the timing noise; both give the same float32 logits, so the plan changes "
                   "the latency, never the beams.")

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
                   f"Press **{RUN_LABEL}** to run it again.")
    if st.button(RUN_LABEL, type="primary", key="btn_dec_run", disabled=bool(cfg["blocked"])):
        st.session_state[PENDING_KEY] = cfg
        try:
            st.session_state["decode_runs"] = run_comparison(catalog, source, cfg)
        except Exception:
            # A refused or failed run is the guard's to report, not a run cut short: only Streamlit's
            # stop when the page is left (a BaseException) may leave the marker behind.
            st.session_state.pop(PENDING_KEY, None)
            raise
        st.session_state.pop(PENDING_KEY, None)
    res = st.session_state.get("decode_runs")
    if res is None:
        st.info(f"Choose the settings and press **{RUN_LABEL}**.")
        return
    changed_since_run(res["cfg"], cfg, RUN_LABEL)
    show_results(catalog, source, res)


guarded(main)
