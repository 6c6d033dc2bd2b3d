"""ZeroGR analysis app: `streamlit run app.py` (or `make run`).

Load a catalog, see its per-step density and index layout, compare filtering first with
scoring first on the bundled MovieLens recommender or a random head, run benchmarks,
watch GPU memory, and rebuild the index while decoding. Every page works on a machine
without a GPU (PyTorch reference path) and says so.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
# The repository root first, so that `pages` (and, without an install, `zerogr_core`) come
# from this checkout.
if str(ROOT) not in sys.path or sys.path[0] != str(ROOT):
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from pages._common import PERSISTENT_PREFIXES, active_source  # noqa: E402
from zerogr_core.app_support.gpu import device_label, has_gpu  # noqa: E402

st.set_page_config(page_title="ZeroGR", page_icon="🎯", layout="wide")

# Widget values live only while their widget is on screen; re-saving them here keeps each
# page's settings when the user switches pages and comes back.
for _key in list(st.session_state.keys()):
    if isinstance(_key, str) and _key.startswith(PERSISTENT_PREFIXES):
        st.session_state[_key] = st.session_state[_key]

PAGES = [
    st.Page(str(ROOT / "pages" / "catalog.py"), title="Catalog", icon=":material/menu_book:", url_path="catalog",
            default=True),
    st.Page(str(ROOT / "pages" / "density.py"), title="Density", icon=":material/bar_chart:", url_path="density"),
    st.Page(str(ROOT / "pages" / "index.py"), title="Index", icon=":material/account_tree:", url_path="index"),
    st.Page(str(ROOT / "pages" / "decode.py"), title="Decode", icon=":material/compare_arrows:", url_path="decode"),
    st.Page(str(ROOT / "pages" / "benchmarks.py"), title="Benchmarks", icon=":material/speed:", url_path="benchmarks"),
    st.Page(str(ROOT / "pages" / "gpu.py"), title="GPU", icon=":material/memory:", url_path="gpu"),
    st.Page(str(ROOT / "pages" / "rebuild.py"), title="Rebuild", icon=":material/autorenew:", url_path="rebuild"),
]

# The sidebar's page links are drawn here (the config turns Streamlit's own list off, which
# would show the raw file names of pages/ before this script has run).
page = st.navigation(PAGES, position="hidden")
with st.sidebar:
    for _page in PAGES:
        st.page_link(_page, label=_page.title, icon=_page.icon)

page.run()

# After the page, so the sidebar names the catalog the page just chose.
with st.sidebar:
    st.markdown("### ZeroGR")
    st.caption("Filtering-first constrained beam search for generative recommendation.")
    st.markdown(f"**Catalog:** {active_source().label}")
    if has_gpu():
        st.success(device_label(), icon=":material/check_circle:")
    else:
        st.warning("No GPU on this machine: every page runs on the CPU (PyTorch reference path).",
                   icon=":material/computer:")
