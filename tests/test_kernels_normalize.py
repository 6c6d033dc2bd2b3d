"""Slot log-softmax (kernels/normalize.py) against its PyTorch reference."""
import pytest
import torch

from kernel_asserts import assert_kernel_equal, kernel_device
from zerogr_kernels import log_softmax_slots_reference, log_softmax_slots_triton

DEV = kernel_device()


def _logits(n_rows, K, hole_frac, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, K, generator=g) * 4
    x[torch.rand(n_rows, K, generator=g) < hole_frac] = float("-inf")
    x[0] = float("-inf")                                   # a row with no valid slot
    return x.to(dtype).to(DEV)


def _scores(n_rows, seed):
    g = torch.Generator().manual_seed(seed)
    s = -torch.rand(n_rows, generator=g) * 10
    s[-1] = float("-inf")                                  # a padded beam
    return s.to(DEV)


# (n_rows, K, hole_frac): K = 1, odd widths, and a width that needs three chunks
@pytest.mark.parametrize("n_rows,K,hole", [(3, 1, 0.3), (7, 24, 0.5), (13, 199, 0.2), (3, 5000, 0.9)])
def test_matches_reference(n_rows, K, hole):
    x, s = _logits(n_rows, K, hole, n_rows + K), _scores(n_rows, K)
    got = log_softmax_slots_triton(x, s)
    exp = log_softmax_slots_reference(x, s)
    assert_kernel_equal(got, exp, name="log_softmax")
    assert not torch.isnan(got).any()
    assert torch.isneginf(got[0]).all() and torch.isneginf(got[-1]).all()
    assert torch.equal(torch.isneginf(got[1:-1]), torch.isneginf(x[1:-1]))


@pytest.mark.parametrize("K", [24, 5000])  # one chunk, and a row folded over three
def test_rows_holding_nan_or_inf_come_out_dead_as_in_the_reference(K):
    # a model output that overflowed: NaN in a valid or an invalid slot, +inf in a valid one
    x, s = _logits(6, K, 0.3, 7), _scores(6, 8)
    x[1, 3], x[2, 0], x[3, 5] = float("nan"), float("nan"), float("inf")
    x[2, 1] = float("-inf")
    exp = log_softmax_slots_reference(x, s)
    got = log_softmax_slots_triton(x, s)
    assert_kernel_equal(got, exp, name="log_softmax")
    assert torch.isneginf(got[1:4]).all() and not torch.isnan(got).any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs(dtype):
    x, s = _logits(6, 40, 0.3, 1, dtype), _scores(6, 2)
    assert_kernel_equal(log_softmax_slots_triton(x, s), log_softmax_slots_reference(x, s),
                        name="log_softmax")


def test_in_place_and_rows_sum_to_one():
    x, s = _logits(9, 70, 0.4, 3), torch.zeros(9, device=DEV)
    exp = log_softmax_slots_reference(x, s)
    got = log_softmax_slots_triton(x, s, out=x)
    assert got is x
    assert_kernel_equal(got, exp, name="log_softmax")
    mass = got[1:].exp().sum(1)
    assert torch.allclose(mass, torch.ones_like(mass), atol=1e-5)


def test_argument_checks():
    x = torch.zeros(3, 4, device=DEV)
    with pytest.raises(ValueError):
        log_softmax_slots_reference(x, torch.zeros(4, device=DEV))
    with pytest.raises(TypeError):
        log_softmax_slots_reference(x, torch.zeros(3, device=DEV, dtype=torch.float64))
    with pytest.raises(TypeError):
        log_softmax_slots_reference(x, torch.zeros(3, device=DEV), out=torch.zeros(3, 4, dtype=torch.float16))
