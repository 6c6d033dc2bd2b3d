"""Step models inside the GPU engine's CUDA graph (skipped without a CUDA device)."""
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def t5_setup():
    """A tiny catalog and T5 on the GPU, and the same model on the CPU."""
    from zerogr_core import Catalog

    rng = np.random.default_rng(0)
    sizes = (32, 32, 8)
    sids = np.unique(np.stack([rng.integers(0, v, 3000) for v in sizes], axis=1), axis=0)
    catalog = Catalog.from_sids(sids, sizes)
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=75, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, dropout_rate=0.0)
    model = transformers.T5ForConditionalGeneration(config).cuda().eval()
    cpu_model = transformers.T5ForConditionalGeneration(config).eval()
    cpu_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    return catalog, (3, 35, 67), model, cpu_model


def check_staged_replay(engine, serving, step_model, got, want, graph):
    """A staged decode on the GPU against the CPU reference's: the prefill ran inside the graph,
    the beams agree, and the shape's graph is the one captured before (``graph``) when there
    was one, i.e. replayed with its prefill. Returns the shape and its graph."""
    assert engine.graph_error is None and serving.prefill_in_graph, engine.graph_error
    torch.testing.assert_close(got.scores.cpu(), want.scores, rtol=1e-4, atol=1e-4)
    assert (got.item_rows.cpu() == want.item_rows).float().mean() >= 0.95
    assert (got.item_rows >= 0).all()
    shape = next(iter(engine._shapes.values()))
    assert shape.graph is not None and shape.graph_fn is step_model
    if graph is not None:
        assert shape.graph is graph
    return shape, shape.graph


