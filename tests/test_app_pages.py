"""AppTest (streamlit.testing.v1) of every page of the app: default flows, one bad upload per
validation error class, overrides, both decode orders on the bundled MovieLens model, and the
error guard (no stack trace ever reaches the page).

AppTest cannot drive the real file uploader, so uploads are simulated the way the Catalog page
receives them: the uploaded file's name and bytes in ``st.session_state["upload_payload"]``
(the real uploader is exercised by tests/e2e). Decodes use the app's reference path, so they
stay fast even with TRITON_INTERPRET=1.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from streamlit.testing.v1 import AppTest

# triton.jit picks the interpreter when a kernel module is imported: imported here, under the
# suite's TRITON_INTERPRET=1, rather than first inside a reference_kernels test (which sets it to 0
# and would leave later tests a compiled kernel with no GPU driver to run it)
import zerogr_kernels.constraints  # noqa: F401,E402

from zerogr_core.app_support import benchview
from zerogr_core.recsys import movielens

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 180

needs_movielens = pytest.mark.skipif(not movielens.available(), reason="the bundled MovieLens checkpoint is missing")


def new_app(**state) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    for key, value in state.items():
        at.session_state[key] = value
    return at


def errors(at) -> list[str]:
    return [e.value for e in at.error]


def assert_clean(at) -> None:
    """No exception element and no 'Something went wrong' box on the page."""
    assert not at.exception, [e.value for e in at.exception]
    assert not any("Something went wrong" in e for e in errors(at)), errors(at)


def metrics(at) -> dict:
    return {m.label: m.value for m in at.metric}


def open_page(at, name: str, **state) -> AppTest:
    at.switch_page(f"pages/{name}.py")
    for key, value in state.items():
        at.session_state[key] = value
    return at.run()


# ---------------------------------------------------------------------------- catalog
def test_catalog_default_is_the_bundled_movielens_catalog():
    at = new_app().run()
    assert_clean(at)
    assert at.title[0].value == "Catalog"
    m = metrics(at)
    assert "Items" in m and "Tokens per level" in m
    if movielens.available():
        assert at.session_state["active_source"].is_movielens
        assert "MovieLens SID catalog" in at.subheader[0].value
        assert m["Items"] == "9,742" and m["Tokens per level"] == "3 × 128, then 24"
    assert any("No GPU on this machine" in i.value for i in at.info) or torch.cuda.is_available()


@pytest.mark.parametrize("name,items,levels", [("search-like-small", "50,000", 5), ("watch-like-small", "20,000", 3),
                                               ("synthetic-7-small", "20,000", 7), ("tiny", "12", 3)])
def test_catalog_bundled_samples(name, items, levels):
    at = new_app(cat_sample=name).run()
    assert_clean(at)
    m = metrics(at)
    assert m["Items"] == items and m["Levels (SID length)"] == str(levels)
    assert any(s.value.startswith("Loaded ") for s in at.success)
    steps = at.dataframe[0].value
    assert len(steps) == levels and "share of tokens valid" in steps.columns


def _parquet_bytes(frame: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.write_parquet(buf)
    return buf.getvalue()


GOOD_CSV = b"item_id,s1,s2,title\n11,0,0,A\n12,0,1,B\n13,1,0,C\n"

BAD_UPLOADS = [
    # (id, file name, bytes, declared codebook sizes, expected parts of the message)
    ("extension", "catalog.xlsx", GOOD_CSV, "", ["catalog.xlsx", "unsupported file type '.xlsx'"]),
    ("empty-file", "empty.csv", b"", "", ["empty.csv", "file is empty"]),
    ("header-only", "header.csv", b"item_id,s1,s2\n", "", ["header.csv", "no data rows"]),
    ("no-item-id", "noid.csv", b"s1,s2\n0,0\n", "", ["noid.csv", "no 'item_id' column"]),
    ("no-sid-columns", "nosid.csv", b"item_id,title\n1,a\n", "", ["nosid.csv", "no SID columns"]),
    ("level-gap", "gap.csv", b"item_id,s1,s3\n1,0,0\n", "", ["gap.csv", "column 's2'", "without gaps"]),
    ("both-layouts", "both.csv", b"item_id,sid,s1\n1,0 1,0\n", "", ["both.csv", "column 'sid'", "keep one layout"]),
    ("duplicate-column", "dupcol.csv", b"item_id,s1,S1\n1,0,0\n", "", ["dupcol.csv", "appears twice"]),
    ("extra-fields", "extra.csv", b"item_id,s1\n1,0\n2,1,5\n", "", ["extra.csv", "row 2", "3 fields"]),
    ("missing-value", "missing.csv", b"item_id,s1,s2\n1,0,0\n2,0,\n", "",
     ["missing.csv", "row 2", "column 's2'", "missing value"]),
    ("non-integer-token", "text.csv", b"item_id,s1,s2\n1,0,0\n2,0,x\n", "",
     ["text.csv", "row 2", "column 's2'", "'x' is not an integer"]),
    ("fractional-token", "frac.tsv", b"item_id\ts1\ts2\n1\t0\t0.5\n", "",
     ["frac.tsv", "row 1", "column 's2'", "not an integer"]),
    ("negative-token", "neg.csv", b"item_id,s1,s2\n1,0,0\n2,-1,0\n", "",
     ["neg.csv", "row 2", "column 's1'", "negative token -1"]),
    ("out-of-codebook", "big.csv", b"item_id,s1,s2\n1,0,0\n2,0,2\n", "2, 2",
     ["big.csv", "row 2", "column 's2'", "token 2 ≥ codebook size 2"]),
    ("codebook-count", "levels.csv", b"item_id,s1,s2\n1,0,0\n", "4",
     ["levels.csv", "column 'codebook_sizes'", "the SIDs have 2 levels, the codebook sizes 4 have 1"]),
    ("ragged-sid", "ragged.csv", b"item_id,sid\n1,0 1\n2,0 1 2\n", "",
     ["ragged.csv", "row 2", "column 'sid'", "3 tokens, but row 1 has 2"]),
    ("empty-string-item-id", "ids.csv", b"item_id,s1\nB00ABC1234,0\n ,1\n", "",
     ["ids.csv", "row 2", "column 'item_id'", "empty item id"]),
    ("duplicate-item-id", "dupid.csv", b"item_id,s1\n5,0\n5,1\n", "",
     ["dupid.csv", "row 2", "column 'item_id'", "duplicate item id 5"]),
    ("duplicate-sid", "dupsid.csv", b"item_id,s1,s2\n1,0,0\n2,0,0\n", "",
     ["dupsid.csv", "column 's1–s2'", "shared by items 1 and 2"]),
    ("unreadable-parquet", "broken.parquet", b"this is not parquet", "", ["broken.parquet", "cannot read as PARQUET"]),
    ("parquet-missing-value", "holes.parquet",
     _parquet_bytes(pl.DataFrame({"item_id": [1, 2], "s1": [0, None]}, schema={"item_id": pl.Int64, "s1": pl.Int64})),
     "", ["holes.parquet", "row 2", "column 's1'", "missing value"]),
    ("too-many-levels", "wide.csv",
     ("item_id," + ",".join(f"s{i}" for i in range(1, 2001)) + "\n" + "".join(
         f"{r}," + ",".join(str((r + i) % 5) for i in range(2000)) + "\n" for r in range(50))).encode(), "",
     ["wide.csv", "2,000 SID levels, over the limit of 16"]),
    ("too-many-levels-sid", "widesid.csv", b"item_id,sid\n1," + b" ".join([b"0"] * 17) + b"\n", "",
     ["widesid.csv", "17 SID levels, over the limit of 16"]),
    ("huge-token", "huge.csv", b"item_id,s1,s2\n1,0,0\n2,0,99999999\n", "",
     ["huge.csv", "level 2 has a codebook of 100,000,000 tokens, over the limit of 65,536"]),
    ("huge-declared-codebook", "declared.csv", b"item_id,s1\n1,0\n", "70000",
     ["declared.csv", "level 1 has a codebook of 70,000 tokens"]),
]


BAD_UPLOADS_BY_ID = {c[0]: dict(name=c[1], data=c[2]) for c in BAD_UPLOADS}


@pytest.mark.parametrize("name,data,sizes,expected", [c[1:] for c in BAD_UPLOADS], ids=[c[0] for c in BAD_UPLOADS])
def test_bad_upload_shows_one_line_error_and_keeps_the_catalog(name, data, sizes, expected):
    at = new_app().run()
    before = at.session_state["active_source"]
    at.session_state["cat_kind"] = "Upload a file"
    at.session_state["cat_codebooks"] = sizes
    at.session_state["upload_payload"] = dict(id="test", name=name, data=data)
    at.run()
    assert_clean(at)
    msgs = errors(at)
    assert len(msgs) == 1, msgs
    assert "\n" not in msgs[0]
    for part in expected:
        assert part in msgs[0], (part, msgs[0])
    assert at.session_state["active_source"] == before
    assert any("The catalog in use stays" in c.value for c in at.caption)
    assert metrics(at)["Items"]  # the summary of the kept catalog is still there


def test_upload_over_the_limit(monkeypatch):
    monkeypatch.setenv("ZEROGR_MAX_UPLOAD_MB", "0.00001")  # about 10 bytes
    at = new_app(cat_kind="Upload a file", upload_payload=dict(id="big", name="big.csv", data=GOOD_CSV)).run()
    assert_clean(at)
    assert "over the upload limit" in errors(at)[0] and "file path on the server" in errors(at)[0]


@pytest.mark.parametrize("name,data", ids=["csv", "tsv", "parquet"], argvalues=[
    ("good.csv", GOOD_CSV),
    ("good.tsv", GOOD_CSV.replace(b",", b"\t")),
    ("good.parquet", _parquet_bytes(pl.DataFrame({"item_id": [11, 12, 13], "sid": ["0 0", "0 1", "1 0"]}))),
])
def test_good_upload_becomes_the_active_catalog(name, data):
    at = new_app(cat_kind="Upload a file", upload_payload=dict(id=name, name=name, data=data)).run()
    assert_clean(at)
    assert not errors(at)
    assert at.session_state["active_source"].kind == "upload"
    assert metrics(at)["Items"] == "3" and f"upload: {name}" in at.subheader[0].value
    # other pages now work on it
    open_page(at, "density", den_beam=2, den_batch=2)
    assert_clean(at)
    assert "3 items" in at.markdown[0].value


def test_duplicate_sids_with_the_collision_option():
    data = b"item_id,s1,s2\n1,0,0\n2,0,0\n3,1,0\n"
    at = new_app(cat_kind="Upload a file", cat_collision=True,
                 upload_payload=dict(id="dup", name="dups.csv", data=data)).run()
    assert_clean(at)
    assert metrics(at)["Levels (SID length)"] == "3"
    assert any("collision level was appended" in c.value for c in at.caption)


REFUSED = "no catalog file at that path inside the data folders"
SECRET = "S3CRET-root:x:0:0"


def test_server_file_path(tmp_path, monkeypatch):
    root, outside = tmp_path / "data", tmp_path / "outside"
    root.mkdir(), outside.mkdir()
    monkeypatch.setenv("ZEROGR_DATA_DIR", str(root))
    good = root / "server_catalog.csv"
    good.write_bytes(GOOD_CSV)
    at = new_app(cat_kind="File on the server").run()
    assert_clean(at)
    assert any(str(root.resolve()) in c.value for c in at.caption)  # the page names the data folders
    assert not any("To read your own catalogs" in i.value for i in at.info)
    at.text_input(key="cat_path").input(str(good)).run()
    assert_clean(at)
    assert at.session_state["active_source"].kind == "file" and metrics(at)["Items"] == "3"
    # missing, outside, `..` and a link out: one answer, naming the roots and nothing about the file
    secret = outside / "secret.csv"
    secret.write_text(f"item_id,s1\n{SECRET},1\n")
    (root / "link.csv").symlink_to(secret)
    answers = set()
    for typed in (str(root / "nowhere.csv"), str(secret), "../outside/secret.csv", "link.csv"):
        at.text_input(key="cat_path").input(typed).run()
        assert_clean(at)
        [message] = errors(at)
        assert message.startswith(REFUSED) and str(root.resolve()) in message and "secret" not in message
        answers.add(message)
        assert at.session_state["active_source"].name == str(good)
    assert len(answers) == 1
    # a bad cell: row and column, never the value
    bad = root / "bad_rows.csv"
    bad.write_bytes(f"item_id,s1,s2\n1,0,0\n2,{SECRET},4\n".encode())
    at.text_input(key="cat_path").input("bad_rows.csv").run()
    assert errors(at) == ["bad_rows.csv, row 2, column 's1': (value withheld) is not an integer"]
    assert at.session_state["active_source"].name == str(good)


def test_server_files_without_extra_roots_say_how_to_add_one(monkeypatch):
    monkeypatch.delenv("ZEROGR_DATA_DIR", raising=False)
    at = new_app(cat_kind="File on the server").run()
    assert_clean(at)
    assert any("ZEROGR_DATA_DIR" in i.value and "To read your own catalogs" in i.value for i in at.info)
    at.text_input(key="cat_path").input("tiny.csv").run()  # relative to the samples folder
    assert_clean(at)
    assert metrics(at)["Items"] == "12"


def test_limits_are_on_the_page_and_bound_uploads(monkeypatch):
    monkeypatch.setenv("ZEROGR_MAX_ROWS", "2")
    monkeypatch.setenv("ZEROGR_MAX_UPLOAD_MB", "1")
    at = new_app(cat_kind="Upload a file", upload_payload=dict(id="rows", name="rows.csv", data=GOOD_CSV)).run()
    assert_clean(at)
    assert any("uploads up to 1 MB" in c.value and "up to 2 rows" in c.value for c in at.caption)
    assert errors(at) == ["rows.csv: 3 rows, over the limit of 2 rows"]


def test_a_2000_level_upload_is_refused_quickly():
    """The finding of issue 32: 50 rows × 2,000 levels ran Density for minutes; now one line, fast."""
    import time

    data = dict(BAD_UPLOADS_BY_ID["too-many-levels"])
    at = new_app().run()
    at.session_state["cat_kind"] = "Upload a file"
    at.session_state["upload_payload"] = dict(id="wide", name="wide.csv", data=data["data"])
    start = time.perf_counter()
    at.run()
    elapsed = time.perf_counter() - start
    assert len(errors(at)) == 1 and "over the limit of 16" in errors(at)[0]
    assert elapsed < 5, elapsed  # generous for a shared CPU; the browser test holds the 2 s bound
    at = open_page(at, "density")
    assert_clean(at)
    assert not any("2,000" in e for e in errors(at))  # the refused file never became the catalog


def test_a_catalog_at_the_level_limit_runs_every_page():
    """16 levels, the most a file may have: Density, Index and Decode draw it."""
    rows = "".join(f"{r}," + ",".join(str((r >> (i % 8)) % 2 if i < 8 else (r * 7 + i) % 3) for i in range(16)) + "\n"
                   for r in range(200))
    data = ("item_id," + ",".join(f"s{i}" for i in range(1, 17)) + "\n" + rows).encode()
    at = new_app(cat_kind="Upload a file", upload_payload=dict(id="deep", name="deep.csv", data=data)).run()
    assert_clean(at)
    assert not errors(at), errors(at)
    assert metrics(at)["Levels (SID length)"] == "16"
    for page, state in (("density", dict(den_beam=4, den_batch=2)), ("index", {}),
                        ("decode", dict(dec_beam=4, dec_batch=2, dec_hidden=8, dec_timing="quick"))):
        at = open_page(at, page, **state)
        if page == "decode":
            at.button(key="btn_dec_run").click().run()
        assert_clean(at)
        assert not errors(at), (page, errors(at))


def test_decode_work_over_the_limit_is_refused_before_it_starts(monkeypatch):
    monkeypatch.setenv("ZEROGR_MAX_DECODE_LOGITS", "1000")
    at = new_app(cat_sample="search-like-small").run()
    at = open_page(at, "decode", dec_batch=4, dec_beam=4)
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    msgs = errors(at)
    assert len(msgs) == 1 and "batch 4 × beam 4" in msgs[0] and "over this machine's limit of 1,000" in msgs[0], msgs
    assert "decode_runs" not in at.session_state
    at = open_page(at, "density", den_batch=4, den_beam=4)
    assert any("over this machine's limit" in e for e in errors(at))


# ---------------------------------------------------------------------------- density, index
def test_density_page():
    at = new_app(cat_sample="search-like-small").run()
    open_page(at, "density", den_beam=4, den_batch=2)
    assert_clean(at)
    m = metrics(at)
    assert m["Beams × requests"] == "4 × 2" and m["Scoring-first logits wasted (all steps)"].endswith("%")
    assert len(at.get("plotly_chart")) == 3
    table = at.dataframe[0].value
    assert len(table) == 5
    assert (table["beam-weighted density"] > 0).all() and (table["wasted share"] <= 1).all()
    at.number_input(key="den_beam").set_value(6).run()
    assert metrics(at)["Beams × requests"] == "6 × 2"


@needs_movielens
def test_density_page_with_the_model_beams():
    at = new_app().run()
    open_page(at, "density", den_beam=4, den_batch=2)
    assert_clean(at)
    assert at.selectbox(key="den_from").value.startswith("Bundled MovieLens model")
    assert len(at.get("plotly_chart")) == 3


def test_index_page_and_overrides():
    at = new_app(cat_sample="tiny").run()
    open_page(at, "index")
    assert_clean(at)
    m = metrics(at)
    assert {"This index", "STATIC-style index", "Plain ID table"} <= set(m)
    # every ratio says which way
    assert m["This index, compared"].endswith("than STATIC-style") or m["This index, compared"].startswith("the same")
    assert " than the plain ID table" in m["Planned index vs plain IDs"]
    assert len(at.get("plotly_chart")) == 3
    steps = at.dataframe[0].value
    assert len(steps) == 3
    before = m["Planned index"]
    # with nothing overridden the plan is this index: both ratios read the same, rounded one way
    assert m["This index, compared"] == m["Planned index, compared"]
    at.selectbox(key="idx_ov_3").select("sparse" if steps["representation"][2] == "dense" else "dense").run()
    assert_clean(at)
    after = metrics(at)["Planned index"]
    assert after != before  # the memory effect shows at once, before any rebuild
    planned = at.dataframe[-1].value
    assert planned["planned"][2] != planned["now"][2]
    at.button(key="btn_idx_apply").click().run()
    assert_clean(at)
    assert any(s.value.startswith("Index rebuilt in") for s in at.success)  # confirmed, not silent
    assert at.dataframe[0].value["representation"][2] == planned["planned"][2]
    assert metrics(at)["This index"] == after
    assert at.session_state["index_overrides"] == {3: planned["planned"][2]}


def test_index_page_times_the_three_builders():
    at = new_app(cat_sample="tiny").run()
    open_page(at, "index")
    at.button(key="btn_idx_time_builders").click().run()
    assert_clean(at)
    assert len(at.get("plotly_chart")) == 4


# ---------------------------------------------------------------------------- decode
@needs_movielens
def test_decode_both_orders_on_the_bundled_model():
    at = new_app().run()
    open_page(at, "decode", dec_beam=4, dec_batch=2, dec_k=4)
    assert_clean(at)
    assert at.selectbox(key="dec_model").value == "Bundled MovieLens recommender"
    assert any("Run both orders" in i.value for i in at.info)
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    m = metrics(at)
    assert "Lists that agree (overlap@4)" in m and m["Lists that agree (overlap@4)"].endswith("%")
    assert m["filter-first latency (median)"].endswith("ms") and m["score-first latency (median)"].endswith("ms")
    top = at.dataframe[0].value
    assert list(top.columns) == ["rank", "filter-first", "filter-first log-prob", "score-first",
                                 "score-first log-prob"]
    assert len(top) == 4
    # movie titles, not bare ids
    assert all("(" in str(t) and not str(t).startswith("item ") for t in top["filter-first"])
    assert (top["filter-first log-prob"] >= top["score-first log-prob"] - 1e-4).all()
    plan = at.dataframe[1].value
    assert list(plan["step"]) == list(range(1, len(plan) + 1))
    # the Decoder's plan table, on a CPU or a GPU: what filtering first computes per step
    assert set(plan["scores computed"]) <= {"whole codebook (one GEMM)", "valid tokens only"}
    res = at.session_state["decode_runs"]
    raw = [row["projection"] for row in res["plan"]]
    assert res["runs"]["filter-first"].projection == tuple(raw)
    # latency: ≥ 20 whole decodes per order, named implementations, and their distribution
    for order in ("filter-first", "score-first"):
        lat = res["latency"][order]
        assert len(lat.samples_ms) >= 20 and lat.implementation
    assert len(at.get("plotly_chart")) == 3
    assert set(res["runs"]) == {"filter-first", "score-first"}
    assert res["targets"] is not None and len(res["targets"]) == 2


def test_decode_both_orders_on_the_bundled_beauty_model():
    from zerogr_core.recsys import beauty

    if not beauty.available():
        pytest.skip("the bundled Beauty checkpoint is missing")
    at = new_app(cat_sample="amazon-beauty").run()
    assert_clean(at)
    assert any("LICENCE-tiger-cf.txt" in c.value and "LICENSE-ICLRec.txt" in c.value for c in at.caption)
    open_page(at, "decode", dec_beam=4, dec_batch=2, dec_k=4)
    assert_clean(at)
    assert at.selectbox(key="dec_model").value == "Bundled Amazon Beauty recommender (T5, tiger preset)"
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    res = at.session_state["decode_runs"]
    assert res["cfg"]["dataset"] == "amazon-beauty" and len(res["targets"]) == 2
    top = at.dataframe[0].value
    assert len(top) == 4 and (top["filter-first log-prob"] >= top["score-first log-prob"] - 1e-4).all()
    assert any("held-out test item" in c.value for c in at.caption)
    # the data has no titles: items read by number and popularity, and the page says why
    assert all(str(t).startswith("item ") and " histor" in str(t) for t in top["filter-first"] if t != "—")
    assert any("has no product titles" in c.value for c in at.caption)


@needs_movielens
def test_decode_one_test_user():
    at = new_app().run()
    open_page(at, "decode", dec_beam=3, dec_request="One test user")
    users = at.selectbox(key="dec_user")
    users.select(users.options[5]).run()
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    res = at.session_state["decode_runs"]
    assert res["cfg"]["batch"] == 1 and int(res["user_ids"][0]) == int(users.options[5])
    assert any("held-out test item" in c.value for c in at.caption)


def test_decode_random_head_on_a_synthetic_catalog():
    at = new_app(cat_sample="search-like-small").run()
    open_page(at, "decode", dec_beam=3, dec_batch=2, dec_hidden=16, dec_dtype="bfloat16")
    assert at.selectbox(key="dec_model").value.startswith("Random head (latency only: random weights, overlap is "
                                                          "meaningless)")
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    top = at.dataframe[0].value
    assert len(top) == 3 and all(str(t).startswith("item ") for t in top["filter-first"])
    # the invalid mass scoring first meets, per step, and why the orders differ on a random head
    invalid = at.dataframe[-1].value
    assert list(invalid["step"]) == [1, 2, 3, 4, 5]
    assert ((invalid["mean"] >= 0) & (invalid["mean"] <= 1)).all() and invalid["mean"].max() > 0.5
    assert any("A random head knows nothing of the catalog" in c.value for c in at.caption)
    assert any("Latency only: random weights, overlap is meaningless" in w.value for w in at.warning)
    # a GPU also times scoring first over the valid tokens only (the valid-token STATIC graph); a CPU the orders alone
    shown = metrics(at)
    assert "filter-first latency (median)" in shown and "Faster order" in shown
    valid = "scoring first, valid tokens only (STATIC adapted) latency (median)"
    assert (valid in shown) == torch.cuda.is_available(), shown
    at.number_input(key="dec_beam").set_value(5).run()
    assert any("settings changed" in c.value for c in at.caption)


@pytest.mark.reference_kernels  # the CPU deployment's path, as `make run` serves it
def test_the_same_run_twice_reports_the_same_winner():
    at = new_app(cat_sample="tiny").run()
    open_page(at, "decode", dec_beam=4, dec_batch=4, dec_hidden=16)
    verdicts = []
    for _ in range(2):
        at.button(key="btn_dec_run").click().run()
        assert_clean(at)
        res = at.session_state["decode_runs"]
        assert all(len(lat.samples_ms) >= 20 and sum(lat.samples_ms) >= 1000 for lat in res["latency"].values())
        verdicts.append(metrics(at)["Faster order"])
    assert verdicts[0] == verdicts[1], verdicts


@pytest.mark.reference_kernels
@pytest.mark.parametrize("kind", ["t5", "gpt2"])
def test_your_own_transformers_model_decodes_in_both_orders(tmp_path, monkeypatch, kind):
    """A tiny checkpoint saved to a data root, its SID offsets in zerogr.json, decoded from the page."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    vocab, offsets = 14, [2, 6, 10]  # the tiny sample: 3 levels of 4 tokens
    if kind == "t5":
        config = transformers.T5Config(vocab_size=vocab, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                       num_decoder_layers=1, num_heads=2, decoder_start_token_id=0, pad_token_id=0,
                                       eos_token_id=1, dropout_rate=0.0)
        model = transformers.T5ForConditionalGeneration(config)
    else:
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=16, n_layer=1, n_head=2, n_positions=32,
                                         bos_token_id=2, eos_token_id=1, pad_token_id=0)
        model = transformers.GPT2LMHeadModel(config)
    root = tmp_path / "models"
    model.save_pretrained(root / "mine")
    (root / "mine" / "zerogr.json").write_text(json.dumps({"token_offsets": offsets}))
    monkeypatch.setenv("ZEROGR_DATA_DIR", str(root))
    at = new_app(cat_sample="tiny").run()
    at = open_page(at, "decode", dec_model="Your model (a transformers checkpoint folder on the server)",
                   dec_model_path="mine", dec_beam=4, dec_batch=2, dec_timing="quick")
    assert_clean(at)
    assert at.text_input(key="dec_offsets").value == "2, 6, 10"
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    assert not errors(at), errors(at)
    res = at.session_state["decode_runs"]
    assert set(res["runs"]) == {"filter-first", "score-first"} and not res["random"]
    for run in res["runs"].values():
        rows = run.result.item_rows
        assert rows.shape == (2, 4) and bool((rows >= 0).all())  # 12 items, beam 4: every beam an item
    top = at.dataframe[0].value
    assert len(top) == 4 and (top["filter-first log-prob"] >= top["score-first log-prob"] - 1e-4).all()
    # a folder outside the data roots is refused in one line
    at.text_input(key="dec_model_path").set_value(str(tmp_path)).run()
    assert any("no transformers checkpoint" in e for e in errors(at))


