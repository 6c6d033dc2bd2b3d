"""Bad input through the app's widgets: one-line error boxes, nothing lost.

Each test is a failure the robustness sweep found: a remembered widget value that no longer
fits its options, another session's uploads taking a session's catalog away, a path the OS
cannot look up, a message that was not one line, and the Benchmarks page's live sweep
reading files outside the data roots. Uploads are simulated as in tests/test_app_catalog.py;
the shared helpers are in tests/app_harness.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from app_harness import ROOT, assert_clean, errors, new_app, open_page
from zerogr_core.app_support import sources
from zerogr_core.app_support.benchrun import live_catalog, live_scale
from zerogr_core.app_support.messages import one_line
from zerogr_core.app_support.sources import AppSettings, CatalogSource
from zerogr_core.catalog.limits import LoadLimits
from zerogr_core.errors import ZeroGRError
from zerogr_core.recsys import movielens

OWN = "Your model (a transformers checkpoint folder on the server)"


def catalog_csv(rows: int) -> bytes:
    return b"item_id,s1,s2\n" + b"".join(f"{r},{r // 4},{r % 4}\n".encode() for r in range(rows))


# ---------------------------------------------------------------------------- remembered choices
def test_a_request_of_an_earlier_larger_batch_is_not_kept():
    """Request 7 of a batch of 8 picked, then a batch of 2 run: the lists show, the index stays."""
    at = open_page(new_app(cat_sample="tiny").run(), "decode", dec_beam=3, dec_batch=8, dec_hidden=8,
                   dec_timing="quick")
    at.button(key="btn_dec_run").click().run()
    at.selectbox(key="dec_show").set_value(6).run()
    at.number_input(key="dec_batch").set_value(2).run()
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    assert not errors(at), errors(at)
    assert at.selectbox(key="dec_show").value == 0 and len(at.dataframe[0].value) == 3
    assert at.session_state["resource_slots"].peek("index") is not None


@pytest.mark.skipif(not movielens.available(), reason="the bundled MovieLens checkpoint is missing")
def test_a_test_user_the_catalog_does_not_have_falls_back_to_its_first_user():
    """A Beauty test user (ids up to 22,362) remembered when the catalog is MovieLens (610 users)."""
    at = open_page(new_app().run(), "decode", dec_beam=3, dec_request="One test user", dec_user=22_362)
    assert_clean(at)
    users = at.selectbox(key="dec_user")
    assert users.value == int(users.options[0])
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    assert int(at.session_state["decode_runs"]["user_ids"][0]) == int(users.options[0])


# ---------------------------------------------------------------------------- uploads and sessions
def test_an_upload_outlives_other_sessions_uploads(monkeypatch):
    """Another session's uploads prune the staging folder and evict the shared catalog cache;
    this session keeps its catalog, and neither session sees the other's upload."""
    monkeypatch.setattr(sources, "MAX_STAGED_UPLOADS", 2)
    mine = catalog_csv(6)
    a = new_app(cat_kind="Upload a file", upload_payload=dict(id="a", name="mine.csv", data=mine)).run()
    assert_clean(a)
    active = a.session_state["active_source"]
    assert active.kind == "upload" and not errors(a)
    b = new_app(cat_kind="Upload a file").run()
    assert b.session_state["active_source"] != active and "upload_payload" not in b.session_state
    for i in range(6):  # more than the cache's 4 catalogs and the 2 staged files
        b.session_state["upload_payload"] = dict(id=f"b{i}", name=f"other{i}.csv", data=catalog_csv(8 + i))
        b.run()
        assert_clean(b)
        assert not errors(b), errors(b)
    assert not Path(active.path).exists()  # pruned by the other session
    a = open_page(a, "density", den_beam=2, den_batch=1)
    assert_clean(a)
    assert not any("could not be loaded" in w.value for w in a.warning), [w.value for w in a.warning]
    assert a.session_state["active_source"] == active
    assert "6 items" in a.markdown[0].value
    assert b.session_state["active_source"].name == "other5.csv"


