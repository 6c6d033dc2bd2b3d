"""A global deny segment alone (a registered deny set every request names, a catalog version's
deletions): the host's bound on the rows it can empty, and the engine shape whose first steps
run without the lists when no prefix there can be emptied."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_core.decode.constraints import RequestLists, glob_run, row_floors
from zerogr_core.decode.list_buffers import listed_from
from zerogr_kernels.list_spans import longest_run

from test_deny_ids import assert_decodes_as, engine_case


def longest_covered(rows: np.ndarray) -> int:
    """Most consecutive rows in ``rows`` (any order, repeats allowed)."""
    return longest_run(torch.from_numpy(np.unique(rows).astype(np.int64)))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 400), st.integers(0, 10**6), st.integers(0, 8))
def test_glob_run_bounds_every_run_of_the_global_list(n, seed, count):
    """No prefix of more rows than ``glob_run`` lies wholly in the global list, drawn as runs and
    single rows; the value is kept for the array, not for another one of the same length."""
    g = np.random.default_rng(seed)
    runs = [np.arange(a, a + int(g.integers(1, 12))) for a in g.integers(0, n, count)]
    glob = np.unique(np.concatenate(runs + [g.integers(0, n, count + 1)]).clip(0, n - 1)).astype(np.int64)
    assert longest_covered(glob) <= glob_run(glob) <= glob.size
    assert glob_run(glob) == glob_run(glob)
    assert glob_run(np.arange(glob.size, dtype=np.int64)) == glob.size


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
    and allow lists never take the skipping shape."""
    catalog, index, model, engine, ref = engine_case(["full", "selective", "full"], 512)
    per_request = RequestLists(np.array([0, 2, 2, 3]), np.array([7, 300, 41]), np.zeros(3, dtype=np.int32),
                               np.array([100, 200], dtype=np.int64))
    assert listed_from(index, per_request) == 0
    scattered = glob_only(3, np.union1d(np.arange(5, 400, 9), np.arange(450, 460)))
    assert listed_from(index, scattered) == 1
    allowing = glob_only(3, scattered.glob)
    allowing.mode[0] = 1  # an allow list empties every prefix it lists nothing of
    assert listed_from(index, allowing) == 0
    for lists in (per_request, scattered):
        assert_decodes_as(engine, ref, model, lists, lists)
    assert [key[-1] for key in engine._shapes if "lists" in key] == ["request"]


def test_a_registered_deny_set_takes_its_own_skipping_shape_beside_a_general_one():
    """A deny set registered once and named by every request is the same rows call after call
    (``standing``): it takes the shape that skips the steps it cannot empty even where the general
    shape could hold it, while the same rows given as a catalog version's deletions keep to the
    general shape; the items equal the reference decoder's either way."""
    from zerogr_core.decode.constraints import build_lists

    catalog, index, model, engine, ref = engine_case(["full", "selective", "full"], 512)
    rows = np.union1d(np.arange(5, 400, 9), np.arange(450, 460)).astype(np.int64)
    per_request = RequestLists(np.array([0, 2, 2, 3]), np.array([7, 300, 41]), np.zeros(3, dtype=np.int32),
                               np.array([100, 200], dtype=np.int64))
    assert_decodes_as(engine, ref, model, per_request, per_request)  # the general shape exists
    ref.register_items("seen", catalog.item_ids[rows], kind="deny")
    registry = ref.registry
    named = build_lists(catalog, 3, deny_items="seen", registry=registry)
    deleted = build_lists(catalog, 3, global_deny_rows=rows)
    assert named.standing and not deleted.standing and np.array_equal(named.glob, deleted.glob)
    assert not build_lists(catalog, 3, deny_items="seen", normalise="catalog", registry=registry).standing
    assert listed_from(index, named) == 1
    assert_decodes_as(engine, ref, model, deleted, deleted)
    assert [key[-1] for key in engine._shapes if "lists" in key] == ["request"]
    assert_decodes_as(engine, ref, model, named, deleted)
    assert [key[-1] for key in engine._shapes if "lists" in key] == ["request", ("skip", 1)]


def test_a_registered_deny_set_named_by_a_batch_is_built_and_copied_once():
    """The lists of a batch that names one registered deny set are the same object call after call
    (until the name is registered again or removed), and the engine's buffers, finding the lists
    they loaded last, stage and copy nothing; another set loaded in between, a set registered again
    under the same name and a removed name are all seen: every decode equals the reference
    decoder's over the set's rows at that time."""
    from zerogr_core.decode.constraints import build_lists
    from zerogr_core.errors import ZeroGRError

    catalog, index, model, engine, ref = engine_case(["full", "selective", "full"], 512)
    first = np.union1d(np.arange(5, 400, 9), np.arange(450, 460)).astype(np.int64)
    second = np.union1d(np.arange(3, 500, 7), np.arange(200, 209)).astype(np.int64)  # both skip step 1
    ref.register_items("seen", catalog.item_ids[first], kind="deny")
    ref.register_items("stock", catalog.item_ids[second], kind="deny")
    registry = ref.registry
    named = build_lists(catalog, 3, deny_items="seen", registry=registry)
    assert build_lists(catalog, 3, deny_items="seen", registry=registry) is named
    assert build_lists(catalog, 2, deny_items="seen", registry=registry) is not named
    other = build_lists(catalog, 3, deny_items="stock", registry=registry)
    assert named.standing and other.standing and listed_from(index, named) == listed_from(index, other) == 1

    def glob(rows):
        return glob_only(3, rows)

    assert_decodes_as(engine, ref, model, named, glob(first))
    (buffers,) = [shape.lists for key, shape in engine._shapes.items() if "lists" in key]
    guarded = []
    buffers._guard = lambda original=buffers._guard: (guarded.append(1), original())
    assert_decodes_as(engine, ref, model, named, glob(first))
    assert not guarded  # the lists loaded last: nothing staged or copied
    for lists, rows in ((other, second), (named, first)):
        assert_decodes_as(engine, ref, model, lists, glob(rows))
    assert len(guarded) == 2
    ref.register_items("seen", catalog.item_ids[second], kind="deny")
    again = build_lists(catalog, 3, deny_items="seen", registry=registry)
    assert again is not named and np.array_equal(again.glob, second)
    assert_decodes_as(engine, ref, model, again, glob(second))
    ref.unregister_items("seen")
    with pytest.raises(ZeroGRError, match="not a registered list"):
        build_lists(catalog, 3, deny_items="seen", registry=registry)


def test_a_batch_of_the_same_name_shares_the_named_lists():
    """``[name] * batch`` is the name itself; other lists of names, of another length or mixed, keep
    the full build (and its errors)."""
    from zerogr_core.decode.constraints import build_lists
    from zerogr_core.errors import ZeroGRError

    catalog, index, model, engine, ref = engine_case(["full", "selective", "full"], 512)
    ref.register_items("seen", catalog.item_ids[:40], kind="deny")
    ref.register_items("stock", catalog.item_ids[40:60], kind="deny")
    registry = ref.registry
    named = build_lists(catalog, 3, deny_items="seen", registry=registry)
    assert build_lists(catalog, 3, deny_items=["seen"] * 3, registry=registry) is named
    mixed = build_lists(catalog, 3, deny_items=["seen", "stock", "seen"], registry=registry)
    assert mixed is not named and not mixed.standing
    with pytest.raises(ZeroGRError, match="deny_items"):
        build_lists(catalog, 3, deny_items=["seen"] * 2, registry=registry)
