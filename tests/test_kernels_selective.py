"""Selective projection (kernels/selective.py) and the naive ablation against the reference."""
import numpy as np
import pytest
import torch

from kernel_asserts import (assert_kernel_equal, kernel_device, random_dense_table,
                            random_sparse_mapping, random_states)
from zerogr_kernels import (filter_slots_reference, naive_selective_proj, selective_proj_reference,
                            selective_proj_triton)
from zerogr_kernels.selective import MANY_TASKS, covered_slots, default_tuning, h_pass_bounds, passes_for_cache

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
    (9, 300, 150, 33, 17, False, {"block_h": 16, "acc2d": False}),  # reduce after every chunk
    (9, 300, 150, 70, 3, False, {"block_h": 16, "h_split": 3}),   # partial sums over 3 programs
    (4, 130, 0, 24, 5, True, {"tasks_per_program": 3}),           # dense blocks with holes
    (4, 130, 0, 24, 5, True, {"block_h": 8, "h_split": 2}),       # dense holes, split sums
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H,block_h,h_passes", [(200, 16, 3), (200, 16, 13), (64, 64, 4), (33, 8, 2)])
def test_selective_in_hidden_passes_is_bit_identical(dtype, H, block_h, h_passes):
    # 200 / 16: 13 chunks in passes of 5/5/3, or one chunk per pass; the last chunk is masked
    slots = _slots(7, 9, 300, 150)
    weight, hidden = _head(300 + 4, H, dtype, 5), _head(9, H, dtype, 6)
    # with the per-chunk reduction, passes add the same chunks in the same order
    one = selective_proj_triton(hidden, weight, slots.slot_tokens, slots.tasks, slots.slot_logits.clone(),
                                band_start=4, block_h=block_h, acc2d=False)
    split = selective_proj_triton(hidden, weight, slots.slot_tokens, slots.tasks, slots.slot_logits.clone(),
                                  band_start=4, block_h=block_h, h_passes=h_passes, acc2d=False)
    rows = torch.nonzero(one != split)
    assert rows.numel() == 0, f"first mismatches at {rows[:4].tolist()}"
    exp = selective_proj_reference(hidden, weight, slots.slot_tokens, slots.tasks, slots.slot_logits.clone(),
                                   band_start=4)
    assert_kernel_equal(split, exp, name="slot_logits", dtype=torch.float32, atol=1e-4)


def test_hidden_pass_bounds():
    assert h_pass_bounds(200, 16, 3) == [(0, 80), (80, 160), (160, 200)]
    assert h_pass_bounds(64, 64, 4) == [(0, 64)]
    assert h_pass_bounds(4096, 128, 4) == [(0, 1024), (1024, 2048), (2048, 3072), (3072, 4096)]
    # search-like step 2 (4096 rows): float32 H 4096 is 64 MB, float16 H 1024 is 8 MB
    assert passes_for_cache(4096, 4096, 4) == 4 and passes_for_cache(4096, 1024, 2) == 1
    with pytest.raises(ValueError, match="h_passes"):
        selective_proj_triton(_head(2, 8, torch.float32, 1), _head(4, 8, torch.float32, 2),
                              torch.zeros(2, 1, dtype=torch.int32, device=DEV),
                              torch.zeros(2, 3, dtype=torch.int32, device=DEV), torch.zeros(2, 1, device=DEV),
                              h_passes=0)


@pytest.mark.parametrize("tuning", [{}, {"h_split": 2, "block_h": 8}])
def test_selective_skips_tasks_with_zero_count(tuning):
    slots = _slots(5, 6, 100, 90)
    tasks = slots.tasks.clone()
    tasks[::2, 2] = 0
    weight, hidden = _head(100, 20, torch.float32, 3), _head(6, 20, torch.float32, 4)
    got = selective_proj_triton(hidden, weight, slots.slot_tokens, tasks, slots.slot_logits.clone(), **tuning)
    exp = selective_proj_reference(hidden, weight, slots.slot_tokens, tasks, slots.slot_logits.clone())
    assert_kernel_equal(got, exp, name="slot_logits", atol=1e-4)
    # the slots of a skipped task keep what they held, whatever the split
    skipped = ~covered_slots(tasks, 6, slots.slot_tokens.shape[1])
    assert torch.equal(got[skipped], slots.slot_logits[skipped])


def test_default_tuning_follows_queue_length():
    assert default_tuning(MANY_TASKS, 201, 4096) == (64, 4, True)
    # short queues: one tile of about 8,192 elements per chunk, one chunk when K is 1
    assert default_tuning(MANY_TASKS - 1, 201, 4096) == (128, 8, False)
    assert default_tuning(128, 11, 1024) == (512, 8, False)
    assert default_tuning(128, 1, 1024) == (1024, 4, False)
    assert default_tuning(10, 24, 24) == (32, 4, False)    # never wider than H
    with pytest.raises(ValueError, match="h_split"):
        selective_proj_triton(_head(2, 8, torch.float32, 1), _head(4, 8, torch.float32, 2),
                              torch.zeros(2, 1, dtype=torch.int32, device=DEV),
                              torch.zeros(2, 3, dtype=torch.int32, device=DEV), torch.zeros(2, 1, device=DEV),
                              h_split=2, h_passes=2)
    with pytest.raises(ValueError, match="acc2d must be a bool or None, got 'yes'"):
        selective_proj_triton(_head(2, 8, torch.float32, 1), _head(4, 8, torch.float32, 2),
                              torch.zeros(2, 1, dtype=torch.int32, device=DEV),
                              torch.zeros(2, 3, dtype=torch.int32, device=DEV), torch.zeros(2, 1, device=DEV),
                              acc2d="yes")


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