def test_a_lost_catalog_falls_back_without_its_overrides():
    """An active catalog that cannot be read again: the sample replaces it, and the lost
    catalog's per-step overrides are not applied to the sample."""
    gone = CatalogSource("upload", "gone.csv", "/nonexistent/zerogr/gone.csv", "0" * 16)
    at = open_page(new_app(active_source=gone, index_overrides={5: "sparse"}, idx_ov_5="sparse"), "index")
    assert_clean(at)
    assert any("could not be loaded" in w.value and "gone.csv" in w.value for w in at.warning)
    assert at.session_state["active_source"].name == "search-like-small"
    assert at.session_state["index_overrides"] == {}


# ---------------------------------------------------------------------------- own model folder
@pytest.mark.parametrize("typed", ["my\x00model", "~zerogr-no-such-user/model"], ids=["nul-byte", "unknown-user"])
def test_a_model_path_the_os_cannot_look_up_is_refused_like_a_missing_one(typed):
    at = open_page(new_app(cat_sample="tiny").run(), "density", den_beam=2, den_batch=1)
    index = at.session_state["resource_slots"].peek("index")
    at = open_page(at, "decode", dec_model=OWN, dec_model_path="no-such-model-folder")
    [missing] = errors(at)
    at.text_input(key="dec_model_path").set_value(typed).run()
    assert_clean(at)
    assert errors(at) == [missing] and missing.startswith("model folder: no transformers checkpoint")
    assert at.session_state["resource_slots"].peek("index") is index  # nothing released


def test_a_bad_model_folder_keeps_the_rest_of_the_decode_page():
    """A folder with no checkpoint stopped the page at its error: the settings below it and the Run button
    were gone until the path was fixed. Now the error stands by the folder, the rest of the page stays, and
    Run is disabled (and refuses, naming the folder, if pressed anyway)."""
    at = open_page(new_app(cat_sample="tiny").run(), "decode", dec_model=OWN, dec_model_path="no-such-model-folder",
                   dec_beam=2, dec_batch=1, dec_timing="quick")
    assert_clean(at)
    [missing] = errors(at)
    assert missing.startswith("model folder: no transformers checkpoint"), missing
    assert at.button(key="btn_dec_run").disabled
    at.radio(key="dec_timing").set_value("page").run()  # a setting below the folder is still there to change
    at.selectbox(key="dec_item_set").set_value("cold").run()
    assert_clean(at)
    assert errors(at) == [missing] and at.number_input(key="dec_cold_share").disabled is False
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    assert "decode_runs" not in at.session_state and "decode_pending" not in at.session_state
    assert all(e.startswith("model folder:") for e in errors(at)), errors(at)


# ---------------------------------------------------------------------------- one-line messages
@pytest.mark.parametrize("name,data,expected", [
    ("header.csv", b'"item\nid",s1\n1,0\n', "columns: item\\nid, s1"),
    ("long.csv", b"item_id,s1\n1," + b"x" * 5000 + b"\n", "is not an integer"),
    ("formula.csv", b"item_id,s1\n1,$x$\n", "'\\$x\\$' is not an integer"),
], ids=["newline-in-header", "5000-char-cell", "dollar-signs"])
def test_an_upload_error_is_one_short_line_shown_as_written(name, data, expected):
    at = new_app(cat_sample="tiny").run()
    at.session_state["cat_kind"] = "Upload a file"
    at.session_state["upload_payload"] = dict(id=name, name=name, data=data)
    at.run()
    assert_clean(at)
    [message] = errors(at)
    assert "\n" not in message and len(message) <= 420 and message.startswith(name), message
    assert expected in message


def test_one_line():
    assert one_line("a\nb\x00c") == "a\\nb\\x00c"
    long = one_line("head " + "x" * 1000 + " tail", limit=100)
    assert long.startswith("head ") and long.endswith(" tail") and " … " in long and len(long) <= 103
    assert one_line("costs $5 and $6") == "costs \\$5 and \\$6"


def test_the_guard_does_not_double_a_full_stop(monkeypatch):
    import zerogr_core.app_support.density as density

    def broken(*args, **kwargs):
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(density, "beam_weighted_density", broken)
    at = open_page(new_app(cat_sample="tiny").run(), "density", den_beam=2, den_batch=1)
    [message] = errors(at)
    assert "home directory. The app keeps running" in message and ".." not in message


