"""Catalog page: pick a bundled sample, upload a file, or read a file on the server."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import streamlit as st

from pages._common import (active_source, as_shipped, cached_catalog, cached_step_stats, cpu_banner, fmt_bytes,
                           fmt_codebooks, get_catalog, get_index, guarded, set_active_source)
from zerogr_core.recsys import movielens
from zerogr_core.app_support.messages import one_line
from zerogr_core.app_support.sources import (HOW_TO_ADD_ROOT, SAMPLE_CHOICES, SAMPLE_CREDITS, UPLOAD_TYPES,
                                             app_settings, catalog_summary, parse_codebook_sizes, roots_line,
                                             sample_source, server_file_source, stage_upload)
from zerogr_core.errors import ZeroGRError

KINDS = ("Bundled sample", "Upload a file", "File on the server")
PAYLOAD_KEY = "upload_payload"


def upload_limit_bytes() -> int:
    """The upload limit: server.maxUploadSize (MB), lowered by ZEROGR_MAX_UPLOAD_MB if set."""
    limit_mb = float(st.get_option("server.maxUploadSize") or 200)
    env = os.environ.get("ZEROGR_MAX_UPLOAD_MB")
    if env:
        try:
            limit_mb = min(limit_mb, float(env))
        except ValueError:
            pass
    return int(limit_mb * 2**20)


def _upload_changed() -> None:
    if st.session_state.get("up_catalog") is None:
        st.session_state.pop(PAYLOAD_KEY, None)


def chosen_source(options: dict):
    """The source the widgets describe now, or None (nothing chosen yet)."""
    kind = st.session_state["cat_kind"]
    if kind == KINDS[0]:
        name = st.selectbox("Bundled catalog", list(SAMPLE_CHOICES), format_func=SAMPLE_CHOICES.get,
                            key="cat_sample")
        if name in SAMPLE_CREDITS:
            st.caption(SAMPLE_CREDITS[name])
        if name == "movielens" and not movielens.available():
            st.warning(movielens.MISSING)
            return None
        return sample_source(name, **options)
    if kind == KINDS[1]:
        limit = upload_limit_bytes()
        upload = st.file_uploader(f"Catalog file ({', '.join('.' + t for t in UPLOAD_TYPES)}), up to "
                                  f"{limit / 2**20:,.0f} MB", type=list(UPLOAD_TYPES), key="up_catalog",
                                  on_change=_upload_changed)
        st.caption("Layouts: `item_id, s1, s2, …, sL` (one integer column per level, or `s0 …` from zero) "
                   "or `item_id, sid` with the tokens in one column (`\"3 5 1\"`); an optional `title` "
                   "column. Larger catalogs: use *File on the server*.")
        if upload is not None:
            payload = st.session_state.get(PAYLOAD_KEY)
            if payload is None or payload.get("id") != upload.file_id:
                st.session_state[PAYLOAD_KEY] = dict(id=upload.file_id, name=upload.name, data=upload.getvalue())
        payload = st.session_state.get(PAYLOAD_KEY)
        if not payload:
            return None
        return stage_upload(payload["name"], payload["data"], limit, **options)
    settings = app_settings()
    st.caption(f"Only files below these data folders can be read: {roots_line(f'`{r}`' for r in settings.roots)}. "
               "A path may be absolute or relative to a data folder.")
    if not settings.extra_roots:
        st.info(f"Only the bundled samples folder is open. To read your own catalogs, {HOW_TO_ADD_ROOT}.",
                icon=":material/folder_open:")
    if settings.missing_roots:
        st.warning(f"Configured data folders that do not exist (ignored): {', '.join(settings.missing_roots)}",
                   icon=":material/folder_off:")
    path = st.text_input("Path of a catalog file on the server (CSV, TSV or Parquet)", key="cat_path",
                         placeholder=str(settings.roots[-1] / "my_catalog.parquet"))
    if not path.strip():
        return None
    return server_file_source(path, settings.roots, **options)


def load_with_progress(source):
    """Load, validate, summarise and index ``source``, with a progress bar."""
    holder = st.empty()
    try:
        bar = holder.progress(0, text=f"Reading and validating {source.label}…")
        catalog = cached_catalog(source)
        bar.progress(45, text=f"{catalog.n_items:,} items read; per-step statistics…")
        stats = cached_step_stats(source, catalog)
        bar.progress(70, text="Building the step-sliced index…")
        get_index(catalog, source, over={})
        bar.progress(100, text="Done")
    finally:
        holder.empty()
    return catalog, stats


def show_summary(catalog, stats, source) -> None:
    summary = catalog_summary(catalog)
    st.subheader(f"Active catalog: {source.label}")
    cols = st.columns(4)
    cols[0].metric("Items", f"{summary['items']:,}")
    cols[1].metric("Levels (SID length)", summary["levels"])
    sizes = summary["codebook_sizes"]
    cols[2].metric("Tokens per level", fmt_codebooks(sizes),
                   help="Codebook size |V_ℓ| of each level, first to last: " + " / ".join(f"{v:,}" for v in sizes))
    cols[3].metric("Plain ID table", fmt_bytes(summary["sid_table_int16_bytes"]),
                   help="The semantic IDs as a table of int16 (items × levels × 2 bytes): the yardstick the Index "
                        "page compares every index with.")
    notes = ["codebooks |V_ℓ| " + " / ".join(f"{v:,}" for v in sizes)]
    if summary["shared_head"]:
        notes.append(f"one shared head with bands at rows {', '.join(map(str, catalog.band_offsets))}")
    else:
        notes.append("one head per level")
    if summary["collision_level_added"]:
        notes.append(f"a collision level was appended ({summary['duplicate_groups']:,} shared SIDs)")
    notes.append("titles included" if summary["titles"] else "no titles")
    st.caption("; ".join(notes) + ".")
    table = pd.DataFrame(stats).rename(columns={
        "step": "step", "codebook": "tokens", "states": "prefixes", "entries": "prefix → token pairs",
        "density": "share of tokens valid", "max_segment": "most next tokens", "mean_segment": "mean next tokens"})
    st.markdown("**Per-step prefix tree**")
    st.dataframe(table, hide_index=True, column_config={
        "tokens": st.column_config.NumberColumn(help="Codebook size |V_ℓ| of this level."),
        "prefixes": st.column_config.NumberColumn(help="States S_ℓ: distinct SID prefixes before this step."),
        "prefix → token pairs": st.column_config.NumberColumn(
            help="Entries E_ℓ: valid (prefix, next token) pairs."),
        "share of tokens valid": st.column_config.NumberColumn(
            format="%.5f", help="Catalog-level density E_ℓ / (S_ℓ·|V_ℓ|): the share of the codebook a prefix "
                                "can continue with, every prefix counted once."),
        "most next tokens": st.column_config.NumberColumn(help="Longest segment: the most valid next tokens of "
                                                               "any prefix."),
        "mean next tokens": st.column_config.NumberColumn(format="%.2f", help="Mean segment length.")})
    n = min(12, catalog.n_items)
    preview = {"item_id": catalog.item_ids[:n]}
    for level in range(catalog.n_levels):
        preview[f"s{level + 1}"] = catalog.sids[:n, level].astype(np.int64)
    if catalog.titles is not None:
        preview["title"] = catalog.titles[:n]
    st.markdown("**First rows (sorted by SID)**")
    st.dataframe(pd.DataFrame(preview), hide_index=True)


def main() -> None:
    st.title("Catalog")
    st.write("Choose the catalog every page works on: a bundled sample, an uploaded file, or a file on the "
             "server. Files are validated row by row; a bad file leaves the current catalog active.")
    cpu_banner("Loading, validation and the index build run on the CPU; the index stays in host memory.")
    st.session_state.setdefault("cat_kind", KINDS[0])
    st.session_state.setdefault("cat_sample", "movielens" if movielens.available() else "search-like-small")
    st.session_state.setdefault("cat_codebooks", "")
    st.session_state.setdefault("cat_collision", False)
    st.radio("Source", KINDS, key="cat_kind", horizontal=True)
    st.caption(f"Limits: uploads up to {upload_limit_bytes() / 2**20:,.0f} MB; any catalog "
               f"{app_settings().limits.describe()}.")
    with st.expander("Options: declared codebook sizes, duplicate SIDs"):
        st.text_input("Codebook sizes per level (optional, e.g. `256, 256, 256`); default: the file's metadata "
                      "or the largest token + 1", key="cat_codebooks")
        st.checkbox("Items that share a SID: append a collision level (TIGER style) instead of refusing the file",
                    key="cat_collision")
    try:
        options = dict(codebook_sizes=parse_codebook_sizes(st.session_state["cat_codebooks"]),
                       on_duplicate="collision" if st.session_state["cat_collision"] else "error")
        source = chosen_source(options)
        source = None if source is None else as_shipped(source)
        if source is not None and source != active_source():
            catalog, _ = load_with_progress(source)
            payload = st.session_state.get(PAYLOAD_KEY) or {}
            set_active_source(source, payload.get("data") if source.kind == "upload" else None)
            st.success(f"Loaded {source.label}: {catalog.n_items:,} items, {catalog.n_levels} levels.",
                       icon=":material/check_circle:")
    except ZeroGRError as err:
        st.error(one_line(str(err)), icon=":material/error:")
        st.caption(f"The catalog in use stays **{active_source().label}**.")
    catalog, source = get_catalog()
    show_summary(catalog, cached_step_stats(source, catalog), source)


guarded(main)
