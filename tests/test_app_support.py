"""Unit tests of zerogr_core.app_support: the app's non-UI helpers."""
from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from zerogr_core import Catalog, Decoder, build_index
from zerogr_core.app_support import benchview, gpu
from zerogr_core.recsys import movielens
from zerogr_core.app_support.density import beam_weighted_density, histogram_counts, total_waste
from zerogr_core.app_support.profile import STAGES, comparison, k_values, profiled_decode
from zerogr_core.app_support.rebuild import rebuild_while_decoding, refresh_catalog
from zerogr_core.decode.random_requests import random_heads, random_hidden_fn
from zerogr_core.app_support.resources import ResourceSlots, is_host_out_of_memory, release_object
from zerogr_core.errors import is_out_of_memory
from zerogr_core.app_support.sources import (CatalogSource, load_source, parse_codebook_sizes, sample_source,
                                             server_file_source, stage_upload)
from zerogr_core.catalog.samples import tiny_catalog
from zerogr_core.catalog.synth import generate
from zerogr_core.errors import CatalogError, ZeroGRError


# ---------------------------------------------------------------------------- resources
class _Engine:
    def __init__(self):
        self.released = 0

    def release(self):
        self.released += 1


class _Decoder:
    def __init__(self):
        self.gpu_engine = _Engine()


def test_slots_build_outside_the_lock():
    slots = ResourceSlots()
    building, done = threading.Event(), threading.Event()

    def slow():
        building.set()
        assert done.wait(10)
        return "slow"

    worker = threading.Thread(target=lambda: slots.get("index", "a", slow))
    worker.start()
    assert building.wait(10)
    # while one factory runs, the slots answer other callers at once
    assert slots.get("decoders", "b", lambda: "quick") == "quick" and slots.peek("index") is None
    done.set()
    worker.join(10)
    assert slots.peek("index") == "slow"


def test_slots_reuse_and_release_on_replace():
    slots = ResourceSlots()
    first = slots.get("decoders", ("a",), _Decoder)
    assert slots.get("decoders", ("a",), _Decoder) is first
    assert first.gpu_engine.released == 0
    second = slots.get("decoders", ("b",), _Decoder)
    assert second is not first
    assert first.gpu_engine.released == 1          # the replaced decoder's engine was released
    assert slots.key("decoders") == ("b",) and slots.releases == 1
    assert slots.drop_all() == 1 and second.gpu_engine.released == 1
    assert slots.peek("decoders") is None


def test_release_object_walks_containers_and_never_fails_the_slot():
    decs = {"x": _Decoder(), "y": [_Decoder()]}
    release_object(decs)
    assert decs["x"].gpu_engine.released == 1 and decs["y"][0].gpu_engine.released == 1
    slots = ResourceSlots()

    def boom(_):
        raise RuntimeError("release failed")

    slots.get("s", 1, object, release=boom)
    slots.get("s", 2, object, release=boom)  # the failing release must not propagate
    assert slots.key("s") == 2


