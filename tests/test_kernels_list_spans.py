"""The bound on each list segment's longest run of consecutive rows (``list_spans``): the
kernel equals its reference, the bound is never below the longest run, and equals it for a
segment of one run."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel_asserts import kernel_device
from zerogr_kernels.list_spans import (SPAN_BLOCK, list_spans, list_spans_reference, list_spans_triton, longest_run,
                                       run_bound)

DEV = kernel_device()


def segments(rng, n_segments: int, most: int, skip: int = 0):
    """``(offsets, rows)``: ``n_segments`` sorted, distinct segments (some empty) of runs and
    scattered rows, after ``skip`` entries that no segment uses, and junk past the last."""
    parts = []
    for _ in range(n_segments):
        n = int(rng.integers(0, most + 1))
        runs = [np.arange(a, a + k) for a, k in zip(rng.integers(0, 4 * most + 10, 4), rng.integers(1, 30, 4))]
        parts.append(np.unique(np.concatenate(runs + [rng.integers(0, 4 * most + 10, n)]))[:n])
    offsets = np.concatenate([[0], np.cumsum([p.size for p in parts])]) + skip
    rows = np.concatenate([np.full(skip, 7)] + parts + [np.arange(5)])
    t = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.int64, device=DEV)  # noqa: E731
    return t(offsets), t(rows)


@pytest.mark.parametrize("n_segments,most,skip", [(1, 0, 0), (3, 40, 2), (9, 3 * SPAN_BLOCK, 5), (33, 100, 0)])
def test_kernel_matches_reference_and_bounds_the_longest_run(n_segments, most, skip):
    rng = np.random.default_rng(n_segments)
    offsets, rows = segments(rng, n_segments, most, skip)
    got = list_spans_triton(offsets, rows, torch.full((n_segments,), -1, dtype=torch.int64, device=DEV))
    want = list_spans_reference(offsets, rows, torch.full((n_segments,), -1, dtype=torch.int64, device=DEV))
    bad = (got != want).nonzero().flatten()
    assert not bad.numel(), f"first mismatches at {bad[:5].tolist()}: {got[bad[:5]].tolist()} != {want[bad[:5]].tolist()}"
    for s in range(n_segments):
        seg = rows[int(offsets[s]):int(offsets[s + 1])]
        assert longest_run(seg) <= int(got[s]) <= seg.numel()
    assert int(got.max()) > 1 or most == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 60), max_size=40, unique=True))
def test_bounds_against_a_count_of_runs(values):
    vals = sorted(values)
    rows = torch.tensor(vals, dtype=torch.int64)
    runs, length = [], 0
    for i, v in enumerate(vals):
        length = length + 1 if i and v == vals[i - 1] + 1 else 1
        if i + 1 == len(vals) or vals[i + 1] != v + 1:
            runs.append(length)
    assert longest_run(rows) == max(runs, default=0)
    assert run_bound(rows) == (sum(runs) - len(runs) + 1 if runs else 0)  # exact for one run
    got = list_spans(torch.tensor([0, len(values)]), rows, torch.zeros(1, dtype=torch.int64))
    assert int(got[0]) == run_bound(rows)


def test_arguments_are_checked():
    offsets, rows = torch.tensor([0, 2, 3]), torch.arange(4)
    with pytest.raises(ValueError, match="spans"):
        list_spans(offsets, rows, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="list_rows"):
        list_spans(offsets, rows.int(), torch.zeros(2, dtype=torch.int64))