def test_decode_says_when_a_run_was_interrupted():
    at = new_app(cat_sample="tiny").run()
    # what a run leaves behind when the user switches page before it finishes
    open_page(at, "decode", decode_pending={"beam": 3})
    assert_clean(at)
    assert any("The last decode was interrupted" in w.value for w in at.warning)
    at.run()
    assert not any("interrupted" in w.value for w in at.warning)  # said once


def test_two_sessions_on_different_catalogs_keep_their_own_index():
    # Two browser sessions alive at once, their runs interleaved (AppTest runs one script at a
    # time per process, so the sessions take turns as a server's threads would).
    a = open_page(new_app(cat_sample="tiny").run(), "index")
    b = open_page(new_app(cat_sample="watch-like-small").run(), "index")
    assert_clean(a)
    assert_clean(b)
    slots_a, slots_b = a.session_state["resource_slots"], b.session_state["resource_slots"]
    assert slots_a is not slots_b
    index_a, index_b = slots_a.peek("index"), slots_b.peek("index")
    assert index_a.n_items == 12 and index_b.n_items == 20_000
    for at in (a, b, a):
        at.run()
        assert_clean(at)
    # neither evicted nor released the other's index: same objects, nothing released
    assert slots_a.peek("index") is index_a and slots_b.peek("index") is index_b
    assert slots_a.releases == 0 and slots_b.releases == 0


