"""AppTest (streamlit.testing.v1) of the Density, Index, Benchmarks, GPU and Rebuild pages, and the
error guard (no stack trace ever reaches the page).

The Catalog page is tested in tests/test_app_catalog.py, the Decode page in tests/test_app_decode.py;
the shared helpers are in tests/app_harness.py.
"""
from __future__ import annotations

import json

import pytest
import torch

from app_harness import assert_clean, errors, metrics, needs_movielens, new_app, open_page
from zerogr_core.app_support import benchview


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


def test_benchmarks_page_draws_once_per_session_until_a_result_file_changes(tmp_path, monkeypatch):
    doc = dict(format="zerogr-bench/1", env=dict(gpu="NVIDIA H200"), records=[dict(method="zerogr", batch=1)])
    (tmp_path / "run.json").write_text(json.dumps(doc))
    monkeypatch.setattr(benchview, "RESULTS_DIR", tmp_path)
    drawn = []
    real = benchview.figures_of
    monkeypatch.setattr(benchview, "figures_of", lambda records: drawn.append(len(records)) or real(records))
    at = new_app().run()
    open_page(at, "benchmarks")
    at.run()
    open_page(at, "catalog")
    open_page(at, "benchmarks")
    assert drawn == [1]
    doc["records"].append(dict(method="static", batch=1))
    (tmp_path / "run.json").write_text(json.dumps(doc))  # a new size: the file changed
    at.run()
    assert_clean(at)
    assert drawn == [1, 2]
    other = new_app().run()  # another session draws its own
    open_page(other, "benchmarks")
    assert drawn == [1, 2, 2]


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
    assert not any("settings changed" in c.value for c in at.caption)


def changed_notes(at) -> list[str]:
    return [c.value for c in at.caption if "settings changed since this run" in c.value]


def test_rebuild_page_says_when_the_settings_changed_since_the_result_shown():
    """Changing a refresh setting after a run left the old result up with no note (the Decode page says the
    settings changed); now the Rebuild page says so the same way, for the rebuild and the live changes."""
    at = open_page(new_app(cat_sample="tiny").run(), "rebuild", reb_beam=2, reb_batch=1, reb_seconds=0.1,
                   reb_live_seconds=0.5, reb_live_every=0.25)
    at.button(key="btn_reb_run").click().run()
    at.button(key="btn_live_run").click().run()
    assert_clean(at)
    assert not changed_notes(at)
    at.number_input(key="reb_add").set_value(20.0).run()
    assert changed_notes(at) == ["The settings changed since this run; press **Refresh and rebuild while decoding** "
                                 "to update."]
    at.number_input(key="reb_add").set_value(5.0).run()  # back to the settings of the run shown
    assert not changed_notes(at)
    at.number_input(key="reb_live_share").set_value(2.0).run()
    assert changed_notes(at) == ["The settings changed since this run; press **Run live changes while decoding** "
                                 "to update."]


def test_every_setting_keeps_its_value_across_pages():
    """The Rebuild page's live-change settings had keys outside PERSISTENT_PREFIXES: 0.5 s / 0.1 s / 10 % set,
    another page opened, and back they read 3 s / 1 s / 1 % beside the result they ran. Now every widget with
    a value (buttons and the uploader have none to keep) is kept, on every page."""
    from pages._common import PERSISTENT_PREFIXES

    at = new_app(cat_sample="tiny").run()
    for name in ("catalog", "density", "index", "decode", "benchmarks", "gpu", "rebuild"):
        open_page(at, name, den_beam=4, den_batch=2)
        for kind in ("number_input", "text_input", "selectbox", "radio", "checkbox", "slider", "text_area"):
            for widget in at.get(kind):
                assert widget.key and widget.key.startswith(PERSISTENT_PREFIXES), (name, kind, widget.key)
    settings = dict(reb_live_seconds=0.5, reb_live_every=0.1, reb_live_share=10.0)
    for key, value in settings.items():
        at.number_input(key=key).set_value(value)
    at.run()
    open_page(at, "catalog")
    open_page(at, "rebuild")
    assert_clean(at)
    assert {key: at.number_input(key=key).value for key in settings} == settings


# ---------------------------------------------------------------------------- the guard
@pytest.mark.parametrize("exc,shown", [
    (RuntimeError("kaboom\nwith a second line"), "Something went wrong: RuntimeError: kaboom."),
    (getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)("CUDA out of memory. Tried to allocate 80 GiB"),
     "Out of memory: the GPU could not hold this run. Try a smaller batch or beam width"),
    # torch's host allocator: was 'Something went wrong: RuntimeError: [enforce fail at alloc_cpu.cpp:127] …'
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 34359738368 bytes. Error code 12 (Cannot allocate memory)"),
     "Out of memory: this machine's memory could not hold this run. Try a smaller batch or beam width"),
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