def test_t5_prefill_inside_the_engine_graph_equals_the_reference():
    """One graph replay runs encoder, cross-attention keys/values and every decode step: the
    CPU reference's beams (Hugging Face's encoder, prefill outside) on new requests of the
    same bucket (replayed, not captured again), padded histories of different lengths."""
    from zerogr_core import build_index
    from zerogr_core.hf import HFGenerator
    from zerogr_core.models.t5 import T5StepModel

    torch.backends.cuda.matmul.allow_tf32 = False
    catalog, offsets, model, cpu_model = t5_setup()
    gpu = HFGenerator(model, build_index(catalog, device="cuda"), beam_width=16, token_offsets=offsets,
                      step_model=T5StepModel(model, offsets))
    cpu = HFGenerator(cpu_model, build_index(catalog), beam_width=16, token_offsets=offsets,
                      step_model=T5StepModel(cpu_model, offsets), prefill="outside")
    assert gpu.serving.stage
    graph = None
    for seed, t in ((0, 12), (1, 12), (2, 7), (3, 16)):          # one bucket of 16
        ids = torch.from_numpy(np.random.default_rng(seed).integers(3, 75, (4, t)))
        mask = torch.ones_like(ids)
        mask[1, t // 2:] = 0
        mask[3, 1:] = 0
        got, want = gpu.generate(ids.cuda(), mask.cuda()), cpu.generate(ids, mask)
        shape, graph = check_staged_replay(gpu.decoder.gpu_engine, gpu.serving, gpu.step_model, got, want, graph)
    # a longer history: the next bucket, new static buffers, captured again
    ids = torch.from_numpy(np.random.default_rng(9).integers(3, 75, (4, 20)))
    got, want = gpu.generate(ids.cuda()), cpu.generate(ids)
    assert shape.graph is not graph and gpu.step_model.ids.shape == (4, 32)
    torch.testing.assert_close(got.scores.cpu(), want.scores, rtol=1e-4, atol=1e-4)


def test_decoder_only_prefill_inside_the_engine_graph_equals_the_reference():
    """One graph replay runs the history pass and every decode step: the CPU reference's beams
    (prefill outside) on new requests of the same bucket (replayed, not captured again),
    left-padded histories of different lengths; a shorter history takes another bucket."""
    import copy

    from test_decoder_only_stage import catalog, histories, model

    from zerogr_core import build_index
    from zerogr_core.models.protocol import StepDecoder

    torch.backends.cuda.matmul.allow_tf32 = False
    cpu_model = model()
    gpu_model = copy.deepcopy(cpu_model).cuda()
    gpu = StepDecoder(gpu_model.step_model(history_bucket=8), build_index(catalog(), device="cuda"),
                      gpu_model.head_weight(), beam_width=16, band_offsets=gpu_model.band_offsets)
    cpu = StepDecoder(cpu_model.step_model(), build_index(catalog()), cpu_model.head_weight(), beam_width=16,
                      band_offsets=cpu_model.band_offsets, prefill="outside")
    assert gpu.stage
    graph = None
    for seed, t in ((0, 12), (1, 12), (2, 9), (3, 16)):          # one bucket of 16
        history, mask = histories(4, t, seed)
        got, want = gpu.decode(history.cuda(), mask.cuda()), cpu.decode(history, mask)
        shape, graph = check_staged_replay(gpu.decoder.gpu_engine, gpu, gpu.step_model, got, want, graph)
    history, mask = histories(4, 5, 9)                                 # the bucket of 8: captured again
    got, want = gpu.decode(history.cuda(), mask.cuda()), cpu.decode(history, mask)
    assert shape.graph is not graph and gpu.step_model.ids.shape[1] == 8
    torch.testing.assert_close(got.scores.cpu(), want.scores, rtol=1e-4, atol=1e-4)


def test_t5_step_model_replays_in_the_engine_graph():
    """The prefill outside the graph: the decode, T5 step model included, is captured once and
    replayed on new requests of the same shape with the results of the eager reference."""
    from zerogr_core import build_index
    from zerogr_core.hf import HFGenerator
    from zerogr_core.models.t5 import T5StepModel

    torch.backends.cuda.matmul.allow_tf32 = False
    catalog, offsets, model, cpu_model = t5_setup()
    gpu = HFGenerator(model, build_index(catalog, device="cuda"), beam_width=16, token_offsets=offsets,
                      step_model=T5StepModel(model, offsets), prefill="outside")
    cpu = HFGenerator(cpu_model, build_index(catalog), beam_width=16, token_offsets=offsets,
                      step_model=T5StepModel(cpu_model, offsets))
    for seed in range(3):
        ids = torch.from_numpy(np.random.default_rng(seed).integers(3, 75, (4, 12)))
        mask = torch.ones_like(ids)
        mask[1, 8:] = 0
        got, want = gpu.generate(ids.cuda(), mask.cuda()), cpu.generate(ids, mask)
        engine = gpu.decoder.gpu_engine
        assert engine is not None and engine.use_graph and engine.graph_error is None, engine.graph_error
        # GPU and CPU FP32 may swap two beams whose scores tie to ~1e-6; nothing else may differ
        torch.testing.assert_close(got.scores.cpu(), want.scores, rtol=1e-4, atol=1e-4)
        assert (got.item_rows.cpu() == want.item_rows).float().mean() >= 0.95
        assert (got.item_rows >= 0).all()
    shape = next(iter(engine._shapes.values()))
    graph = shape.graph
    assert graph is not None and shape.graph_fn is gpu.step_model                 # the model inside the graph
    assert shape.graph_key == gpu.step_model._static_key
    # a history of another length: new static buffers, so the shape is captured again
    ids = torch.from_numpy(np.random.default_rng(9).integers(3, 75, (4, 7)))
    got, want = gpu.generate(ids.cuda()), cpu.generate(ids)
    assert shape.graph is not graph and shape.graph_key == gpu.step_model._static_key
    torch.testing.assert_close(got.scores.cpu(), want.scores, rtol=1e-4, atol=1e-4)
    assert (got.item_rows >= 0).all()


@pytest.mark.parametrize("name", ["tiger", "decoder-only", "decoder-only-staged", "t5"])
def test_kv_cache_models_in_the_engine_graph_equal_the_reference(name):
    """Graph replays (model steps inside, and the staged decoder-only history pass) give the
    reference's beams (every position recomputed), on new requests of the same shape too."""
    from test_loop import BATCH, BEAM, CASES

    from zerogr_core import Decoder
    from zerogr_core.decode.engine import GpuEngine
    from zerogr_core.decode.heads import Heads

    torch.backends.cuda.matmul.allow_tf32 = False
    case = CASES[name]("cuda")
    heads = Heads.build(case["heads"], case["index"].codebook_sizes, case["band_offsets"])
    engine = GpuEngine(case["index"], heads, BEAM, plan_store=False)
    reference = Decoder(case["index"], case["heads"], BEAM, band_offsets=case["band_offsets"], engine="reference")
    for _ in range(2):
        case["prefill"]()
        got = engine.decode(case["step_model"], BATCH)
        assert engine.graph_error is None, engine.graph_error
        want = reference.decode(case["reference"], BATCH)
        torch.testing.assert_close(got.scores, want.scores, rtol=1e-4, atol=1e-4)
        assert (got.item_rows == want.item_rows).float().mean() >= 0.95
        assert (got.item_rows >= 0).all()
    shape = engine.shape_state(case["step_model"], BATCH)
    assert shape.graph is not None and shape.graph_fn is case["step_model"]


def test_bench_e2e_runs_in_cuda_graphs(tmp_path):
    """The end-to-end benchmark on the GPU at tiny sizes: every loop method in a CUDA graph."""
    import json

    from zerogr_core.cli import main

    assert main(["bench-e2e", "--quick", "--device", "cuda", "--model", "t5,decoder-only", "--catalog",
                 "tiger,search", "--batch", "2", "--out", str(tmp_path)]) == 0
    docs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    assert len(docs) == 4
    for doc in docs:
        timed = {r["method"]: r for r in doc["records"] if r["method"] != "derived"}
        # both models stage their prefill into the graph
        assert doc["records"][0]["prefill"] == "inside the graph"
        assert timed["zerogr"]["loop"] == "engine, CUDA graph, model inside, prefill inside"
        assert all(timed[m]["loop"] == "ZeroGR beam loop, CUDA graph, prefill inside"
                   for m in ("static", "unconstrained", "model-only"))
        assert all(timed[m]["valid_fraction"] == 1.0 for m in ("zerogr", "static"))
