"""Shared selective projection (kernels/shared_selective.py) against the reference."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_asserts import assert_kernel_equal, kernel_device, random_dense_table, random_sparse_mapping
from zerogr_kernels import (BeamGroups, filter_slots_reference, group_beams, selective_proj_reference,
                            shared_selective_proj, shared_selective_proj_reference, shared_selective_proj_triton)
from zerogr_kernels.shared_selective import default_tuning

DEV = kernel_device()


def _states(rng, n_beams, n_states, n_distinct):
    """``n_beams`` states drawn from ``n_distinct`` of ``n_states`` (so beams meet in states), some dead."""
    pool = rng.choice(n_states, size=min(n_distinct, n_states), replace=False)
    q = rng.choice(pool, size=n_beams)
    q[rng.random(n_beams) < 0.1] = -1
    return torch.as_tensor(q, dtype=torch.int64, device=DEV)


def _slots(seed, n_beams, vocab, max_len, n_distinct, dense=False, kill=0.0):
    """(filtered slot rows, beam states) with beams meeting in ``n_distinct`` states."""
    rng = np.random.default_rng(seed)
    if dense:
        table = random_dense_table(rng, 3, vocab, density=0.3, device=DEV)
        states = _states(rng, n_beams, 3, n_distinct)
        out = filter_slots_reference(states, vocab, table=table)
    else:
        tokens, offsets, K = random_sparse_mapping(rng, 6, vocab, max_len, device=DEV)
        states = _states(rng, n_beams, 6, n_distinct)
        out = filter_slots_reference(states, K, tokens=tokens, offsets=offsets)
    if kill:
        # per-beam constraints: a killed slot has token -1, whatever its state's partners keep
        dead = torch.as_tensor(rng.random(tuple(out.slot_tokens.shape)) < kill, device=DEV)
        out.slot_tokens.masked_fill_(dead, -1)
    return out, states


def _head(n_rows, H, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_rows, H, generator=g).to(dtype).to(DEV)


# (n_beams, vocab, max_len, distinct states, H, band_start, dense, kill, group_size, tuning)
CASES = [
    (12, 300, 150, 2, 33, 17, False, 0.0, 4, {}),              # 3 column blocks, odd H, groups > 4
    (12, 300, 150, 2, 33, 17, False, 0.3, 4, {"block_h": 8}),  # members kill different slots, H chunks
    (9, 300, 150, 3, 40, 0, False, 0.0, 2, {}),                # groups of 2
    (9, 300, 150, 3, 40, 0, False, 0.0, 1, {"num_warps": 2}),  # no sharing
    (7, 300, 150, 7, 24, 5, False, 0.0, 4, {}),                # (almost) no partners
    (20, 130, 0, 1, 24, 5, True, 0.2, 4, {}),                  # dense holes, one state
    (5, 2, 2, 2, 33, 0, False, 0.0, 4, {}),                    # codebook 2
    (1, 1, 1, 1, 33, 0, False, 0.0, 1, {}),                    # single item, beam 1
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_beams,vocab,max_len,distinct,H,band_start,dense,kill,group_size,tuning", CASES)
def test_shared_matches_reference(dtype, n_beams, vocab, max_len, distinct, H, band_start, dense, kill,
                                  group_size, tuning):
    slots, states = _slots(n_beams + vocab, n_beams, vocab, max_len, distinct, dense, kill)
    weight = _head(band_start + vocab + 3, H, dtype, 1)
    hidden = _head(2 * n_beams, H, dtype, 2)[::2]          # strided rows
    groups = group_beams(states)
    got = shared_selective_proj_triton(hidden, weight, slots.slot_tokens, slots.slot_logits.clone(), groups,
                                       band_start=band_start, group_size=group_size, **tuning)
    exp = shared_selective_proj_reference(hidden, weight, slots.slot_tokens, slots.slot_logits.clone(), groups,
                                          band_start=band_start, group_size=group_size)
    # both sides see the same rounded inputs and accumulate in float32
    assert_kernel_equal(got, exp, name="slot_logits", dtype=torch.float32, atol=1e-4)
    assert torch.isneginf(got[slots.slot_tokens < 0]).all()
    assert torch.isfinite(got[slots.slot_tokens >= 0]).all()
    # the same values as the per-beam selective projection's reference
    per_beam = selective_proj_reference(hidden, weight, slots.slot_tokens, slots.tasks, slots.slot_logits.clone(),
                                        band_start=band_start)
    assert_kernel_equal(exp, per_beam, name="slot_logits", dtype=torch.float32, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("group_size", [2, 4])
def test_a_beam_logits_do_not_depend_on_its_partners(group_size):
    # the same beam, alone in its state or sharing it with others, gets bit-identical logits
    rng = np.random.default_rng(3)
    tokens, offsets, K = random_sparse_mapping(rng, 4, 200, 100, empty_frac=0.0, device=DEV)
    weight, hidden = _head(200, 40, torch.float32, 1), _head(24, 40, torch.float32, 2)
    alone = torch.tensor([0] + [1] * 23, dtype=torch.int64, device=DEV)
    shared = torch.zeros(24, dtype=torch.int64, device=DEV)
    out = []
    for states in (alone, shared):
        fo = filter_slots_reference(states, K, tokens=tokens, offsets=offsets)
        out.append(shared_selective_proj_triton(hidden, weight, fo.slot_tokens, fo.slot_logits.clone(),
                                                group_beams(states), group_size=group_size)[0])
    bad = torch.nonzero(out[0] != out[1])
    assert bad.numel() == 0, f"first mismatches at slots {bad[:4].flatten().tolist()}"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-1, 6), min_size=1, max_size=40))
def test_group_beams_sorts_and_finds_run_starts(states):
    q = torch.tensor(states, dtype=torch.int64, device=DEV)
    g = group_beams(q)
    assert sorted(g.order.tolist()) == list(range(len(states)))
    assert torch.equal(q[g.order], g.states)
    assert g.states.tolist() == sorted(states)
    for i, s in enumerate(g.states.tolist()):
        f = int(g.first[i])
        assert g.states[f] == s and (f == 0 or g.states[f - 1] != s)
    # stable: equal states keep beam order, so a state's leader is its lowest beam
    for i in range(1, len(states)):
        if g.states[i] == g.states[i - 1]:
            assert g.order[i] > g.order[i - 1]
    # into preallocated buffers, as a CUDA graph needs
    buf = BeamGroups(*(torch.full((len(states),), 7, dtype=torch.int64, device=DEV) for _ in range(3)))
    assert all(torch.equal(a, b) for a, b in zip(group_beams(q, out=buf), g))


def test_default_tuning():
    assert default_tuning(201, 4096) == (32, 4)
    assert default_tuning(1, 16) == (16, 4)                       # never wider than H


def test_argument_checks():
    slots, _ = _slots(1, 3, 10, 5, 2)
    groups = group_beams(torch.zeros(3, dtype=torch.int64, device=DEV))
    w, h = torch.zeros(10, 4, device=DEV), torch.zeros(3, 4, device=DEV)
    with pytest.raises(ValueError, match="group_size must be 1, 2 or 4, got 3"):
        shared_selective_proj(h, w, slots.slot_tokens, slots.slot_logits, groups, group_size=3)
    with pytest.raises(TypeError, match="weight must have dtype in \\(float32\\)"):
        shared_selective_proj(h, w.half(), slots.slot_tokens, slots.slot_logits, groups)
    with pytest.raises(TypeError, match="BeamGroups"):
        shared_selective_proj(h, w, slots.slot_tokens, slots.slot_logits, tuple(groups))
    with pytest.raises(ValueError, match="groups.first"):
        shared_selective_proj(h, w, slots.slot_tokens, slots.slot_logits, groups._replace(first=groups.first[:2]))
