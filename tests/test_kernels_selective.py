"""Selective projection (kernels/selective.py) and the naive ablation against the reference."""
import numpy as np
import pytest
import torch

from kernel_asserts import (assert_kernel_equal, kernel_device, random_dense_table,
                            random_sparse_mapping, random_states)
from zerogr_kernels import (filter_slots_reference, naive_selective_proj, selective_proj_reference,
                            selective_proj_triton)

DEV = kernel_device()


def _slots(seed, n_beams, vocab, max_len, dense=False):
    rng = np.random.default_rng(seed)
    if dense:
        table = random_dense_table(rng, 3, vocab, density=0.3, device=DEV)
        return filter_slots_reference(random_states(rng, n_beams, 3, device=DEV), vocab, table=table)
    tokens, offsets, K = random_sparse_mapping(rng, 6, vocab, max_len, device=DEV)
    return filter_slots_reference(random_states(rng, n_beams, 6, device=DEV), K, tokens=tokens,
                                  offsets=offsets)


def _head(n_rows, H, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_rows, H, generator=g).to(dtype).to(DEV)


# (n_beams, vocab, max_len, H, band_start, dense, tuning)
CASES = [
    (5, 2, 2, 33, 0, False, {}),                                  # codebook 2, odd H
    (9, 300, 150, 33, 17, False, {"block_h": 16}),                # 3 tasks/beam, band, H chunks
    (4, 130, 0, 24, 5, True, {"tasks_per_program": 3}),           # dense blocks with holes
    (3, 16384, 40, 8, 100, False, {}),                            # codebook of 16,384
    (1, 1, 1, 33, 0, False, {}),                                  # single item, beam 1
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_beams,vocab,max_len,H,band_start,dense,tuning", CASES)
def test_selective_matches_reference(dtype, n_beams, vocab, max_len, H, band_start, dense, tuning):
    slots = _slots(n_beams + vocab, n_beams, vocab, max_len, dense)
    # the head is wider than the band: rows band_start .. band_start + vocab - 1 are the step's
    weight = _head(band_start + vocab + 3, H, dtype, 1)
    hidden = _head(2 * n_beams, H, dtype, 2)[::2]          # strided rows
    got = selective_proj_triton(hidden, weight, slots.slot_tokens, slots.tasks,
                                slots.slot_logits.clone(), band_start=band_start, **tuning)
    exp = selective_proj_reference(hidden, weight, slots.slot_tokens, slots.tasks,
                                   slots.slot_logits.clone(), band_start=band_start)
    # both sides see the same rounded inputs and accumulate in float32
    assert_kernel_equal(got, exp, name="slot_logits", dtype=torch.float32, atol=1e-4)
    assert torch.isneginf(got[slots.slot_tokens < 0]).all()
    assert torch.isfinite(got[slots.slot_tokens >= 0]).all()


def test_selective_skips_tasks_with_zero_count():
    slots = _slots(5, 6, 100, 90)
    tasks = slots.tasks.clone()
    tasks[::2, 2] = 0
    weight, hidden = _head(100, 20, torch.float32, 3), _head(6, 20, torch.float32, 4)
    got = selective_proj_triton(hidden, weight, slots.slot_tokens, tasks, slots.slot_logits.clone())
    exp = selective_proj_reference(hidden, weight, slots.slot_tokens, tasks, slots.slot_logits.clone())
    assert_kernel_equal(got, exp, name="slot_logits", atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_naive_matches_reference(dtype):
    slots = _slots(8, 7, 300, 150)
    weight, hidden = _head(320, 33, dtype, 5), _head(7, 33, dtype, 6)
    got = naive_selective_proj(hidden, weight, slots.slot_tokens, slots.slot_logits.clone(), band_start=9)
    exp = selective_proj_reference(hidden, weight, slots.slot_tokens, slots.tasks,
                                   slots.slot_logits.clone(), band_start=9)
    # the naive baseline rounds its dot products to the input dtype
    assert_kernel_equal(got, exp, name="slot_logits", dtype=dtype)


def test_argument_checks():
    slots = _slots(1, 3, 10, 5)
    w = torch.zeros(10, 4, device=DEV)
    with pytest.raises(ValueError):
        selective_proj_reference(torch.zeros(3, 5, device=DEV), w, slots.slot_tokens, slots.tasks,
                                 slots.slot_logits)
    with pytest.raises(TypeError):
        selective_proj_reference(torch.zeros(3, 4, device=DEV), w, slots.slot_tokens, slots.tasks,
                                 slots.slot_logits.half())
    with pytest.raises(ValueError):
        selective_proj_reference(torch.zeros(3, 4, device=DEV), w, slots.slot_tokens, slots.tasks,
                                 slots.slot_logits, band_start=10)
