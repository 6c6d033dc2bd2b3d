"""A global deny segment alone (a registered deny set every request names, a catalog version's
deletions): the host's bound on the rows it can empty, and the engine shape whose first steps
run without the lists when no prefix there can be emptied."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_core.decode.constraints import RequestLists, row_floors
from zerogr_core.decode.list_buffers import listed_from
from zerogr_kernels.list_spans import longest_run

from test_deny_ids import assert_decodes_as, engine_case


def longest_covered(rows: np.ndarray) -> int:
    """Most consecutive rows in ``rows`` (any order, repeats allowed)."""
    return longest_run(torch.from_numpy(np.unique(rows).astype(np.int64)))


@st.composite
def deny_lists(draw):
    """Deny-only :class:`RequestLists` over ``n`` rows: a sorted global list, and per request a
    sorted list disjoint from it (the builders' invariant), both drawn as runs and single rows."""
    n = draw(st.integers(1, 400))
    g = np.random.default_rng(draw(st.integers(0, 10**6)))

    def drawn(count: int) -> np.ndarray:
        runs = [np.arange(a, a + int(g.integers(1, 12))) for a in g.integers(0, n, count)]
        return np.unique(np.concatenate(runs + [g.integers(0, n, count)]).clip(0, n - 1)) if count else \
            np.zeros(0, dtype=np.int64)

    glob = drawn(draw(st.integers(0, 8)))
    own = [np.setdiff1d(drawn(draw(st.integers(0, 6))), glob) for _ in range(draw(st.integers(1, 4)))]
    offsets = np.concatenate([[0], np.cumsum([o.size for o in own])]).astype(np.int64)
    rows = np.concatenate(own).astype(np.int64) if own else np.zeros(0, dtype=np.int64)
    return RequestLists(offsets, rows, np.zeros(len(own), dtype=np.int32), glob.astype(np.int64)), own, glob


@settings(max_examples=200, deadline=None)
@given(deny_lists())
def test_emptiable_bounds_every_run_a_request_can_empty(case):
    """No request's own rows together with the global ones hold more consecutive rows than
    ``emptiable``, so no prefix of more rows can die; an allow list has no such bound."""
    lists, own, glob = case
    bound = lists.emptiable()
    for rows in own:
        covered = np.concatenate([rows, glob])
        assert longest_covered(covered) <= bound, (rows.tolist(), glob.tolist(), bound)
    lists.mode[0] = 1
    assert lists.emptiable() is None


def glob_only(batch: int, glob: np.ndarray, normalise: str = "request") -> RequestLists:
    return RequestLists(np.zeros(batch + 1, dtype=np.int64), np.zeros(0, dtype=np.int64),
                        np.zeros(batch, dtype=np.int32), np.sort(glob).astype(np.int64), normalise)


@pytest.mark.parametrize("normalise", ["request", "catalog"])
def test_a_global_list_that_cannot_empty_the_first_steps_runs_them_without_lists(normalise):
    """Every item of 8 × 8 × 8 (rows in SID order: 64 per first-step prefix, 8 per second-step
    one). Scattered global rows with one run of 10 (a run bound of 10) cannot empty a first-step
    prefix, so their shape filters that step without lists and waits for them at the second; a
    run of 64 rows empties
    the best item's first-step prefix and takes the general shape; the scattered rows then keep
    their own shape. Every decode equals the reference decoder's."""
    catalog, index, model, engine, ref = engine_case(["full", "selective", "full"], 512)
    assert row_floors(index)[:2] == [64, 8]
    best = int(engine.decode(model, 3).item_rows[0, 0]) // 64 * 64
    scattered = glob_only(3, np.union1d(np.arange(5, 400, 9), np.arange(450, 460)), normalise)
    emptying = glob_only(3, np.arange(best, best + 64), normalise)
    assert listed_from(index, scattered) == 1 and listed_from(index, emptying) == 0
    for lists in (scattered, emptying, scattered):
        assert_decodes_as(engine, ref, model, lists, lists)
    shapes = {key[-1]: shape for key, shape in engine._shapes.items() if "lists" in key}
    assert set(shapes) == {normalise, ("skip", 1)}
    skipped = shapes[("skip", 1)].runners
    assert [r.slot_lists is None for r in skipped] == [True, False, False]
    assert [r.prepare_lists is not None for r in skipped] == [False, True, False]
    assert all(r.slot_lists is not None for r in shapes[normalise].runners)
    got = engine.decode(model, 3, lists=emptying).item_rows
    assert not ((got >= best) & (got < best + 64)).any()


def test_a_captured_general_shape_serves_a_global_list_alone():
    """Once lists with per-request rows have a shape, a global list alone that it can hold takes
    that shape, not a new one (a warmed-up server never captures while serving); per-request rows
    never take the skipping shape."""
    catalog, index, model, engine, ref = engine_case(["full", "selective", "full"], 512)
    per_request = RequestLists(np.array([0, 2, 2, 3]), np.array([7, 300, 41]), np.zeros(3, dtype=np.int32),
                               np.array([100, 200], dtype=np.int64))
    assert listed_from(index, per_request) == 0
    scattered = glob_only(3, np.union1d(np.arange(5, 400, 9), np.arange(450, 460)))
    assert listed_from(index, scattered) == 1
    for lists in (per_request, scattered):
        assert_decodes_as(engine, ref, model, lists, lists)
    assert [key[-1] for key in engine._shapes if "lists" in key] == ["request"]
