"""What every page of the app shares: cached heavy objects, the active catalog and index,
and the error guard. Not a page itself (app.py registers the pages explicitly).
"""
from __future__ import annotations

import logging
import traceback
from dataclasses import replace
from typing import Callable

import numpy as np
import streamlit as st
import torch

from zerogr_core.app_support import gpu as gpu_info
from zerogr_core.recsys import beauty, movielens
from zerogr_core.decode.work_limits import work_limits
from zerogr_core.app_support.requests import DecodeInputs, random_inputs, study_inputs
from zerogr_core.app_support.resources import ResourceSlots, is_host_out_of_memory
from zerogr_core.app_support.messages import one_line
from zerogr_core.app_support.sources import (CatalogSource, default_source, load_source, restage_upload,
                                             sample_source)
from zerogr_core.errors import ZeroGRError, first_line, is_out_of_memory
from zerogr_core.index import IndexConfig, build_index

log = logging.getLogger("zerogr.app")

#: Session-state key of the active catalog source (not a widget key, so it survives page switches).
SOURCE_KEY = "active_source"
#: Session-state key of the per-step representation overrides applied to the index ({step: kind}).
OVERRIDES_KEY = "index_overrides"
#: Session-state key of the session's :class:`ResourceSlots`.
SLOTS_KEY = "resource_slots"
#: Session-state key of the active upload's bytes (to stage it again, see :func:`get_catalog`).
UPLOAD_BYTES_KEY = "active_upload_bytes"
#: Widget keys with these prefixes keep their values across page switches (see app.py).
PERSISTENT_PREFIXES = ("cat_", "den_", "idx_", "dec_", "reb_", "bench_", "gpu_")


# ---------------------------------------------------------------------------- device
def device() -> torch.device:
    return torch.device("cuda") if gpu_info.has_gpu() else torch.device("cpu")


def check_work(catalog, batch: int, beam: int, hidden: int | None = None) -> None:
    """Refuse, in one line, a decode of ``batch`` × ``beam`` on ``catalog`` (of random requests of
    ``hidden`` values, where the page chose them) too large for this machine."""
    work_limits(gpu_info.has_gpu()).check_decode(batch, beam, catalog.codebook_sizes, hidden)


def check_model(name: str, params: int, batch: int, context: int) -> None:
    """Refuse, in one line, a model of ``params`` layer parameters, or a prefill of ``batch`` contexts of
    ``context`` tokens, too large for this machine."""
    limits = work_limits(gpu_info.has_gpu())
    limits.check_model(name, params)
    limits.check_prefill(batch, context)


def cpu_banner(what: str = "") -> None:
    """Say plainly that there is no GPU and what the page does instead."""
    if not gpu_info.has_gpu():
        st.info("**No GPU on this machine.** " + (what or "This page runs on the CPU with the PyTorch "
                                                    "reference path; timings are CPU timings."), icon=":material/info:")


# ---------------------------------------------------------------------------- caches
def slots() -> ResourceSlots:
    """This browser session's live index / decoders / engines, one per slot; replacing releases.

    Owned by the session state: another session on another catalog never evicts or frees
    them, and they go when the session ends.
    """
    if SLOTS_KEY not in st.session_state:
        st.session_state[SLOTS_KEY] = ResourceSlots()
    return st.session_state[SLOTS_KEY]


@st.cache_resource(max_entries=4, show_spinner=False)
def cached_catalog(source: CatalogSource):
    return load_source(source)


@st.cache_data(max_entries=8, show_spinner=False)
def cached_step_stats(source: CatalogSource, _catalog) -> list[dict]:
    return _catalog.step_stats()


@st.cache_data(max_entries=8, show_spinner=False)
def cached_segment_lengths(source: CatalogSource, _catalog) -> list:
    return [_catalog.segment_lengths(level) for level in range(_catalog.n_levels)]


#: The recommender bundled with a sample catalog: sample name → its app_support module
#: (``available``, ``bundled_study``, ``test_users``, ``MISSING``).
BUNDLED_MODELS = {"movielens": movielens, beauty.DATASET: beauty}


def bundled_dataset(source) -> str | None:
    """Name of the recommender bundled with ``source``'s catalog (when its checkpoint is there).

    Only the sample as shipped qualifies: declared codebook sizes would change the layout the
    model's heads were trained on (the Catalog page drops sizes equal to its own, :func:`as_shipped`).
    """
    if source.kind != "sample" or source.codebook_sizes is not None or source.name not in BUNDLED_MODELS:
        return None
    return source.name if BUNDLED_MODELS[source.name].available() else None