# ---------------------------------------------------------------------------- benchmarks, gpu, rebuild
def test_benchmarks_page_shows_recorded_results(tmp_path, monkeypatch):
    doc = dict(format="zerogr-bench/1", env=dict(gpu="NVIDIA H200", driver="580.159", torch="2.11.0"),
               run_command="python -m zerogr_core bench", started="2026-11-29T10:00:00+00:00",
               updated="2026-11-29T10:30:00+00:00", finished=True, records=[dict(method="zerogr", batch=1)])
    (tmp_path / "run.json").write_text(json.dumps(doc))
    monkeypatch.setattr(benchview, "RESULTS_DIR", tmp_path)
    at = new_app().run()
    open_page(at, "benchmarks")
    assert_clean(at)
    if not torch.cuda.is_available():
        note = " ".join(i.value for i in at.info)
        assert "recorded results, not measured now" in note and "NVIDIA H200" in note and "2026-11-29" in note
    assert at.dataframe[0].value["gpu"][0] == "NVIDIA H200"


def test_benchmarks_page_without_results(tmp_path, monkeypatch):
    monkeypatch.setattr(benchview, "RESULTS_DIR", tmp_path / "empty")
    at = new_app().run()
    open_page(at, "benchmarks")
    assert_clean(at)
    assert any("No recorded results" in w.value for w in at.warning)