# ---------------------------------------------------------------------------- benchmarks: live sweep
@pytest.fixture
def settings(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    (root / "good.csv").write_bytes(catalog_csv(5))
    (root / "bad.csv").write_bytes(b"item_id,s1\n1,S3CRET\n")
    (tmp_path / "outside.csv").write_bytes(catalog_csv(5))
    return AppSettings((sources.SAMPLE_DIR.resolve(), root.resolve()), LoadLimits(max_rows=1000))


def test_live_sweep_catalogs_are_read_as_server_files_are(settings, tmp_path):
    assert live_catalog("", settings) is None
    assert live_catalog(" search-like ", settings) == "search-like"
    assert live_catalog("tiny", settings) == "tiny"
    assert live_catalog("synth:watch-like:500", settings) == "synth:watch-like:500"
    assert live_catalog("good.csv", settings) == str(settings.roots[1] / "good.csv")
    with pytest.raises(ZeroGRError, match=r"^Catalog: /etc/passwd: unsupported file type"):
        live_catalog("/etc/passwd", settings)
    for outside in (str(tmp_path / "outside.csv"), "../outside.csv", "/etc/passwd.csv"):
        with pytest.raises(ZeroGRError, match=r"^Catalog: no catalog file at that path inside the data folders"):
            live_catalog(outside, settings)
    with pytest.raises(ZeroGRError, match=r"^Catalog: bad.csv, row 1, column 's1': \(value withheld\)"):
        live_catalog("bad.csv", settings)
    with pytest.raises(ZeroGRError, match=r"over this app's limit of 1,000 rows"):
        live_catalog("synth:search-like:1e12", settings)


def test_live_sweep_scale():
    assert live_scale("1e3", 1000) == 1000
    # left empty: the bench default where it fits the limit, else the limit (search-like's is 19,269,255)
    assert live_scale(" ", 10**8) is None and live_scale(" ", 10) == 10
    assert live_scale("", 10**7, catalog="search-like") == 10**7
    assert live_scale("", 10**7, catalog="synthetic-7") is None  # its default, 10^7, fits
    assert live_scale("", 10, catalog="tiny") is None  # a sample: no scale at all
    over = r"^Scale \(SIDs\): 30,000,000 SIDs, over this app's limit of 20,000,000 rows"
    with pytest.raises(ZeroGRError, match=over):
        live_scale("3e7", 2 * 10**7)
    with pytest.raises(ZeroGRError, match=r"^Scale \(SIDs\): "):
        live_scale("1e30", 2 * 10**7)
    with pytest.raises(ZeroGRError, match=r"^Scale \(SIDs\): 'abc' is not a whole number"):
        live_scale("abc", 10)


def test_the_live_sweep_refuses_a_file_outside_the_data_roots_before_it_starts(monkeypatch, tmp_path):
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import pages._common as common

    at = open_page(new_app(cat_sample="tiny").run(), "index")
    index = at.session_state["resource_slots"].peek("index")
    monkeypatch.setattr(common, "device", lambda: torch.device("cuda"))  # the live section is drawn on a GPU
    outside = tmp_path / "private.csv"
    outside.write_bytes(b"item_id,s1\n1,S3CRET\n")
    at = open_page(at, "benchmarks", bench_catalog=str(outside))
    assert_clean(at)
    at.button(key="btn_bench_run").click().run()
    assert_clean(at)
    [message] = errors(at)
    assert message.startswith("Catalog: no catalog file at that path inside the data folders"), message
    assert "bench_live_records" not in at.session_state
    assert at.session_state["resource_slots"].peek("index") is index  # refused before anything was released


def test_the_headline_table_with_unmeasured_cells_is_an_arrow_table():
    """Numbers and "—" in one column: Streamlit logged a traceback on every view of the page."""
    import pyarrow as pa

    from zerogr_core.app_support.benchview import unmeasured_as_dash

    frame = unmeasured_as_dash([{"beam": 1, "zerogr ms": 1.5, "static ms": 2.25},
                                {"beam": 8, "zerogr ms": 3.0, "static ms": None}])
    table = pa.Table.from_pandas(frame)
    assert table.column("static ms").to_pylist() == ["2.25", "—"]
    assert table.column("zerogr ms").to_pylist() == [1.5, 3.0]  # measured everywhere: still numbers
