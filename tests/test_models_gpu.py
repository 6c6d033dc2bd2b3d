"""Step models inside the GPU engine's CUDA graph (skipped without a CUDA device)."""
import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_t5_step_model_replays_in_the_engine_graph():
    """The whole decode, T5 step model included, is captured once and replayed on new requests
    of the same shape with the results of the eager reference."""
    from zerogr_core import Catalog, build_index
    from zerogr_core.hf import HFGenerator
    from zerogr_core.models.t5 import T5StepModel

    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(0)
    sizes = (32, 32, 8)
    sids = np.unique(np.stack([rng.integers(0, v, 3000) for v in sizes], axis=1), axis=0)
    catalog = Catalog.from_sids(sids, sizes)
    offsets = (3, 35, 67)
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=75, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, dropout_rate=0.0)
    model = transformers.T5ForConditionalGeneration(config).cuda().eval()
    gpu = HFGenerator(model, build_index(catalog, device="cuda"), beam_width=16, token_offsets=offsets,
                      step_model=T5StepModel(model, offsets))
    cpu_model = transformers.T5ForConditionalGeneration(config).eval()
    cpu_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
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
    assert shape.graph is not None and shape.graph_fn is gpu.serving._tracker     # one capture, replayed