def test_benchmarks_page_with_the_committed_results():
    at = new_app().run()
    open_page(at, "benchmarks")
    assert_clean(at)
    labels = [t.label for t in at.tabs]
    assert labels and all(label.endswith("?") for label in labels), labels  # one question per chart
    assert len(at.get("plotly_chart")) == len(labels)
    headline = at.dataframe[0].value
    assert "command" not in headline.columns  # the result-file table is not at the top
    assert not headline.isna().any().any() and "None" not in headline.astype(str).values


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU message")
def test_gpu_page_says_there_is_no_gpu():
    at = new_app().run()
    open_page(at, "gpu")
    assert_clean(at)
    assert any("No GPU on this machine" in i.value for i in at.info)
    assert "Index in host memory" in metrics(at)


def test_rebuild_page():
    at = new_app(cat_sample="watch-like-small").run()
    open_page(at, "rebuild", reb_beam=2, reb_batch=1, reb_seconds=0.2, reb_add=10.0, reb_remove=5.0)
    assert_clean(at)
    at.button(key="btn_reb_run").click().run()
    assert_clean(at)
    m = metrics(at)
    assert m["Items"] == "21,000"
    if not torch.cuda.is_available():
        assert m["Copy to the GPU"] == "— (CPU: nothing to copy)"
    else:
        assert m["Copy to the GPU"].endswith("GB/s")
    table = at.dataframe[0].value
    assert list(table["phase"]) == ["before", "during", "after"] and (table["decodes"] > 0).all()
    assert len(at.get("plotly_chart")) == 2


