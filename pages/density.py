"""Density page: where constrained decoding wastes work, step by step."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from pages._common import (bundled_dataset, cached_segment_lengths, cached_step_stats, check_work, cpu_banner,
                           decode_inputs, device, get_catalog, get_index, guarded)
from zerogr_core.app_support.charts import (density_figure, density_rows, histogram_figure, shared_head_rows,
                                            waste_figure)
from zerogr_core.app_support.density import beam_weighted_density, total_waste
from zerogr_core.app_support.profile import profiled_decode

MODEL = "Bundled MovieLens model (random test users)"
#: The beam source of each catalog that comes with a trained recommender.
MODELS = {"movielens": MODEL, "amazon-beauty": "Bundled Amazon Beauty model (random test users)"}
RANDOM = "Random head (seeded Gaussian requests)"


def beam_source_options(source) -> list[str]:
    dataset = bundled_dataset(source)
    return [MODELS[dataset], RANDOM] if dataset else [RANDOM]


def decode_states(catalog, source, index, beam: int, batch: int, beams_from: str, hidden: int, seed: int):
    """Beam states of a short filter-first decode (cached per settings in the session)."""
    key = (source, tuple(sorted((st.session_state.get("index_overrides") or {}).items())), beam, batch,
           beams_from, hidden, seed, str(index.device))
    runs = st.session_state.setdefault("density_runs", {})
    if key in runs:
        return runs[key]
    dev = index.device
    dataset = bundled_dataset(source) if beams_from != RANDOM else None
    inputs = decode_inputs(catalog, dev, bundled=dataset is not None, batch=batch, seed=seed, hidden=hidden,
                           dataset=dataset or "movielens", beam=beam)
    run = profiled_decode(index, inputs.heads, beam, "filter-first", inputs.hidden_fn, batch,
                          band_offsets=inputs.band_offsets)
    runs.clear()
    runs[key] = run.states
    return run.states


def main() -> None:
    st.title("Density")
    catalog, source = get_catalog()
    st.write(f"Catalog **{source.label}**: {catalog.n_items:,} items, codebooks "
             f"{' / '.join(f'{v:,}' for v in catalog.codebook_sizes)}.")
    st.caption("*Catalog-level density* of step ℓ is E_ℓ / (S_ℓ·|V_ℓ|): every prefix counted once. "
               "*Beam-weighted density* ρ_ℓ = Σ_b |Next_ℓ(p_b)| / (B_ℓ·|V_ℓ|) is measured on the active "
               "beams "
               "of a real filter-first decode of a few requests at the chosen beam width, so popular prefixes "
               "count as often as beams sit on them. Scoring first computes a logit for every row it projects "
               "and masks afterwards; the *wasted share* is the part of those logits no beam can choose.")
    cpu_banner("The short decode that places the beams runs on the CPU (PyTorch reference path).")
    gpu = device().type == "cuda"
    st.session_state.setdefault("den_beam", 128 if gpu else 16)
    st.session_state.setdefault("den_batch", 16 if gpu else 8)
    st.session_state.setdefault("den_hidden", 64)
    options = beam_source_options(source)
    if st.session_state.get("den_from") not in options:
        st.session_state["den_from"] = options[0]
    c = st.columns([1, 1, 2, 1])
    beam = int(c[0].number_input("Beam width M", 1, 1024, key="den_beam"))
    batch = int(c[1].number_input("Requests B", 1, 256, key="den_batch"))
    beams_from = c[2].selectbox("Beams from", options, key="den_from")
    hidden = int(c[3].number_input("Hidden size (random head)", 8, 4096, step=8, key="den_hidden",
                                   disabled=beams_from != RANDOM))

    check_work(catalog, batch, beam, hidden if beams_from == RANDOM else None)
    stats = cached_step_stats(source, catalog)
    index = get_index(catalog, source)
    with st.spinner("Decoding a few requests to place the beams…"):
        states = decode_states(catalog, source, index, beam, batch, beams_from, hidden, seed=0)
    lengths = cached_segment_lengths(source, catalog)
    shared_rows = shared_head_rows(catalog) if beams_from == RANDOM else None
    weighted = beam_weighted_density(catalog, states, projected_rows=shared_rows, seg_lengths=lengths)
    df = pd.DataFrame(density_rows(stats, weighted))
    waste = total_waste(weighted)
    m = st.columns(3)
    m[0].metric("Scoring-first logits wasted (all steps)", f"{100 * waste:.2f} %")
    m[1].metric("Lowest beam-weighted density", f"{np.nanmin(df['beam-weighted density']):.2e}")
    m[2].metric("Beams × requests", f"{beam} × {batch}")
    if shared_rows:
        st.caption(f"Shared head: scoring first projects all {shared_rows[0]:,} head rows at every step, as STATIC "
                   "does; the density itself is measured against each level's own band.")
    left, right = st.columns(2)
    left.plotly_chart(density_figure(df), key="den_fig_density")
    right.plotly_chart(waste_figure(df), key="den_fig_waste")
    st.dataframe(df, hide_index=True, column_config={
        "catalog-level density": st.column_config.NumberColumn(format="%.2e"),
        "beam-weighted density": st.column_config.NumberColumn(format="%.2e"),
        "mean valid tokens per beam": st.column_config.NumberColumn(format="%.2f"),
        "wasted share": st.column_config.NumberColumn(format="%.4f")})
    st.plotly_chart(histogram_figure(lengths), key="den_fig_hist")


guarded(main)