def as_shipped(source: CatalogSource) -> CatalogSource:
    """``source`` without its declared codebook sizes when they are the bundled sample's own.

    Declared sizes lay a sample out again, and a laid-out-again catalog loses its bundled
    recommender (:func:`bundled_dataset`); sizes equal to the ones it ships with change
    nothing, so they leave it the sample as shipped, recommender and cached index included.
    """
    if source.kind != "sample" or source.codebook_sizes is None:
        return source
    shipped = replace(source, codebook_sizes=None)
    own = tuple(int(v) for v in cached_catalog(shipped).codebook_sizes)
    return shipped if tuple(source.codebook_sizes) == own else source


@st.cache_resource(show_spinner=False)
def cached_study(device_name: str, dataset: str = "movielens"):
    """The recommender bundled with ``dataset`` on ``device_name`` (cached per device)."""
    return BUNDLED_MODELS[dataset].bundled_study(device_name)


@st.cache_resource(show_spinner=False)
def cached_test_users(device_name: str, dataset: str = "movielens"):
    return BUNDLED_MODELS[dataset].test_users(cached_study(device_name, dataset))


def decode_inputs(catalog, dev: torch.device, *, bundled: bool, batch: int, seed: int, hidden: int | None = None,
                  dtype: str = "float32", user: int | None = None, beam: int = 1,
                  dataset: str = "movielens") -> DecodeInputs:
    """Heads and requests of a page's decode: the recommender bundled with ``dataset`` on
    ``batch`` test users sampled with ``seed`` (or the one ``user``), through its KV cache
    sized for ``beam`` beams, or a random head of ``hidden``/``dtype`` in the catalog's
    layout with ``batch`` random requests of ``seed``."""
    if not bundled:
        return random_inputs(catalog, hidden, dtype, dev, batch, seed)
    study, users = cached_study(str(dev), dataset), cached_test_users(str(dev), dataset)
    rows = np.flatnonzero(users.user_ids == user) if user is not None else users.sample(batch, seed)
    return study_inputs(study, users, rows, dev, beam, name=dataset)


# ---------------------------------------------------------------------------- active catalog
def active_source() -> CatalogSource:
    if not st.session_state.get(SOURCE_KEY):
        st.session_state[SOURCE_KEY] = default_source()
    return st.session_state[SOURCE_KEY]


def set_active_source(source: CatalogSource, upload_bytes: bytes | None = None) -> None:
    """Make ``source`` the session's catalog (an upload with its bytes); forget the old one's state."""
    if source.kind == "upload":
        st.session_state[UPLOAD_BYTES_KEY] = upload_bytes
    else:
        st.session_state.pop(UPLOAD_BYTES_KEY, None)
    if st.session_state.get(SOURCE_KEY) != source:
        st.session_state[SOURCE_KEY] = source
        st.session_state[OVERRIDES_KEY] = {}
        for key in list(st.session_state.keys()):
            if key in ("decode_runs", "decode_pending", "density_runs", "rebuild_report", "index_builders") or (
                    isinstance(key, str) and key.startswith("idx_ov_")):
                st.session_state.pop(key, None)


def get_catalog():
    """(catalog, source) of the active catalog; falls back to a synthetic sample if it fails."""
    source = active_source()
    staged = restage_upload(source, st.session_state.get(UPLOAD_BYTES_KEY))
    if staged != source:  # a new staging folder: the same bytes under another path
        st.session_state[SOURCE_KEY] = source = staged
    try:
        return cached_catalog(source), source
    except ZeroGRError as err:
        fallback = sample_source("search-like-small")
        if source == fallback:
            raise
        st.warning(f"The active catalog could not be loaded ({one_line(str(err))}); showing the search-like sample "
                   "instead.")
        # The old catalog's overrides, runs and index must not be applied to the sample.
        set_active_source(fallback)
        return cached_catalog(fallback), fallback


def overrides() -> dict:
    return dict(st.session_state.get(OVERRIDES_KEY) or {})


def index_key(source: CatalogSource, over: dict, dev: torch.device) -> tuple:
    return (source, tuple(sorted(over.items())), str(dev))


