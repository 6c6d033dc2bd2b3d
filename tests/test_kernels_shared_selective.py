"""Shared selective projection (kernels/shared_selective.py) against the reference."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_asserts import assert_kernel_equal, kernel_device, random_dense_table, random_sparse_mapping
from zerogr_kernels import (BeamGroups, filter_slots_reference, group_beams, group_beams_reference, group_beams_triton,
                            selective_proj_reference, shared_selective_proj, shared_selective_proj_reference,
                            shared_selective_proj_triton)
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
    groups = group_beams(states, 6 if not dense else 3)
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
                                                group_beams(states, 4), group_size=group_size)[0])
    bad = torch.nonzero(out[0] != out[1])
    assert bad.numel() == 0, f"first mismatches at slots {bad[:4].flatten().tolist()}"


def _check_groups(g, states, n_states):
    """``g`` sorts ``states`` by state, each run's start and end right (any order inside a run)."""
    n = len(states)
    assert sorted(g.order.tolist()) == list(range(n)), "order is not a permutation"
    assert g.states.tolist() == sorted(states)
    assert g.states.tolist() == [states[b] for b in g.order.tolist()]
    for i, s in enumerate(g.states.tolist()):
        f = int(g.first[i])
        assert g.states[f] == s and (f == 0 or g.states[f - 1] != s), f"first[{i}] = {f}"
    ends = [sum(1 for s in states if s < state) for state in range(n_states + 1)]
    assert g.ends.tolist() == ends
    assert not g.fill.any(), "the work buffer is not left at zero"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-1, 6), max_size=40), st.integers(0, 3))
def test_group_beams_sorts_and_finds_runs(states, spare):
    n_states = 7 + spare                      # states with no beam, and trailing ones
    q = torch.tensor(states, dtype=torch.int64, device=DEV)
    ref = group_beams_reference(q, n_states)
    _check_groups(ref, states, n_states)
    # the reference is stable: equal states keep beam order
    for i in range(1, len(states)):
        if ref.states[i] == ref.states[i - 1]:
            assert ref.order[i] > ref.order[i - 1]
    got = group_beams_triton(q, n_states)
    _check_groups(got, states, n_states)
    # into preallocated buffers, as a CUDA graph needs, twice (the work buffer comes back to zero)
    buf = BeamGroups(*(torch.full_like(t, 7) for t in ref))
    for fn in (group_beams_triton, group_beams_triton, group_beams_reference):
        assert fn(q, n_states, out=buf) is buf
        _check_groups(buf, states, n_states)


def test_group_beams_arguments():
    q = torch.zeros(3, dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match="n_states must be a non-negative int, got -1"):
        group_beams(q, -1)
    with pytest.raises(TypeError, match="states must have dtype in \\(int64\\)"):
        group_beams(q.int(), 2)
    with pytest.raises(ValueError, match="out.ends must have shape \\(3\\), got \\(6,\\)"):
        group_beams(q, 2, out=BeamGroups.empty(3, 5, DEV))
    with pytest.raises(ValueError, match="states must lie in \\[-1, 2\\)"):
        group_beams_reference(q + 2, 2)


def test_default_tuning():
    assert default_tuning(201, 4096) == (32, 4)
    assert default_tuning(1, 16) == (16, 4)                       # never wider than H


def test_argument_checks():
    slots, _ = _slots(1, 3, 10, 5, 2)
    groups = group_beams(torch.zeros(3, dtype=torch.int64, device=DEV), 1)
    w, h = torch.zeros(10, 4, device=DEV), torch.zeros(3, 4, device=DEV)
    with pytest.raises(ValueError, match="group_size must be 1, 2 or 4, got 3"):
        shared_selective_proj(h, w, slots.slot_tokens, slots.slot_logits, groups, group_size=3)
    with pytest.raises(TypeError, match="weight must have dtype in \\(float32\\)"):
        shared_selective_proj(h, w.half(), slots.slot_tokens, slots.slot_logits, groups)
    with pytest.raises(TypeError, match="BeamGroups"):
        shared_selective_proj(h, w, slots.slot_tokens, slots.slot_logits, tuple(groups))
    with pytest.raises(ValueError, match="groups.first"):
        shared_selective_proj(h, w, slots.slot_tokens, slots.slot_logits, groups._replace(first=groups.first[:2]))