def test_is_out_of_memory():
    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    assert is_out_of_memory(oom("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not is_out_of_memory(ValueError("bad value"))
    host = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                        "you tried to allocate 34359738368 bytes. Error code 12 (Cannot allocate memory)")
    assert is_out_of_memory(host) and is_host_out_of_memory(host) and is_host_out_of_memory(MemoryError())
    assert not is_host_out_of_memory(oom("CUDA out of memory")) and not is_host_out_of_memory(ValueError("x"))


# ---------------------------------------------------------------------------- sources
def test_stage_upload_limits_and_types(tmp_path):
    data = b"item_id,s1,s2\n1,0,0\n2,0,1\n"
    with pytest.raises(CatalogError, match="over the upload limit of"):
        stage_upload("big.csv", data, max_bytes=10, folder=tmp_path)
    with pytest.raises(CatalogError, match="file is empty"):
        stage_upload("empty.csv", b"", max_bytes=100, folder=tmp_path)
    with pytest.raises(CatalogError, match="unsupported file type '.xlsx'"):
        stage_upload("sheet.xlsx", data, max_bytes=100, folder=tmp_path)
    src = stage_upload("ok.csv", data, max_bytes=100, folder=tmp_path)
    assert src.kind == "upload" and src.name == "ok.csv" and len(src.fingerprint) == 16
    assert load_source(src).n_items == 2
    assert stage_upload("ok.csv", data, max_bytes=100, folder=tmp_path) == src  # same content, same source


def test_staged_uploads_live_in_a_private_folder_and_are_bounded(tmp_path, monkeypatch):
    import stat

    from zerogr_core.app_support import sources

    monkeypatch.setattr(sources, "_staging", None)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    src = stage_upload("ok.csv", b"item_id,s1\n1,0\n", max_bytes=100)
    folder = Path(src.path).parents[1]
    assert folder.parent == tmp_path and folder.name.startswith("zerogr-uploads-")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700                 # no other user can plant a file
    Path(src.path).write_bytes(b"item_id,s1\n9,9\n")                  # a changed copy is written again
    assert stage_upload("ok.csv", b"item_id,s1\n1,0\n", max_bytes=100) == src
    assert load_source(src).n_items == 1 and Path(src.path).read_bytes() == b"item_id,s1\n1,0\n"
    kept = [stage_upload(f"f{i}.csv", f"item_id,s1\n{i},0\n".encode(), max_bytes=100)
            for i in range(sources.MAX_STAGED_UPLOADS + 3)]
    assert len(list(folder.iterdir())) == sources.MAX_STAGED_UPLOADS
    assert Path(kept[-1].path).is_file() and not Path(src.path).exists()


def test_upload_errors_name_the_uploaded_file_not_the_staged_copy(tmp_path):
    src = stage_upload("mine.csv", b"item_id,s1,s2\n1,0,0\n2,0,-3\n", max_bytes=1000, folder=tmp_path)
    with pytest.raises(CatalogError) as info:
        load_source(src)
    assert str(info.value) == "mine.csv, row 2, column 's2': negative token -3"


def test_server_file_source(tmp_path):
    roots = [tmp_path.resolve()]
    (tmp_path / "folder.csv").mkdir()
    with pytest.raises(CatalogError, match="no catalog file at that path") as missing:
        server_file_source(str(tmp_path / "nope.csv"), roots)
    with pytest.raises(CatalogError) as folder:
        server_file_source(str(tmp_path / "folder.csv"), roots)
    assert str(folder.value) == str(missing.value)  # a folder reads like a missing file
    with pytest.raises(CatalogError, match="give the path"):
        server_file_source("   ", roots)
    path = tmp_path / "cat.tsv"
    path.write_text("item_id\ts1\ts2\n7\t1\t2\n8\t1\t3\n")
    src = server_file_source(f"  {path}  ", roots, on_duplicate="collision")
    assert src.kind == "file" and src.on_duplicate == "collision" and src.name == str(path)
    assert load_source(src).item_ids.tolist() == [7, 8]
    assert server_file_source("cat.tsv", roots).path == src.path  # relative to a root


def test_parse_codebook_sizes():
    assert parse_codebook_sizes("") is None
    assert parse_codebook_sizes("256, 256 64") == (256, 256, 64)
    with pytest.raises(CatalogError, match="codebook size 2"):
        parse_codebook_sizes("4, x")
    with pytest.raises(CatalogError, match="must be ≥ 1"):
        parse_codebook_sizes("4 0")


def test_sample_sources_load():
    tiny = load_source(sample_source("tiny"))
    assert tiny.n_items == 12 and tiny.codebook_sizes == (4, 4, 4)
    with pytest.raises(ZeroGRError, match="unknown bundled catalog"):
        sample_source("nope")
    assert CatalogSource("sample", "movielens").is_movielens


def test_movielens_missing_checkpoint_is_one_clear_message(monkeypatch, tmp_path):
    monkeypatch.setenv(movielens.CHECKPOINT_ENV, str(tmp_path / "absent.pt"))
    assert not movielens.available()
    with pytest.raises(ZeroGRError, match="bundled MovieLens recommender"):
        movielens.bundled_catalog()


def test_beauty_missing_checkpoint_is_one_clear_message(monkeypatch, tmp_path):
    from zerogr_core.recsys import beauty

    monkeypatch.setenv(beauty.CHECKPOINT_ENV, str(tmp_path / "absent.pt"))
    assert not beauty.available()
    with pytest.raises(ZeroGRError, match="bundled Amazon Beauty recommender"):
        beauty.bundled_study()
    (tmp_path / "other.pt").write_bytes(b"not a checkpoint")
    monkeypatch.setenv(beauty.CHECKPOINT_ENV, str(tmp_path / "other.pt"))
    with pytest.raises(ZeroGRError, match="other.pt: not a readable checkpoint"):
        beauty.bundled_study()


def test_beauty_model_decodes_the_app_catalog_through_its_step_model():
    """The app's Beauty sample catalog is the bundled T5's; its test users decode through the
    step model (KV cache) to the same beams as the recomputing hidden_fn."""
    pytest.importorskip("transformers")
    from zerogr_core.recsys import beauty
    from zerogr_core.app_support.requests import study_inputs

    if not beauty.available():
        pytest.skip("the bundled Beauty checkpoint is missing")
    study = beauty.bundled_study("cpu")
    catalog = load_source(sample_source("amazon-beauty"))
    assert np.array_equal(catalog.sids, study.catalog.sids) and catalog.codebook_sizes == study.catalog.codebook_sizes
    users = beauty.test_users(study)
    assert users.n_users == 22363 and users.user_ids[0] == 0 and len(users.histories[0]) == 5
    rows = users.sample(3, seed=1)
    index = build_index(catalog)
    beam = 8
    cached = study_inputs(study, users, rows, "cpu", beam, name="amazon-beauty")
    plain = study.model.hidden_fn_for(users.pick(rows)[0], study.sids)
    assert cached.model_key == ("amazon-beauty", "cpu") and cached.targets.tolist() == users.targets[rows].tolist()
    for order in ("filter-first", "score-first"):
        decoder = Decoder(index, cached.heads, beam, order=order)
        a, b = decoder.decode(cached.hidden_fn, 3), decoder.decode(plain, 3)
        assert torch.equal(a.item_rows, b.item_rows), order
        torch.testing.assert_close(a.scores, b.scores, atol=1e-4, rtol=1e-5)


# ---------------------------------------------------------------------------- decoding
@pytest.fixture(scope="module")
def small():
    catalog = generate("search-like", 600, seed=3)
    return catalog, build_index(catalog)


@pytest.mark.parametrize("order", ["filter-first", "score-first"])
def test_profiled_decode_matches_the_decoder(small, order):
    catalog, index = small
    heads, bands = random_heads(catalog, 16, seed=0)
    fn = random_hidden_fn(2, 16, catalog.codebook_sizes, seed=1)
    run = profiled_decode(index, heads, 3, order, fn, 2, band_offsets=bands)
    ref = Decoder(index, heads, 3, order=order, band_offsets=bands).decode(fn, 2)
    assert torch.equal(run.result.tokens, ref.tokens)
    assert torch.equal(run.result.item_rows, ref.item_rows)
    torch.testing.assert_close(run.result.scores, ref.scores, rtol=1e-4, atol=1e-4)
    stages = {r["stage"] for r in run.stage_ms}
    assert stages == set(STAGES)
    assert {r["step"] for r in run.per_step()} == set(range(1, catalog.n_levels + 1))
    assert run.total_ms > 0 and len(run.states) == catalog.n_levels
    assert run.states[0].tolist() == [0, 0]


def test_comparison_metrics(small):
    catalog, index = small
    heads, bands = random_heads(catalog, 16, seed=0)
    fn = random_hidden_fn(3, 16, catalog.codebook_sizes, seed=2)
    a = profiled_decode(index, heads, 5, "filter-first", fn, 3, band_offsets=bands)
    same = comparison(a, a, [1, 5], targets=a.result.item_rows[:, 0].numpy())
    assert same["overlap"] == {1: 1.0, 5: 1.0}
    assert same["recall_a"][1] == 1.0 and same["share_differ"][5] == 0.0
    assert k_values(128) == [1, 5, 10, 20, 50, 128] and k_values(7) == [1, 5, 7]


def test_random_heads_follow_the_catalog_layout():
    shared = generate("search-like", 300, seed=0)
    head, bands = random_heads(shared, 8, "bfloat16")
    assert isinstance(head, torch.Tensor) and bands == shared.band_offsets and head.dtype == torch.bfloat16
    tiny = tiny_catalog()
    heads, bands = random_heads(tiny, 8)
    assert bands is None and [h.shape for h in heads] == [(4, 8)] * 3
    fn = random_hidden_fn(2, 8, tiny.codebook_sizes)
    assert fn(0, torch.empty(2, 1, 0, dtype=torch.int64)).shape == (2, 1, 8)
    assert fn(2, torch.tensor([[[0, 1], [-1, -1], [3, 3]]] * 2)).shape == (2, 3, 8)
    with pytest.raises(ZeroGRError):
        random_heads(tiny, 0)


# ---------------------------------------------------------------------------- density
def test_beam_weighted_density_by_hand():
    tiny = tiny_catalog()
    # tiny: 4 top tokens; after token 0: 3 children, after 1: 2, after 2: 2, after 3: 1.
    states = [torch.tensor([0]), torch.tensor([0, 1, -1]), torch.tensor([-1, -1])]
    rows = beam_weighted_density(tiny, states)
    assert rows[0]["beam_density"] == 1.0 and rows[0]["wasted_share"] == 0.0
    assert rows[1]["active_beams"] == 2 and rows[1]["valid_logits"] == 3 + 2
    assert rows[1]["beam_density"] == pytest.approx(5 / 8)
    assert rows[2]["active_beams"] == 0 and np.isnan(rows[2]["beam_density"])
    assert total_waste(rows) == pytest.approx(1 - 9 / 12)
    shared = beam_weighted_density(tiny, states, projected_rows=[12, 12, 12])
    assert shared[0]["wasted_share"] == pytest.approx(1 - 4 / 12)


def test_histogram_counts_exact_and_binned():
    values, counts = histogram_counts(np.array([1, 1, 2, 5]))
    assert values.tolist() == [1, 2, 5] and counts.tolist() == [2, 1, 1]
    values, counts = histogram_counts(np.arange(1, 1001), max_bins=10)
    assert counts.sum() == 1000 and len(values) <= 10


# ---------------------------------------------------------------------------- rebuild
def test_refresh_catalog_adds_and_removes():
    catalog = generate("watch-like", 2000, seed=1)
    fresh, change = refresh_catalog(catalog, 0.1, 0.05, seed=0)
    assert change == dict(removed=100, added=200, items_before=2000, items_after=2100)
    assert fresh.codebook_sizes == catalog.codebook_sizes and fresh.n_items == 2100
    assert len(np.unique(fresh.sids, axis=0)) == fresh.n_items
    assert np.setdiff1d(fresh.item_ids, catalog.item_ids).min() > catalog.item_ids.max()
    same, change = refresh_catalog(catalog, 0, 0)
    assert change["added"] == change["removed"] == 0 and np.array_equal(same.sids, catalog.sids)
    with pytest.raises(ZeroGRError, match="between 0 and 1"):
        refresh_catalog(catalog, 1.5, 0)
    full = Catalog.from_sids([[0, 0], [0, 1], [1, 0], [1, 1]], (2, 2))
    with pytest.raises(ZeroGRError, match="cannot add"):
        refresh_catalog(full, 0.5, 0)


def test_rebuild_while_decoding_on_cpu():
    catalog = generate("search-like", 3000, seed=2)
    calls = []

    def decode_once(index):
        calls.append(index)
        time.sleep(0.002)

    report = rebuild_while_decoding(catalog, decode_once, before=3, after=2, min_seconds=0.05)
    assert len(report.before_ms) == 3 and len(report.after_ms) == 2 and report.during_ms
    assert report.builds and report.rebuild_s > 0 and report.h2d_gbps is None
    assert report.index.n_items == 3000 and calls[-1] is report.index
    phases = {r["phase"]: r for r in report.latency_rows()}
    assert phases["before"]["decodes"] == 3 and phases["during"]["p99_ms"] >= phases["during"]["p50_ms"]


def test_h2d_rate_from_build_records():
    from zerogr_core.app_support.rebuild import RebuildReport

    report = RebuildReport("cuda", "layout", builds=[dict(total_s=1.0, fill_s=0.5, h2d_tail_s=0.5, h2d_bytes=2e9)])
    assert report.h2d_gbps == pytest.approx(2.0)
    report.builds = [dict(total_s=1.0, h2d_s=0.25, h2d_bytes=1e9)]
    assert report.h2d_gbps == pytest.approx(4.0)


# ---------------------------------------------------------------------------- bench, gpu
def test_benchview_reads_result_files(tmp_path):
    doc = dict(format="zerogr-bench/1", env=dict(gpu="NVIDIA H200", driver="580", torch="2.11"),
               run_command="python -m zerogr_core bench", started="2026-11-30T01:00:00+00:00",
               updated="2026-11-30T01:05:00+00:00", finished=True, records=[dict(method="zerogr", ms=1.0)])
    (tmp_path / "run.json").write_text(json.dumps(doc))
    (tmp_path / "other.json").write_text(json.dumps({"format": "something-else"}))
    (tmp_path / "broken.json").write_text("{")
    files = benchview.result_files(tmp_path)
    assert len(files) == 1 and files[0]["gpu"] == "NVIDIA H200" and files[0]["records"] == 1
    assert benchview.load_records(tmp_path)[0]["method"] == "zerogr"
    assert benchview.result_files(tmp_path / "absent") == []
    assert all(name.startswith("figure_") for name, _ in benchview.figure_builders())
    assert benchview.title_of("figure_speedup_curves") == "Speedup curves"


def test_gpu_readings_degrade_without_a_gpu():
    if torch.cuda.is_available():
        assert gpu.torch_memory()["reserved"] >= 0
    else:
        assert gpu.torch_memory() is None
        assert "no GPU" in gpu.device_label()
    assert gpu.human_bytes(None) == "n/a" and gpu.human_bytes(999) == "999 B"
    assert gpu.human_bytes(1_234_567) == "1.2 MB"


def test_live_sweep_runs_the_bench_code_path(tmp_path):
    from zerogr_core.app_support.benchrun import LiveSweep

    sweep = LiveSweep(["--suite", "memory", "--quick", "--device", "cpu"], tmp_path).start()
    assert sweep.wait(120) and sweep.error is None
    assert sweep.records and {r["suite"] for r in sweep.records} == {"memory"}
    assert sweep.fraction() == 1.0 and (tmp_path / "live.json").exists()
    assert sweep.command.startswith("python -m zerogr_core bench --suite memory")
    titles = [t for t, _ in benchview.figures_of(sweep.records)]
    assert titles and all("emory" in t for t in titles)
    with pytest.raises(ZeroGRError, match="unknown value 'nope'"):
        LiveSweep(["--suite", "nope"], tmp_path)


def test_steady_cpu_timing_restores_the_thread_count():
    from zerogr_core.app_support.profile import steady_cpu_timing

    before = torch.get_num_threads()
    with steady_cpu_timing("cpu"):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with steady_cpu_timing("cuda"):
        assert torch.get_num_threads() == before


def test_movielens_incompatible_checkpoint_is_one_clear_message(monkeypatch, tmp_path):
    import zerogr_core.recsys.train as train

    def mismatched(path, device="cpu"):
        raise RuntimeError("Error(s) in loading state_dict for SIDRecommender:\n\tMissing key(s)")

    bogus = tmp_path / "model.pt"
    bogus.write_bytes(b"x")
    monkeypatch.setenv(movielens.CHECKPOINT_ENV, str(bogus))
    monkeypatch.setattr(train, "load_checkpoint", mismatched)
    with pytest.raises(ZeroGRError, match="does not fit this version") as info:
        movielens.bundled_study()
    assert "\n" not in str(info.value)


@pytest.mark.skipif(not movielens.available(), reason="the bundled MovieLens checkpoint is missing")
def test_study_inputs_serve_the_bundled_model_through_its_kv_cache():
    """The Decode page's requests of the bundled model: a prefilled KV-cache step model that
    every decode of the page takes (profiled orders, invalid mass, the decoder) with the
    beams of the model's full recompute."""
    from zerogr_core.app_support.profile import invalid_mass
    from zerogr_core.app_support.requests import study_inputs
    from zerogr_core.models.tiger import TigerStepModel

    study = movielens.bundled_study()
    users = movielens.test_users(study)
    rows = users.sample(2, 0)
    inputs = study_inputs(study, users, rows, torch.device("cpu"), beam_width=5)
    assert isinstance(inputs.hidden_fn, TigerStepModel)
    recompute = study.model.hidden_fn_for(users.pick(rows)[0], study.sids)
    index = build_index(study.catalog)
    want = {}
    for order in ("filter-first", "score-first"):
        got = profiled_decode(index, inputs.heads, 5, order, inputs.hidden_fn, 2).result
        want[order] = profiled_decode(index, inputs.heads, 5, order, recompute, 2).result
        assert torch.equal(got.item_rows, want[order].item_rows), order
        torch.testing.assert_close(got.scores, want[order].scores, rtol=1e-5, atol=1e-5)
    got = Decoder(index, inputs.heads, 5, engine="reference").decode(inputs.hidden_fn, 2)
    assert torch.equal(got.item_rows, want["filter-first"].item_rows)
    scoring = Decoder(index, inputs.heads, 5, order="score-first")
    mass = invalid_mass(study.catalog, scoring, inputs.hidden_fn, 2)
    for a, b in zip(mass, invalid_mass(study.catalog, scoring, recompute, 2), strict=True):
        assert a["beams"] == b["beams"] and a["beam_density"] == b["beam_density"]
        assert a["mean"] == pytest.approx(b["mean"], rel=1e-4) and a["max"] == pytest.approx(b["max"], rel=1e-4)


def test_work_limits_refuse_in_one_line_and_read_the_environment():
    from zerogr_core.decode.work_limits import WORK_PRESETS, work_limits

    assert work_limits(False, {}) == WORK_PRESETS["cpu"] and work_limits(True, {}) == WORK_PRESETS["gpu"]
    limits = work_limits(False, {"ZEROGR_MAX_DECODE_LOGITS": "1e3"})
    limits.check_decode(2, 2, (100, 150))  # 1,000 logits: at the limit, allowed
    with pytest.raises(ZeroGRError, match=r"batch 2 × beam 3 × 250 tokens .* 1,500 logits .* limit of 1,000"):
        limits.check_decode(2, 3, (100, 150))
    with pytest.raises(ZeroGRError, match="ZEROGR_MAX_DECODE_LOGITS='many' is not a number"):
        work_limits(False, {"ZEROGR_MAX_DECODE_LOGITS": "many"})


def test_work_limits_bound_the_beams_and_the_hidden_states_whatever_the_catalog():
    """A 12-item catalog let 1,024 × 1,024 beams of hidden size 8,192 through the logits check (12 tokens a beam),
    and the random head then asked for 34,359,738,368 bytes; now the beams and the hidden values are bounded."""
    from zerogr_core.decode.work_limits import MAX_BEAMS, work_limits

    limits = work_limits(False, {})
    limits.check_decode(64, MAX_BEAMS // 64, (4, 4, 4), hidden=64)  # at both limits: allowed
    with pytest.raises(ZeroGRError, match=r"^batch × beam: 1024 × 1024 beams is over the 65,536 one decode may "
                                          r"hold$"):
        limits.check_decode(1024, 1024, (4, 4, 4))
    with pytest.raises(ZeroGRError, match=r"^batch 64 × beam 1,024 × hidden size 8,192 is 536,870,912 hidden-state "
                                          r"values per step, over this machine's limit of 400,000,000: lower the "
                                          r"batch, the beam width or the hidden size$"):
        limits.check_decode(64, 1024, (4, 4, 4), hidden=8192)
    limits.check_decode(64, 1024, (4, 4, 4))  # a model's own states (hidden not chosen): the beams bound them


def test_model_limits_refuse_the_1_7b_shape_on_a_cpu_and_read_the_environment():
    from zerogr_core.decode.work_limits import work_limits
    from zerogr_core.app_support.llm_model import LLMSpec, model_params
    from zerogr_core.models.qwen3 import QWEN3_PRESETS

    sizes = (8192, 8192, 8192)
    big, tiny = model_params(LLMSpec("qwen3-1.7b", 1000, "bfloat16"), sizes), model_params(
        LLMSpec("tiny", 64, "float32"), sizes)
    assert big == QWEN3_PRESETS["qwen3-1.7b"].non_embedding_params()  # the SID bands add no layer parameter
    work_limits(False, {}).check_model("tiny", tiny)
    work_limits(True, {}).check_model("qwen3-1.7b", big)
    with pytest.raises(ZeroGRError, match=r"^model qwen3-1.7b: [\d,]+ parameters in its layers, over this machine's "
                                          r"limit of 50,000,000"):
        work_limits(False, {}).check_model("qwen3-1.7b", big)
    with pytest.raises(ZeroGRError, match="limit of 10"):
        work_limits(True, {"ZEROGR_MAX_MODEL_PARAMS": "10"}).check_model("tiny", tiny)
    with pytest.raises(ZeroGRError, match="ZEROGR_MAX_MODEL_PARAMS='big' is not a number"):
        work_limits(True, {"ZEROGR_MAX_MODEL_PARAMS": "big"})
    with pytest.raises(ZeroGRError, match=r"context length: 5,000 tokens do not fit the tiny shape's 4,096 positions"):
        model_params(LLMSpec("tiny", 5000, "float32"), sizes)
    with pytest.raises(ZeroGRError, match="model shape: unknown Qwen3 shape 'qwen3-8b'"):
        LLMSpec("qwen3-8b", 10, "float32")
    for context in (0, True, 64.0):  # True passed as a context of 1 token
        with pytest.raises(ZeroGRError, match=rf"^context length: expected a positive whole number of tokens, got "
                                              rf"{context!r}$"):
            LLMSpec("tiny", context, "float32")
    with pytest.raises(ZeroGRError, match=r"^projections: expected model or fp8, got 'int4'$"):
        LLMSpec("tiny", 64, "bfloat16", "int4")
    with pytest.raises(ZeroGRError, match=r"^projections: fp8 needs a bfloat16 model, got float32$"):
        LLMSpec("tiny", 64, "float32", "fp8")
    with pytest.raises(ZeroGRError, match=r"^partial_last_step: expected True or False, got 'yes'$"):
        LLMSpec("tiny", 64, "float32", "model", "yes")


def test_the_page_s_qwen3_inputs_take_fp8_projections():
    """The Decode page's Qwen3 requests with FP8 projections: a bfloat16 model's step model runs its GEMMs in
    FP8, and both orders decode catalog items from its prefill."""
    pytest.importorskip("transformers")
    from zerogr_core import Decoder, build_index
    from zerogr_core.app_support.llm_model import LLMSpec, build_llm, llm_inputs
    from zerogr_core.app_support.sources import load_source, sample_source

    catalog = load_source(sample_source("tiny"))
    spec = LLMSpec("tiny", 24, "bfloat16", "fp8")
    model, preset = build_llm(spec.shape, spec.dtype, catalog.codebook_sizes, "cpu")
    inputs = llm_inputs(model, preset, spec, "cpu", 2, 4, 0)
    assert inputs.hidden_fn.fp8 is not None and inputs.prefill_ms > 0 and inputs.hidden_fn.partial_last_step is True
    off = llm_inputs(model, preset, LLMSpec("tiny", 24, "bfloat16", "fp8", False), "cpu", 2, 4, 0)
    assert off.hidden_fn.partial_last_step is False
    for order in ("filter-first", "score-first"):
        result = Decoder(build_index(catalog), inputs.heads, 4, order=order, band_offsets=inputs.band_offsets,
                         engine="reference").decode(inputs.hidden_fn, 2)
        assert bool((result.item_rows >= 0).all()), order


def test_item_set_constraints_name_the_registered_set_and_deny_histories_by_id():
    from zerogr_core.app_support.item_sets import SET_NAME, ItemSet, decode_constraints
    from zerogr_core.catalog.samples import open_catalog
    from zerogr_core.decode.constraints import RequestLists
    from zerogr_core.recsys.cold_items import cold_item_set

    catalog = open_catalog("tiny")
    histories = [np.array([0, 3]), np.array([5])]
    assert decode_constraints(ItemSet(), catalog, histories) == dict(lists=None, constraints=None)
    plain = decode_constraints(ItemSet(), catalog, histories, exclude_history=True)
    assert isinstance(plain["lists"], RequestLists) and plain["constraints"] is None
    cold = ItemSet("cold", 0.25, 1)
    assert np.array_equal(cold.ids(catalog), cold_item_set(catalog, 0.25, 1)) and ItemSet().ids(catalog) is None
    out = decode_constraints(cold, catalog, histories, exclude_history=True)
    assert out["lists"] is None and out["constraints"]["allow_items"] == SET_NAME
    ids = np.asarray(catalog.item_ids)
    assert [list(d) for d in out["constraints"]["deny_items"]] == [list(ids[[0, 3]]), list(ids[[5]])]
    assert decode_constraints(cold, catalog, histories)["constraints"]["deny_items"] is None
    with pytest.raises(ZeroGRError, match=r"item set: a cold share of 97 % of 12 items leaves no other item"):
        ItemSet("cold", 0.97).ids(catalog)
    with pytest.raises(ZeroGRError, match=r"item set: the cold share must be in \(0, 1\), got 1.5"):
        ItemSet("cold", 1.5)