# ---------------------------------------------------------------------------- the guard
@pytest.mark.parametrize("exc,shown", [
    (RuntimeError("kaboom\nwith a second line"), "Something went wrong: RuntimeError: kaboom."),
    (getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)("CUDA out of memory. Tried to allocate 80 GiB"),
     "Out of memory: the GPU could not hold this run. Try a smaller batch or beam width"),
])
def test_errors_become_a_short_box_never_a_stack_trace(monkeypatch, exc, shown):
    import zerogr_core.app_support.density as density

    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr(density, "beam_weighted_density", broken)
    at = new_app(cat_sample="tiny").run()
    open_page(at, "density", den_beam=2, den_batch=1)
    assert not at.exception
    msgs = errors(at)
    assert len(msgs) == 1 and msgs[0].startswith(shown), msgs
    assert "Traceback" not in msgs[0] and "second line" not in msgs[0]
    open_page(at, "index")  # the app keeps running
    assert_clean(at)


def test_user_errors_show_their_one_line_message(monkeypatch):
    import zerogr_core.app_support.rebuild as rebuild
    from zerogr_core.errors import ZeroGRError

    def refuse(*args, **kwargs):
        raise ZeroGRError("cannot add 9 items: the codebooks hold only 4 distinct SIDs")

    monkeypatch.setattr(rebuild, "refresh_catalog", refuse)
    at = new_app(cat_sample="tiny").run()
    open_page(at, "rebuild")
    at.button(key="btn_reb_run").click().run()
    assert not at.exception
    assert errors(at) == ["cannot add 9 items: the codebooks hold only 4 distinct SIDs"]


