"""The app's constraint features: the Decode page excludes each user's history during decoding."""
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from zerogr_core.app_support import movielens

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not movielens.available(), reason="the bundled MovieLens checkpoint is missing")
def test_decode_page_excludes_the_history():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180).run()
    at.switch_page("pages/decode.py")
    for key, value in dict(dec_beam=8, dec_batch=3, dec_k=8, dec_exclude=True).items():
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
