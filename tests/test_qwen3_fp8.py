"""The Qwen3 step model's opt-in FP8 projections: the GEMMs, the model's use of them, its errors."""
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from zerogr_core import build_index  # noqa: E402
from zerogr_core.decode.constraints import build_lists  # noqa: E402
from zerogr_core.errors import ZeroGRError  # noqa: E402
from zerogr_core.models import fp8_projections  # noqa: E402
from zerogr_core.models.fp8_projections import (KINDS, Fp8Projections, fp8_linear_reference,  # noqa: E402
                                                quantize_weight, unsupported)
from zerogr_core.models.protocol import StepDecoder  # noqa: E402
from zerogr_core.models.qwen3 import Qwen3StepModel, build_random  # noqa: E402

from test_qwen3 import OFFSETS, SHAPE, inputs, tiny_catalog  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9) else "cpu"


@pytest.fixture(scope="module")
def model():
    return build_random(SHAPE, dtype=torch.bfloat16, seed=3)[0]


def serving(model, index, beam, projections="fp8"):
    sm = Qwen3StepModel(model, OFFSETS, context_bucket=8, projections=projections)
    return StepDecoder(sm, index, sm.head, beam_width=beam, order="filter-first", band_offsets=OFFSETS)


def test_projection_equals_its_dequantized_reference():
    """On a GPU the scaled GEMM (``torch._scaled_mm``) against float32 products of the dequantized
    operands, both rounded to bfloat16: they differ only by summation order (a CPU computes the latter)."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(37, 64, generator=g) * 3).to(torch.bfloat16).to(DEV)
    w = (torch.randn(48, 64, generator=g) * 0.05).to(torch.bfloat16).to(DEV)
    bias = torch.randn(48, generator=g).to(torch.bfloat16).to(DEV)
    proj = Fp8Projections({kind: [w] for kind in KINDS})
    q, scale = proj.weights["o"][0]
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (1, 48)
    for b in (None, bias):
        got, want = proj(x, "o", 0, b), fp8_linear_reference(x, q, scale, b)
        assert got.dtype == torch.bfloat16 and got.shape == (37, 48)
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-3)
    # and the quantization costs what e4m3 costs: a few per cent of the bf16 product
    exact = x.float() @ w.float().t()
    assert ((proj(x, "o", 0).float() - exact).norm() / exact.norm()) < 0.08


def test_fp8_model_runs_every_projection_in_fp8(model, monkeypatch):
    """Every layer's four GEMMs of every step go through the FP8 projections, and the decode returns
    catalog items in score order, a deny list obeyed."""
    calls = []
    real = Fp8Projections.__call__

    def spy(self, x, kind, layer, bias=None):
        calls.append((kind, layer))
        return real(self, x, kind, layer, bias)

    monkeypatch.setattr(Fp8Projections, "__call__", spy)
    catalog = tiny_catalog()
    ids, mask = inputs()
    result = serving(model, build_index(catalog), 6).decode(ids, mask)
    rows = result.item_rows
    assert (rows >= 0).all() and (result.scores[:, :-1] >= result.scores[:, 1:]).all()
    assert np.array_equal(catalog.sids[rows.numpy()].astype(np.int64), result.tokens.numpy())
    per_pass = [(kind, layer) for layer in range(SHAPE.layers) for kind in KINDS]
    assert calls[:len(per_pass)] == per_pass and len(calls) == len(per_pass) * len(OFFSETS)

    monkeypatch.setattr(Fp8Projections, "__call__", real)
    run = serving(model, build_index(catalog), 6)
    denied = catalog.item_ids[rows[0, :2].numpy()]
    lists = build_lists(catalog, 3, None, [denied, None, None])
    again = run.decode(ids, mask, lists=lists)
    assert not np.isin(catalog.item_ids[again.item_rows[0].numpy()], denied).any()


def test_fp8_hidden_states_stay_near_the_models(model):
    """The FP8 model's first SID step scores are those of the bfloat16 model up to e4m3's rounding:
    each item's score within 0.05 of the bfloat16 model's (they move by about 0.01 here)."""
    catalog = tiny_catalog()
    ids, mask = inputs()
    a = serving(model, build_index(catalog), 48, "model").decode(ids, mask)
    b = serving(model, build_index(catalog), 48).decode(ids, mask)
    for r in range(ids.shape[0]):
        sa = dict(zip(a.item_rows[r].tolist(), a.scores[r].tolist()))
        sb = dict(zip(b.item_rows[r].tolist(), b.scores[r].tolist()))
        assert set(sa) == set(sb)                   # beam 48 ≥ the 40 items: every item is ranked
        diffs = [abs(sa[i] - sb[i]) for i in sa]
        assert max(diffs) < 0.05, f"request {r}: scores moved by up to {max(diffs):.3f}"


def test_wraps_share_their_quantized_weights(model):
    """A second wrap of the same module reuses its FP8 weights; a changed weight builds them again."""
    first = Qwen3StepModel(model, OFFSETS, projections="fp8").fp8
    assert Qwen3StepModel(model, OFFSETS, projections="fp8").fp8 is first
    other = build_random(SHAPE, dtype=torch.bfloat16, seed=4)[0]
    changed = Qwen3StepModel(other, OFFSETS, projections="fp8").fp8
    assert changed is not first
    with torch.no_grad():
        other.model.layers[0].mlp.down_proj.weight.mul_(2)
    again = Qwen3StepModel(other, OFFSETS, projections="fp8").fp8
    assert again is not changed
    q, s = again.weights["down"][0]
    q0, s0 = changed.weights["down"][0]
    assert torch.equal(q.view(torch.uint8), q0.view(torch.uint8)) and torch.equal(s, 2 * s0)


def test_errors(model):
    with pytest.raises(ZeroGRError, match="^projections: expected model or fp8, got 'fp16'$"):
        Qwen3StepModel(model, OFFSETS, projections="fp16")
    with pytest.raises(ZeroGRError, match="^projections: fp8 needs a bfloat16 model, got float32$"):
        Qwen3StepModel(build_random(SHAPE, seed=3)[0], OFFSETS, projections="fp8")
    assert unsupported(torch.device("cpu"), {(48, 40)}) == \
        "FP8 projections need weights whose sizes are multiples of 16, got (48, 40)"
    assert unsupported(torch.device("cpu"), {(48, 64)}) is None
    with pytest.raises(ZeroGRError, match="no weights for down"):
        fp8_projections.for_model(model, {kind: [] for kind in KINDS[:3]})


def test_quantize_weight_is_row_wise():
    w = torch.randn(32, 16).to(torch.bfloat16)
    w[3] *= 100
    q, s = quantize_weight(w)
    assert s.shape == (1, 32) and torch.isclose(s[0, 3], w[3].float().abs().max() / 448)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs a GPU with float8 tensor cores")
def test_cuda_fp8_engine_matches_its_reference_loop():
    """On a GPU: the engine's CUDA graph with FP8 projections, prefill inside, returns the beams of the
    same decode with the prefill run eagerly before it, and the GPU quantizes the weights to the CPU's bits."""
    catalog = tiny_catalog()
    ids, mask = inputs()
    cpu = build_random(SHAPE, dtype=torch.bfloat16, seed=3)[0]
    gpu = build_random(SHAPE, dtype=torch.bfloat16, seed=3)[0].to("cuda")
    gpu.load_state_dict(cpu.state_dict())
    index = build_index(catalog, device="cuda")
    run = serving(gpu, index, 6)
    for _ in range(2):
        got = run.decode(ids.cuda(), mask.cuda())
    assert run.prefill_in_graph
    sm = run.step_model
    ref = StepDecoder(sm, index, sm.head, beam_width=6, order="filter-first", band_offsets=OFFSETS,
                      prefill="outside").decode(ids.cuda(), mask.cuda())
    assert torch.equal(got.item_rows, ref.item_rows)
    torch.testing.assert_close(got.scores, ref.scores, rtol=0, atol=0)
    q_gpu, s_gpu = sm.fp8.weights["gate_up"][1]
    q_cpu, s_cpu = Qwen3StepModel(cpu, OFFSETS, projections="fp8").fp8.weights["gate_up"][1]
    assert torch.equal(q_gpu.cpu().view(torch.uint8), q_cpu.view(torch.uint8)) and torch.equal(s_gpu.cpu(), s_cpu)
