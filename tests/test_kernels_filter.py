"""Filtering kernel (kernels/filter_slots.py) against its PyTorch reference."""
import numpy as np
import pytest
import torch

from kernel_asserts import (assert_outputs_equal, kernel_device, random_dense_table,
                            random_sparse_mapping, random_states)
from zerogr_kernels import TASK_WIDTH, FilterOut, filter_slots_reference, filter_slots_triton, num_tasks

DEV = kernel_device()
NAMES = FilterOut._fields


def _both(states, K, **kw):
    got = filter_slots_triton(states, K, **kw)
    exp = filter_slots_reference(states, K, **kw)
    assert_outputs_equal(got, exp, names=NAMES, rtol=0.0, atol=0.0)
    return got


def _check_invariants(res: FilterOut, K: int, sparse: bool) -> None:
    tok, succ, lg, seg, tasks = (t.cpu() for t in res)
    valid = tok >= 0
    assert torch.equal(valid, succ >= 0)
    assert torch.equal(valid.sum(1).int(), seg)
    assert torch.isneginf(lg[~valid]).all()
    if sparse:  # valid slots form a prefix of the row
        assert torch.equal(valid, torch.arange(K)[None, :] < seg[:, None])
    n_col = -(-K // TASK_WIDTH)
    assert tasks.shape == (num_tasks(tok.shape[0], K), 3)
    assert torch.equal(tasks[:, 0], torch.arange(tok.shape[0]).repeat_interleave(n_col).int())
    assert torch.equal(tasks[:, 1], (torch.arange(n_col) * TASK_WIDTH).repeat(tok.shape[0]).int())
    assert int(tasks[:, 2].sum()) == int(seg.sum())
    assert ((tasks[:, 2] >= 0) & (tasks[:, 2] <= TASK_WIDTH)).all()


# (n_beams, n_states, vocab, max_len, token dtype, offset dtype)
SPARSE_CASES = [
    (5, 7, 2, 2, torch.int8, torch.int32),          # codebook of 2
    (13, 9, 300, 150, torch.int16, torch.int64),    # K > 64: three tasks per beam
    (1, 1, 1, 1, torch.int8, torch.int32),          # single-item catalog, batch 1 beam 1
    (3, 4, 16384, 70, torch.int16, torch.int32),    # codebook of 16,384
    (7, 5, 40, 33, torch.int32, torch.int64),
]


@pytest.mark.parametrize("n_beams,n_states,vocab,max_len,tdt,odt", SPARSE_CASES)
def test_sparse_matches_reference(n_beams, n_states, vocab, max_len, tdt, odt):
    rng = np.random.default_rng(n_beams * 1000 + vocab)
    tokens, offsets, K = random_sparse_mapping(rng, n_states, vocab, max_len, token_dtype=tdt,
                                               offset_dtype=odt, device=DEV,
                                               empty_frac=0.0 if n_states == 1 else 0.25)
    states = random_states(rng, n_beams, n_states, dead_frac=0.0 if n_beams == 1 else 0.25, device=DEV)
    res = _both(states, K, tokens=tokens, offsets=offsets)
    _check_invariants(res, K, sparse=True)


@pytest.mark.parametrize("ldt", [torch.float32, torch.float16, torch.bfloat16])
def test_sparse_copies_logits(ldt):
    rng = np.random.default_rng(7)
    vocab = 90
    tokens, offsets, K = random_sparse_mapping(rng, 6, vocab, 80, device=DEV)
    states = random_states(rng, 9, 6, device=DEV)
    # a non-contiguous band view of a wider logits matrix
    logits = torch.randn(9, 2 * vocab + 3, device=DEV).to(ldt)[:, 3::2]
    res = _both(states, K, tokens=tokens, offsets=offsets, logits=logits)
    valid = res.slot_tokens >= 0
    b, k = valid.nonzero(as_tuple=True)
    assert torch.equal(res.slot_logits[b, k], logits[b, res.slot_tokens[b, k].long()].float())


def test_sparse_truncates_to_K_and_all_dead():
    rng = np.random.default_rng(3)
    tokens, offsets, K = random_sparse_mapping(rng, 5, 50, 40, empty_frac=0.0, device=DEV)
    states = torch.arange(5, device=DEV)
    res = _both(states, K - 7, tokens=tokens, offsets=offsets)
    assert int(res.seg_len.max()) == K - 7
    dead = torch.full((4,), -1, dtype=torch.int64, device=DEV)
    res = _both(dead, K, tokens=tokens, offsets=offsets)
    assert int(res.seg_len.abs().sum()) == 0 and int(res.tasks[:, 2].sum()) == 0


# (n_beams, n_states, vocab, table dtype)
DENSE_CASES = [
    (6, 3, 2, torch.int32),
    (4, 5, 130, torch.int64),     # three column tasks: seg_len through atomics
    (2, 1, 16384, torch.int32),   # codebook of 16,384, a single state (step 1)
]


@pytest.mark.parametrize("n_beams,n_states,vocab,ddt", DENSE_CASES)
def test_dense_matches_reference(n_beams, n_states, vocab, ddt):
    rng = np.random.default_rng(vocab)
    table = random_dense_table(rng, n_states, vocab, density=0.4, dtype=ddt, device=DEV)
    states = random_states(rng, n_beams, n_states, dead_frac=0.3, device=DEV)
    logits = torch.randn(n_beams, vocab, device=DEV, dtype=torch.float16)
    res = _both(states, vocab, table=table.t().contiguous().t(), logits=logits)
    _check_invariants(res, vocab, sparse=False)
    res = _both(states, vocab, table=table)
    _check_invariants(res, vocab, sparse=False)


def test_out_buffers_are_overwritten():
    rng = np.random.default_rng(11)
    tokens, offsets, K = random_sparse_mapping(rng, 8, 100, 90, device=DEV)
    states = random_states(rng, 10, 8, device=DEV)
    out = FilterOut(*(torch.full_like(t, 7) for t in filter_slots_reference(states, K, tokens=tokens,
                                                                          offsets=offsets)))
    got = filter_slots_triton(states, K, tokens=tokens, offsets=offsets, out=out)
    assert all(g is o for g, o in zip(got, out))
    assert_outputs_equal(got, filter_slots_reference(states, K, tokens=tokens, offsets=offsets),
                         names=NAMES, rtol=0.0, atol=0.0)
    table = random_dense_table(rng, 3, 200, device=DEV)
    states = random_states(rng, 10, 3, device=DEV)
    out = FilterOut(*(torch.full_like(t, 5) for t in filter_slots_reference(states, 200, table=table)))
    filter_slots_triton(states, 200, table=table, out=out)
    assert_outputs_equal(out, filter_slots_reference(states, 200, table=table), names=NAMES,
                         rtol=0.0, atol=0.0)


def test_argument_checks():
    tokens = torch.zeros(3, dtype=torch.int16)
    offsets = torch.tensor([0, 3], dtype=torch.int32)
    states = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(TypeError):
        filter_slots_reference(states.int(), 3, tokens=tokens, offsets=offsets)
    with pytest.raises(ValueError):
        filter_slots_reference(states, 3, tokens=tokens)
    with pytest.raises(ValueError):
        filter_slots_reference(states, 3, table=torch.zeros(1, 4, dtype=torch.int32))
    with pytest.raises(ValueError):
        filter_slots_reference(states, 0, tokens=tokens, offsets=offsets)
    with pytest.raises(ValueError):
        filter_slots_reference(states, 3, tokens=tokens, offsets=offsets,
                               logits=torch.zeros(3, 4))