def test_every_page_renders_by_default():
    at = new_app().run()
    for name in ("catalog", "density", "index", "decode", "benchmarks", "gpu", "rebuild"):
        open_page(at, name, den_beam=4, den_batch=2)
        assert_clean(at)
        assert at.title[0].value.lower() == name.lower() or at.title[0].value == "GPU"
    assert "ZeroGR" in at.sidebar.markdown[0].value


# ---------------------------------------------------------------------------- decode: LLM scale, item sets
QWEN3 = "Qwen3 architecture, LLM scale (random weights: latency only, overlap is meaningless)"


@pytest.mark.reference_kernels
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU page's defaults and refusal; on a GPU see "
                    "test_app_gpu.py::test_the_qwen3_1_7b_shape_compares_the_orders_as_the_decode_page_does")
def test_decode_the_tiny_qwen3_in_both_orders_and_refuse_the_1_7b_shape_on_a_cpu():
    pytest.importorskip("transformers")
    at = new_app(cat_sample="tiny").run()
    at = open_page(at, "decode", dec_model=QWEN3, dec_beam=4, dec_batch=2, dec_context=40, dec_timing="quick")
    assert_clean(at)
    assert at.selectbox(key="dec_llm_shape").value == "tiny"  # the CPU default
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    assert not errors(at), errors(at)
    res = at.session_state["decode_runs"]
    assert res["random"] and res["cfg"]["llm"].shape == "tiny" and res["cfg"]["dtype"] == "float32"
    assert res["prefill_ms"] > 0 and res["weight_bytes"] > 0
    for order, run in res["runs"].items():
        rows = run.result.item_rows
        assert rows.shape == (2, 4) and bool((rows >= 0).all()), order  # 12 items, beam 4: every beam an item
        assert len(res["latency"][order].samples_ms) >= 3
    # the page's beams are the library's: the same shape, weights and contexts, decoded directly
    from zerogr_core import Decoder, build_index
    from zerogr_core.app_support.llm_model import build_llm, llm_inputs
    from zerogr_core.app_support.sources import load_source, sample_source

    catalog = load_source(sample_source("tiny"))
    spec = res["cfg"]["llm"]
    model, preset = build_llm(spec.shape, spec.dtype, catalog.codebook_sizes, "cpu")
    inputs = llm_inputs(model, preset, spec, "cpu", 2, 4, res["cfg"]["seed"])
    for order, run in res["runs"].items():
        direct = Decoder(build_index(catalog), inputs.heads, 4, order=order, band_offsets=inputs.band_offsets,
                         engine="reference").decode(inputs.hidden_fn, 2)
        assert torch.equal(direct.item_rows, run.result.item_rows), order
        torch.testing.assert_close(direct.scores, run.result.scores, rtol=1e-5, atol=1e-5)
    shown = metrics(at)
    assert "Prefill (both orders' requests)" in shown and shown["GPU memory peak"] == "no GPU"
    assert any("Latency only: random weights, overlap is meaningless" in w.value for w in at.warning)
    # a context the shape cannot hold is refused in one line
    at.number_input(key="dec_context").set_value(5000).run()
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    assert [e for e in errors(at) if e.startswith("context length: 5,000 tokens do not fit the tiny shape")], errors(at)
    at.number_input(key="dec_context").set_value(40).run()
    # the 1.7B shape is refused on a CPU in one line, before any weights are built
    at.selectbox(key="dec_llm_shape").set_value("qwen3-1.7b").run()
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    msgs = errors(at)
    assert len(msgs) == 1 and msgs[0].startswith("model qwen3-1.7b:") and "over this machine's limit" in msgs[0], msgs
    assert "\n" not in msgs[0]