def get_index(catalog, source: CatalogSource, over: dict | None = None, dev: torch.device | None = None):
    """The active index (built once per catalog, overrides and device; the previous one is released)."""
    over = overrides() if over is None else over
    dev = dev or device()
    key = index_key(source, over, dev)

    def factory():
        slots().drop("decoders")  # they hold the previous index
        with st.status(f"Building the index of {catalog.n_items:,} items on {dev}…", expanded=False) as status:
            index = build_index(catalog, device=dev, config=IndexConfig().with_overrides(over))
            status.update(label=f"Index built in {index.build['total_s'] * 1e3:,.1f} ms on {dev}", state="complete")
        return index

    return slots().get("index", key, factory)


# ---------------------------------------------------------------------------- guard
def keep_choice(key: str, options) -> None:
    """Drop a selectbox's remembered value that is no longer one of its ``options``.

    Widget values outlive their options (app.py keeps them across pages): a test user of
    another data set, or a request of a larger batch, would make Streamlit refuse to draw
    the box on every run. The box then shows its first option.
    """
    if key in st.session_state and st.session_state[key] not in list(options):
        del st.session_state[key]


def guarded(body: Callable[[], None]) -> None:
    """Run a page body; errors become one-line boxes, never a stack trace."""
    try:
        body()
    except ZeroGRError as err:
        st.error(one_line(str(err)), icon=":material/error:")
    except Exception as err:  # noqa: BLE001 — the app must keep running
        if is_out_of_memory(err):
            released = slots().drop_all()
            host = is_host_out_of_memory(err)
            where, what = ("this machine's memory", "objects") if host else ("the GPU", "GPU objects")
            st.error(f"Out of memory: {where} could not hold this run. Try a smaller batch or beam width, a "
                     "smaller hidden size or dtype, or a smaller catalog (a dense step override can also be "
                     f"large). Cached {what} were released ({released}) so the next run starts clean.",
                     icon=":material/memory:")
        else:
            log.error("unexpected error in a page:\n%s", traceback.format_exc())
            slots().drop_all()  # a half-built index or engine must not outlive the failed run
            first = one_line(first_line(err), limit=300).rstrip(".")
            st.error(f"Something went wrong: {type(err).__name__}{': ' + first if first else ''}. "
                     "The app keeps running; change the settings and try again.", icon=":material/warning:")


def changed_since_run(shown: dict, now: dict, button: str) -> None:
    """Say, above a result, that the settings changed since its run, when they did.

    The pages keep a run's result on screen while its settings are edited; without this line
    the old numbers would read as the new settings'. Every page that shows a run's result
    next to its settings says it here, in one wording.

    Parameters
    ----------
    shown : dict
        The settings the result shown was run with.
    now : dict
        The settings the widgets hold now.
    button : str
        The label of the button that runs the page's work again.
    """
    if shown != now:
        st.caption(f"The settings changed since this run; press **{button}** to update.")


def fmt_bytes(n) -> str:
    return gpu_info.human_bytes(n)


def fmt_ratio(x: float) -> str:
    """A size ratio, written the same way wherever the app shows one: three significant
    figures up to 100 (0.452×, 1.23×, 14.9×), whole numbers above (250×)."""
    if x >= 100:
        return f"{x:,.0f}×"
    return f"{x:.1f}×" if x >= 10 else f"{x:.2f}×" if x >= 1 else f"{x:.3f}×"


def fmt_relative(size: float, other: float, other_name: str) -> str:
    """``size`` against ``other`` in words that say which way: "2.1× smaller than the SID table",
    "1.66× larger than …", "the same size as …"."""
    if size <= 0 or other <= 0:
        return "—"
    if round(size / other, 3) == 1:
        return f"the same size as {other_name}"
    if size < other:
        return f"{fmt_ratio(other / size)} smaller than {other_name}"
    return f"{fmt_ratio(size / other)} larger than {other_name}"


def fmt_codebooks(sizes) -> str:
    """Codebook sizes per level, runs of equal sizes folded: "3 × 256, then 64"; "256 / 1,024"."""
    runs: list[list] = []
    for size in sizes:
        if runs and runs[-1][0] == size:
            runs[-1][1] += 1
        else:
            runs.append([size, 1])
    if all(n == 1 for _, n in runs):
        return " / ".join(f"{v:,}" for v in sizes)
    return ", then ".join(f"{n} × {v:,}" if n > 1 else f"{v:,}" for v, n in runs)


def fmt_ms(ms: float | None) -> str:
    if ms is None or ms != ms:
        return "n/a"
    return f"{ms:,.3f} ms" if ms < 1 else f"{ms:,.1f} ms"
