"""prefetch_l2: its span checks, and on a GPU that a prefetch changes no byte (it is only a cache hint).

Whether it pays is measured, not tested: ``python runs/probe_l2_prefetch.py`` and
``python runs/probe_llm_ab.py prefetch``. That every launched specialisation compiles for sm_90 is
``tests/test_kernels_compile.py``'s.
"""
import pytest
import torch

from zerogr_kernels import l2_prefetch
from zerogr_kernels.l2_prefetch import prefetch_l2, prefetch_l2_reference, prefetch_l2_triton
from zerogr_core.models import weight_prefetch


@pytest.mark.parametrize("fn", [prefetch_l2, prefetch_l2_reference, prefetch_l2_triton])
@pytest.mark.parametrize("start, nbytes, field", [(8, None, "start"), (-16, None, "start"), (64, None, "start"),
                                                  (0, 48, "nbytes"), (16, 40, "nbytes"), (0, -16, "nbytes")])
def test_a_span_outside_the_tensor_is_refused_naming_the_argument(fn, start, nbytes, field):
    t = torch.zeros(10, dtype=torch.float32)                          # 40 bytes
    with pytest.raises(ValueError, match=rf"^{field}: ") as err:
        fn(t, start, nbytes)
    assert "\n" not in str(err.value)


def test_a_non_contiguous_tensor_is_refused():
    with pytest.raises(ValueError, match=r"^t: expected a contiguous tensor"):
        prefetch_l2(torch.zeros(4, 6)[:, ::2])
    with pytest.raises(ValueError, match=r"^t: expected a tensor"):
        prefetch_l2_triton([1, 2, 3])


@pytest.mark.parametrize("fn", [prefetch_l2, prefetch_l2_reference])
def test_every_span_inside_the_tensor_is_taken_and_changes_nothing(fn):
    t = torch.arange(1000, dtype=torch.float32)                       # 4,000 bytes
    before = t.clone()
    for start, nbytes in ((0, None), (0, 0), (16, 16), (3984, 16), (4000, 0), (32, 3968)):
        assert fn(t, start, nbytes) is None
    assert torch.equal(t, before)


def test_the_weight_spans_are_cut_on_chunk_boundaries():
    total = 10 * l2_prefetch.CHUNK + 4096
    assert weight_prefetch._cut(total, 0) == 0
    assert weight_prefetch._cut(total, 0.5) == 5 * l2_prefetch.CHUNK
    assert weight_prefetch._cut(total, 0.995) == 10 * l2_prefetch.CHUNK
    assert weight_prefetch._cut(total, 1) == total


def test_no_prefetch_on_a_cpu_or_when_none_is_chosen(monkeypatch):
    monkeypatch.setattr(weight_prefetch, "PREFETCH", ())
    assert weight_prefetch.weight_prefetch(torch.zeros(2, 3)) is None
    monkeypatch.setattr(weight_prefetch, "PREFETCH", ("o",))
    assert weight_prefetch.weight_prefetch(torch.zeros(2, 3)) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_prefetch_in_a_graph_changes_no_byte():
    """A 48 MiB weight (the 1.7B shape's gate/up) and an odd-sized tail, prefetched eagerly and inside a
    captured graph on a side stream, as the model does."""
    w = torch.randn(12288, 2048, device="cuda", dtype=torch.bfloat16)
    odd = torch.randn(1000003, device="cuda", dtype=torch.float16)
    before = (w.clone(), odd.clone())
    prefetch_l2(w)
    prefetch_l2(odd, 16, odd.numel() * 2 - 32)
    prefetch_l2_triton(odd[1:])                                     # starts 2 bytes off an aligned address
    ahead = weight_prefetch.WeightPrefetch(w.device, ("o", "gate"))
    x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ahead(("o", w, 0, 0.5), ("skip", odd, 0, 1))
        y = torch.nn.functional.linear(x, w)
        ahead(("gate", w, 0.5, 1))
        ahead.join()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(w, before[0]) and torch.equal(odd, before[1])
    assert torch.equal(y, torch.nn.functional.linear(x, w))