def test_decode_restricted_to_the_cold_start_items():
    at = new_app(cat_sample="search-like-small").run()
    at = open_page(at, "decode", dec_beam=8, dec_batch=2, dec_hidden=16, dec_timing="quick",
                   dec_item_set="cold", dec_cold_share=5.0, dec_cold_seed=3)
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    assert not errors(at), errors(at)
    res = at.session_state["decode_runs"]
    from zerogr_core.app_support.sources import load_source, sample_source
    from zerogr_core.recsys.cold_items import cold_item_set

    catalog = load_source(sample_source("search-like-small"))
    expected = np.sort(catalog.rows_of(cold_item_set(catalog, 0.05, 3)))
    assert np.array_equal(res["set_rows"], expected) and expected.size == 2500  # its own sub-catalog index
    for order, run in res["runs"].items():
        rows = run.result.item_rows.cpu().numpy()
        assert rows.shape == (2, 8) and (rows >= 0).all() and np.isin(rows, expected).all(), order
    # the two orders, both constrained to the set: overlap and latency are on the page
    shown = metrics(at)
    assert any(label.startswith("Lists that agree") for label in shown)
    assert "filter-first latency (median)" in shown and "score-first latency (median)" in shown
    assert any("Both orders constrained to 2,500 cold-start items" in i.value and "filter-first **16** of 16"
               in i.value for i in at.info)
    # the set changes the lists: unrestricted, some returned item lies outside it
    at.selectbox(key="dec_item_set").set_value("all").run()
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    free = at.session_state["decode_runs"]
    assert free["set_rows"] is None
    rows = free["runs"]["filter-first"].result.item_rows.cpu().numpy()
    assert not np.isin(rows, expected).all()


@needs_movielens
@pytest.mark.reference_kernels  # the CPU deployment's path (the interpreted list kernel is slow)
def test_decode_the_bundled_model_on_cold_items_with_each_history_excluded():
    at = new_app().run()
    at = open_page(at, "decode", dec_beam=8, dec_batch=3, dec_timing="quick", dec_exclude=True,
                   dec_item_set="cold", dec_cold_share=5.0, dec_cold_seed=0)
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    assert not errors(at), errors(at)
    res = at.session_state["decode_runs"]
    rows_in_set = res["set_rows"]
    assert rows_in_set is not None and 0 < rows_in_set.size < 1024  # kept as rows (no sub-catalog index)
    for order, run in res["runs"].items():
        rows = run.result.item_rows.cpu().numpy()
        assert (rows >= 0).all() and np.isin(rows, rows_in_set).all(), order
        for request, history in enumerate(res["histories"]):
            assert not np.isin(rows[request], history).any(), order  # each history denied by id within the set
    assert any("returned beams that are already in the history: filter-first **0**" in c.value for c in at.caption)
