"""The app's constraint features: the Decode page excludes each user's history during decoding."""
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from zerogr_core.recsys import movielens

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.reference_kernels  # the CPU deployment's path: the constraint kernels' references
@pytest.mark.skipif(not movielens.available(), reason="the bundled MovieLens checkpoint is missing")
def test_decode_page_excludes_the_history():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180).run()
    at.switch_page("pages/decode.py")
    for key, value in dict(dec_beam=8, dec_batch=3, dec_k=8, dec_exclude=True, dec_timing="quick").items():
        at.session_state[key] = value
    at.run()
    at.button(key="btn_dec_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    res = at.session_state["decode_runs"]
    assert res["cfg"]["exclude_history"]
    for order, run in res["runs"].items():
        rows = run.result.item_rows.cpu().numpy()
        for i, history in enumerate(res["histories"]):
            assert not np.isin(rows[i][rows[i] >= 0], history).any(), order
    assert any("excluded during decoding" in c.value and "filter-first **0**" in c.value for c in at.caption)


@pytest.mark.reference_kernels
def test_rebuild_page_live_changes_keep_every_request_valid():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180)
    at.session_state["cat_sample"] = "search-like-small"
    at.run()
    at.switch_page("pages/rebuild.py")
    for key, value in dict(reb_live_seconds=1.0, reb_live_every=0.25, reb_live_share=2.0).items():
        at.session_state[key] = value
    at.run()
    at.button(key="btn_live_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    m = {x.label: x.value for x in at.metric}
    first, last = (int(v) for v in m["Catalog version"].split(" → "))
    assert last > first
    assert m["Failed requests"].startswith("0 of") and m["Deleted or invalid items returned"] == "0"
    log = at.dataframe[-1].value
    assert {"version", "change", "items", "live items"} <= set(log.columns)


def test_catalog_page_accepts_asin_ids_and_decodes_with_them():
    data = b"item_id,s1,s2\nB00ABC1234,1,0\nB07XYZ0001,0,1\nB000000001,2,2\n"
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180)
    at.session_state["cat_kind"] = "Upload a file"
    at.session_state["upload_payload"] = dict(id="asins", name="asins.csv", data=data)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert {m.label: m.value for m in at.metric}["Items"] == "3"
    at.switch_page("pages/decode.py")
    for key, value in dict(dec_beam=4, dec_batch=2, dec_hidden=8, dec_timing="quick").items():
        at.session_state[key] = value
    at.run()
    at.button(key="btn_dec_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    shown = [v for v in at.dataframe[0].value["filter-first"] if v != "—"]
    assert sorted(shown) == ["item B000000001", "item B00ABC1234", "item B07XYZ0001"]
