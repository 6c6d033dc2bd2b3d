"""AppTest (streamlit.testing.v1) of the Decode page: both decode orders on the bundled MovieLens
and Beauty models, a test user, a random head, your own transformers checkpoint, interrupted runs,
two sessions at once, the Qwen3 architecture at LLM scale, and decodes restricted to an item set.

Decodes use the app's reference path, so they stay fast even with TRITON_INTERPRET=1. The shared
helpers are in tests/app_harness.py.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from app_harness import assert_clean, errors, metrics, needs_movielens, new_app, open_page


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


def test_a_refused_run_is_not_called_interrupted():
    """A run refused in one line (a context that does not fit the shape, a decode over the work limit) left the
    pending marker behind: the next rerun warned 'The last decode was interrupted (the page was left before it
    finished)', though the page was never left. Now the refusal is all the page says."""
    qwen3 = "Qwen3 architecture, LLM scale (random weights: latency only, overlap is meaningless)"
    at = open_page(new_app(cat_sample="tiny").run(), "decode", dec_model=qwen3, dec_context=4094, dec_beam=2,
                   dec_batch=1, dec_timing="quick")
    at.button(key="btn_dec_run").click().run()
    assert len(errors(at)) == 1 and "context length: 4,094 tokens do not fit" in errors(at)[0], errors(at)
    assert "decode_pending" not in at.session_state
    at.run()
    assert_clean(at)
    assert not any("interrupted" in w.value for w in at.warning), [w.value for w in at.warning]


def test_a_prefill_over_the_token_limit_is_refused_before_any_work():
    # 128 contexts of 4,000 tokens: 512,000 tokens, twice the limit (about 6 s and 3 GB for the tiny shape on a CPU)
    qwen3 = "Qwen3 architecture, LLM scale (random weights: latency only, overlap is meaningless)"
    at = open_page(new_app(cat_sample="tiny").run(), "decode", dec_model=qwen3, dec_context=4000, dec_beam=2,
                   dec_batch=128, dec_timing="quick")
    at.button(key="btn_dec_run").click().run()
    assert errors(at) == ["batch 128 × context 4,000 is 512,000 context tokens to prefill, over the limit of "
                          "262,144: lower the batch or the context"], errors(at)
    assert "decode_runs" not in at.session_state


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
    assert at.checkbox(key="dec_llm_fp8").disabled  # FP8 projections need bfloat16, a GPU's
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


@pytest.mark.parametrize("page,state,expected", [
    ("decode", dict(dec_beam=1024, dec_batch=1024, dec_hidden=64), "batch × beam: 1024 × 1024 beams is over the 65,536"),
    ("decode", dict(dec_beam=1024, dec_batch=64, dec_hidden=8192), "hidden-state values per step, over this"),
    ("density", dict(den_beam=1024, den_batch=256, den_hidden=4096), "batch × beam: 256 × 1024 beams is over the 65,536"),
    ("rebuild", dict(reb_beam=1024, reb_batch=1024), "batch × beam: 1024 × 1024 beams is over the 65,536"),
])
def test_beams_and_hidden_states_are_bounded_on_a_small_catalog(page, state, expected):
    """On the 12-item catalog, 1,024 × 1,024 beams of hidden size 8,192 passed the logits check (12 tokens a beam)
    and the random head asked for 34 GB: 'Something went wrong: RuntimeError: ... can't allocate memory'. Now a
    one-line refusal naming the batch, the beam width and the hidden size, before any work."""
    at = open_page(new_app(cat_sample="tiny").run(), page, dec_timing="quick", **state)
    button = {"decode": "btn_dec_run", "rebuild": "btn_reb_run"}.get(page)
    if button:
        at.button(key=button).click().run()
    assert_clean(at)
    msgs = errors(at)
    assert len(msgs) == 1 and expected in msgs[0], msgs
    assert "decode_runs" not in at.session_state and "rebuild_report" not in at.session_state


def test_overlap_is_measured_at_most_at_the_length_of_the_lists():
    """A cold set of one item and K = 4: the page said 'overlap@4 25.0 %' beside 'Requests whose top-4 differs
    0 %' (the three empty places of each list counted as disagreement); now K is the lists' length, 1."""
    at = new_app(cat_sample="tiny").run()
    at = open_page(at, "decode", dec_beam=4, dec_batch=2, dec_hidden=8, dec_timing="quick", dec_k=4,
                   dec_item_set="cold", dec_cold_share=0.01)
    at.button(key="btn_dec_run").click().run()
    assert_clean(at)
    assert not errors(at), errors(at)
    for run in at.session_state["decode_runs"]["runs"].values():
        assert ((run.result.item_rows >= 0).sum(dim=1) == 1).all()  # one item in the set
    shown = metrics(at)
    assert shown["Lists that agree (overlap@1)"] == "100.0 %" and shown["Requests whose top-1 differs"] == "0 %"


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
