"""The app's helpers on a real GPU: the stage-timed decode on Triton kernels, the engine's
CUDA-graph timing and warm-up plan, streaming rebuild while decoding (H2D bandwidth), NVML
readings, release of cached engines, and out-of-memory detection. Runs on the lent GPU only."""
from __future__ import annotations

import gc

import pytest
import torch

from zerogr_core import Decoder, build_index
from zerogr_core.app_support import gpu
from zerogr_core.app_support.latency import (GPU_GRAPH, STATIC_GRAPH, VALID_STATIC_GRAPH, VALID_TOKENS, LatencyProtocol,
                                             order_runs, time_orders)
from zerogr_core.app_support.profile import comparison, profile_decode
from zerogr_core.app_support.rebuild import rebuild_while_decoding, refresh_catalog
from zerogr_core.decode.random_requests import random_heads, random_hidden_fn
from zerogr_core.app_support.resources import ResourceSlots
from zerogr_core.errors import is_out_of_memory
from zerogr_core.catalog.synth import generate

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def setup():
    catalog = generate("search-like", 200_000, seed=0)
    index = build_index(catalog, device="cuda")
    heads, bands = random_heads(catalog, 256, "float16", "cuda", seed=0)
    return catalog, index, heads, bands


@pytest.mark.parametrize("order", ["filter-first", "score-first"])
def test_profiled_decode_on_the_gpu_matches_the_decoder(setup, order):
    catalog, index, heads, bands = setup
    fn = random_hidden_fn(8, 256, catalog.codebook_sizes, "float16", "cuda", seed=1)
    dec = Decoder(index, heads, 32, order=order, band_offsets=bands)
    result = dec.decode(fn, 8)  # on a GPU engine: plan, capture, replay
    run = profile_decode(dec, fn, 8)  # the same decoder, stage by stage and eagerly
    assert run.path.startswith("Triton")
    overlap = comparison(run, type(run)(order, result, []), [1, 10, 32])["overlap"]
    assert overlap[32] >= 0.97, overlap   # same items; fp16 ties may swap a few
    table = dec.plan_table(fn, 8)
    assert [r["step"] for r in table] == [1, 2, 3, 4, 5]
    assert all(r["projection"] in ("full", "selective") for r in table)
    if order == "filter-first":
        assert dec.gpu_engine is not None and all(r["mode"] for r in table)
        assert run.projection == tuple(r["projection"] for r in table)
        dec.gpu_engine.release()


def test_both_orders_time_as_cuda_graphs(setup):
    """Like for like: filtering first as the engine's graph, scoring first as the suite's
    graphed STATIC-style baseline and its valid-token STATIC, all timed in turns (no timing
    is asserted)."""
    catalog, index, heads, bands = setup
    fn = random_hidden_fn(8, 256, catalog.codebook_sizes, "float16", "cuda", seed=1)
    decoders = {o: Decoder(index, heads, 32, order=o, band_offsets=bands) for o in ("filter-first", "score-first")}
    runs, notes = order_runs(catalog, decoders, fn, 8)
    assert runs["filter-first"][0] == GPU_GRAPH and runs["score-first"][0] == STATIC_GRAPH, (runs, notes)
    assert runs[VALID_TOKENS][0] == VALID_STATIC_GRAPH and not notes, (runs, notes)
    # the graphs must own what they read: memory freed since their capture is refilled with
    # out-of-range values, which a graph reading it would index with (a device-side assert)
    gc.collect()
    junk = [torch.full((1 << k,), 2**40, dtype=torch.int64, device="cuda") for k in range(6, 23) for _ in range(32)]
    got = time_orders(runs, "cuda", LatencyProtocol(min_repeats=3, min_seconds=0.0))
    torch.cuda.synchronize()
    del junk
    assert all(len(lat.samples_ms) >= 3 and lat.median_ms > 0 for lat in got.values())
    decoders["filter-first"].gpu_engine.release()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_valid_token_static_graph_returns_filtering_firsts_beams(dtype):
    """What the Decode page times as scoring first over the valid tokens only decodes what
    filtering first decodes: the graph's beams, read after its timed replays, against the
    filter-first decoder's on the same requests."""
    from zerogr_core.bench.checks import TOLERANCE, check_valid, compare

    catalog = generate("search-like", 50_000, seed=2)
    index = build_index(catalog, device="cuda")
    heads, bands = random_heads(catalog, 128, dtype, "cuda", seed=3)
    fn = random_hidden_fn(4, 128, catalog.codebook_sizes, dtype, "cuda", seed=4)
    decoders = {o: Decoder(index, heads, 16, order=o, band_offsets=bands) for o in ("filter-first", "score-first")}
    runs, notes = order_runs(catalog, decoders, fn, 4)
    label, replay = runs[VALID_TOKENS]
    assert label == VALID_STATIC_GRAPH and not notes, notes
    time_orders(runs, "cuda", LatencyProtocol(min_repeats=2, min_seconds=0.0))
    torch.cuda.synchronize()
    tokens, scores, states = (t.clone() for t in replay.runner.graph_outputs)
    ref = decoders["filter-first"].decode(fn, 4)
    assert check_valid(index, tokens, scores, states, constrained=True)["passed"]
    tol = TOLERANCE[decoders["filter-first"].heads.dtype]
    got = compare((tokens, scores, states), (ref.tokens, ref.scores, ref.item_rows), tol)
    # the same beams in the same order, up to reordered near-ties of rounding (fp16 logits)
    assert got["passed"] and got["mean_overlap"] >= 0.98, got
    if dtype == "float32":
        assert got["status"] == "equal" and torch.equal(states, ref.item_rows), got
    # and not what the STATIC-style graph returns (normalised over the whole head): the orders differ
    full = runs["score-first"][1].runner.graph_outputs
    assert not torch.equal(full[2], ref.item_rows)
    decoders["filter-first"].gpu_engine.release()


def test_rebuild_while_decoding_streams_to_the_gpu(setup):
    catalog, index, heads, bands = setup
    fresh, _ = refresh_catalog(catalog, 0.05, 0.05)
    fn = random_hidden_fn(4, 256, catalog.codebook_sizes, "float16", "cuda", seed=1)
    dec = Decoder(index, heads, 16, band_offsets=bands)
    report = rebuild_while_decoding(fresh, lambda new: dec.decode(fn, 4), device="cuda", before=5, after=3,
                                    min_seconds=0.3)
    assert report.h2d_gbps is not None and report.h2d_gbps > 0
    assert all(b.get("h2d_bytes") for b in report.builds)
    assert report.during_ms and report.index.device.type == "cuda"
    dec.gpu_engine.release()


def test_nvml_and_torch_readings():
    snap = gpu.nvml_snapshot()
    assert snap is not None and snap["total"] > snap["used"] > 0 and 0 <= snap["gpu_util"] <= 100
    mem = gpu.torch_memory()
    assert mem["reserved"] >= mem["allocated"] >= 0
    assert gpu.device_label().startswith("GPU: ")


def test_replacing_a_slot_frees_gpu_memory(setup):
    catalog, index, heads, bands = setup
    slots = ResourceSlots()
    fn = random_hidden_fn(32, 256, catalog.codebook_sizes, "float16", "cuda", seed=1)

    def decoders():
        d = Decoder(index, heads, 128, band_offsets=bands)
        d.decode(fn, 32)  # plan + graph capture: static buffers on the GPU
        return {"filter-first": d}

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    slots.get("decoders", "a", decoders)
    held = torch.cuda.memory_allocated()
    assert held > base
    slots.drop("decoders")
    assert torch.cuda.memory_allocated() < held


def test_real_cuda_oom_is_recognised():
    free, _ = torch.cuda.mem_get_info()
    with pytest.raises(Exception) as info:
        torch.empty(int(free * 4), dtype=torch.uint8, device="cuda")
    assert is_out_of_memory(info.value)
    torch.cuda.empty_cache()


def test_live_sweep_on_the_gpu(tmp_path):
    from zerogr_core.app_support.benchrun import LiveSweep

    sweep = LiveSweep(["--suite", "headline", "--quick", "--methods", "zerogr,unconstrained", "--budget-s", "120"],
                      tmp_path).start()
    assert sweep.wait(300) and sweep.error is None, sweep.error
    assert any(r.get("kind") not in ("error", "skipped") for r in sweep.records)
    assert sweep.options.device.type == "cuda"


def test_the_qwen3_1_7b_shape_compares_the_orders_as_the_decode_page_does():
    """The Decode page's LLM-scale model on the GPU: the Qwen3-1.7B shape in bf16 (random
    weights) over a 3 × 8,192 catalog, one prefill of two 1,000-token contexts, both orders
    decoding from it (filtering first as the engine's graph), once over every item and once
    restricted to a cold-start set, timed in turns, the memory peak read."""
    pytest.importorskip("transformers")
    from zerogr_core.decode.work_limits import work_limits
    from zerogr_core.app_support.item_sets import ItemSet, decode_constraints, register_set
    from zerogr_core.app_support.llm_model import LLMSpec, build_llm, llm_dtype, llm_inputs, model_params, weight_bytes

    catalog = generate("watch-like", 200_000, seed=0)
    spec = LLMSpec("qwen3-1.7b", 1000, llm_dtype(True))
    work_limits(True).check_model(spec.shape, model_params(spec, catalog.codebook_sizes))
    gpu.reset_peak()
    model, preset = build_llm(spec.shape, spec.dtype, catalog.codebook_sizes, "cuda")
    assert weight_bytes(model) > 3e9  # bf16: about 3.4 GB
    inputs = llm_inputs(model, preset, spec, torch.device("cuda"), 2, 256, seed=0)
    assert inputs.random and inputs.prefill_ms > 0
    index = build_index(catalog, device="cuda")
    for item_set in (ItemSet(), ItemSet("cold", 0.02, 0)):
        decoders = {o: Decoder(index, inputs.heads, 256, order=o, band_offsets=inputs.band_offsets, catalog=catalog)
                    for o in ("filter-first", "score-first")}
        rows = register_set(decoders, item_set, catalog)
        limits = decode_constraints(item_set, catalog)
        profiled = {o: profile_decode(d, inputs.hidden_fn, 2, **limits) for o, d in decoders.items()}
        runs, notes = order_runs(catalog, decoders, inputs.hidden_fn, 2, **limits)
        got = time_orders(runs, "cuda", LatencyProtocol(min_repeats=3, min_seconds=0.0))
        assert all(len(lat.samples_ms) >= 3 and lat.median_ms > 0 for lat in got.values()), got
        for order, run in profiled.items():
            found = run.result.item_rows.cpu()
            assert bool((found >= 0).all()), order  # 200,000 items (or 4,000 cold ones): every beam an item
            if rows is not None:
                assert bool(torch.isin(found, torch.as_tensor(rows)).all()), order
        for d in decoders.values():
            if d.gpu_engine is not None:
                d.gpu_engine.release()
    memory = gpu.torch_memory()
    assert memory["peak"] >= weight_bytes(model)
