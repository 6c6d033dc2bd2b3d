"""Per-request allow/deny lists enforced inside decoding.

Catalog rows are sorted by SID, so every prefix (index state) covers one contiguous range
of rows. A candidate slot is *alive* for a request when its range holds a row the
request may return; the others are killed as the filter fills the slots (the GPU engine:
``filter_slots(constraint=...)``) or right after it (:func:`zerogr_kernels.constrain_slots`,
the reference decoder), before projection and normalisation. Consequences, for both orders:

- every returned beam is an allowed item, and no beam is spent on a prefix without an
  allowed item below it;
- filtering first normalises over the request's alive valid tokens only
  (``normalise="request"``, the default), or over the catalog's valid tokens, the lists
  only removing candidates (``normalise="catalog"``: an item's score is then the same with
  or without lists, as when ranking and filtering afterwards); scoring first normalises
  over everything the model projects, as without constraints;
- a request with fewer allowed items than M gets all of them, then padding: token -1,
  score -inf, item row -1 (item id -1, or ``None`` for string ids).

Deleted items of a live catalog form one global deny list stored once per batch (and
once per engine buffer while it does not change), not once per request.

Memory: the row range of a state needs the first row of every state of steps 2…L-1
(:func:`row_starts`): ``E_1 + … + E_{L-2} + L - 2`` integers in the offsets' dtype
(int32 below 2^31 rows), computed once per index by composing the sparse offsets; the
last step needs nothing (a successor *is* the row). Lists cost 8 bytes per listed row.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from zerogr_kernels.constraints import CATALOG_NORMALISED, constrain_slots, search_iterations
from zerogr_kernels.scored_constraints import constrain_scored_slots
from zerogr_kernels.list_spans import run_bound
from zerogr_kernels.row_marks import mark_rows, mark_shift, mark_words

from ..errors import ZeroGRError
from ..index.layout import StepIndex

NORMALISE = ("request", "catalog")
"""What filtering first normalises a constrained request over (:class:`RequestLists`)."""

_ROW_STARTS: "weakref.WeakKeyDictionary[StepIndex, list]" = weakref.WeakKeyDictionary()


def row_starts(index: StepIndex) -> list[torch.Tensor | None]:
    """First catalog row of every successor state, per step (cached per index).

    Returns
    -------
    list of length L
        Entry ``l`` (0-based step) is ``(E_l + 1,)`` in the offsets' dtype on the index's
        device: the successors of step ``l`` are states of step ``l + 1``, and state ``q``
        covers rows ``[out[l][q], out[l][q + 1])``. The last entry is ``None``: at the last
        step a successor is the item's row.
    """
    cached = _ROW_STARTS.get(index)
    if cached is not None:
        return cached
    L = index.n_levels
    out: list[torch.Tensor | None] = [None] * L
    if L > 1:
        # States of the last step start at the offsets of its segments (entries = rows);
        # a state of an earlier step starts where its first child starts.
        starts = index.steps[L - 1].sparse_view()[1]
        out[L - 2] = starts
        for level in range(L - 2, 0, -1):
            offsets = index.steps[level].sparse_view()[1]
            starts = starts[offsets.long()]
            out[level - 1] = starts
    _ROW_STARTS[index] = out
    return out


_ROW_FLOORS: "weakref.WeakKeyDictionary[StepIndex, list]" = weakref.WeakKeyDictionary()


def row_floors(index: StepIndex) -> list[int]:
    """The fewest catalog rows below a successor of each step (cached per index).

    Returns
    -------
    list of int, length L
        Entry ``l`` is the smallest row range of the states of step ``l + 1``
        (:func:`row_starts`); 1 at the last step, whose successors are rows. A deny list of at
        most that many rows per request, with no global list, kills no slot of step ``l``.
    """
    cached = _ROW_FLOORS.get(index)
    if cached is None:
        cached = [1 if starts is None or starts.numel() < 2 else int(torch.diff(starts).min())
                  for starts in row_starts(index)]
        _ROW_FLOORS[index] = cached
    return cached


_GLOB_RUNS: dict = {}


def glob_run(glob: np.ndarray) -> int:
    """:func:`~zerogr_kernels.list_spans.run_bound` of a sorted global deny array (at least its
    longest run of consecutive rows), kept by the array's identity while it lives: a registered
    deny set and a catalog version's deletions are the same array call after call (at most a few
    dozen arrays are kept)."""
    hit = _GLOB_RUNS.get(id(glob))
    if hit is not None and hit[0]() is glob:
        return hit[1]
    value = run_bound(torch.from_numpy(np.ascontiguousarray(glob)))
    if len(_GLOB_RUNS) >= 64:
        _GLOB_RUNS.clear()
    _GLOB_RUNS[id(glob)] = (weakref.ref(glob), value)
    return value


def row_starts_bytes(index: StepIndex) -> int:
    """Bytes of :func:`row_starts` beyond the index itself (the last step's offsets are shared)."""
    starts = row_starts(index)
    total = sum(t.numel() * t.element_size() for t in starts[:-2] if t is not None)
    if index.n_levels > 1 and index.steps[-1].kind == "dense":
        total += starts[-2].numel() * starts[-2].element_size()
    return total


@dataclass
class RequestLists:
    """Each request's sorted row list (CSR) and mode, plus one global deny list, on the host.

    Attributes
    ----------
    offsets : np.ndarray, shape (batch + 1,), int64
    rows : np.ndarray, shape (offsets[-1],), int64
        Sorted and duplicate-free within each request; deny lists hold no row of
        ``glob`` and allow lists no globally denied row.
    mode : np.ndarray, shape (batch,), int32
        1: allow list (only these rows may be returned), 0: deny list.
    glob : np.ndarray, shape (g,), int64
        Sorted rows no request may return (a live catalog's deletions), stored once for
        the whole batch.
    normalise : {"request", "catalog"}
        What filtering first normalises over: each request's alive tokens, or the
        catalog's valid tokens with the listed candidates dropped afterwards (see the
        module docstring). Scoring first is the same under both.
    standing : bool
        ``glob`` is a registered deny set that every request names, and nothing else: the same
        rows call after call, so the engine gives it a shape of its own even where another shape
        could hold it (:meth:`~zerogr_core.decode.engine.GpuEngine.constrained_shape`).
    """

    offsets: np.ndarray
    rows: np.ndarray
    mode: np.ndarray
    glob: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    normalise: str = "request"
    standing: bool = False

    def __post_init__(self):
        if self.normalise not in NORMALISE:
            raise ZeroGRError(f"normalise must be one of {NORMALISE}, got {self.normalise!r}")

    @property
    def empty(self) -> bool:
        """Whether the lists restrict nothing (no allow list, nothing denied): decoding
        them is decoding without lists."""
        return not self.rows.size and not self.glob.size and not (self.mode & 1).any()

    @property
    def catalog_normalised(self) -> bool:
        return self.normalise == "catalog"

    def device_mode(self, out: np.ndarray | None = None) -> np.ndarray:
        """``(batch,)`` int32 mode bits of the kernels (:mod:`zerogr_kernels.constraints`),
        written into ``out`` when given (a staging buffer)."""
        extra = CATALOG_NORMALISED if self.catalog_normalised else 0
        return np.bitwise_or(self.mode, extra, out=out, dtype=np.int32, casting="unsafe")

    @property
    def batch(self) -> int:
        return int(self.mode.shape[0])

    @property
    def longest(self) -> int:
        """Longest list, the global one included (what the binary searches must cover)."""
        own = int(np.diff(self.offsets).max()) if self.batch else 0
        return max(own, int(self.glob.size))

    @property
    def total_rows(self) -> int:
        """Rows of the device buffer: the global list, then every request's."""
        return int(self.glob.size + self.rows.size)

    def allowed_counts(self, n_items: int) -> np.ndarray:
        """Number of rows each request may return, shape (batch,), int64."""
        sizes = np.diff(self.offsets)
        return np.where(self.mode == 1, sizes, n_items - sizes - self.glob.size)

    def allows(self, request: int, rows: np.ndarray) -> np.ndarray:
        """Whether ``request`` may return each of ``rows`` (bool array)."""
        own = self.rows[self.offsets[request]:self.offsets[request + 1]]
        hit = np.isin(rows, own)
        if self.mode[request] == 1:
            return hit
        return ~hit & ~np.isin(rows, self.glob)

    def device_offsets(self) -> np.ndarray:
        """``(batch + 2,)`` offsets of the device buffer: global segment, then the requests."""
        g = int(self.glob.size)
        return np.concatenate([[0], g + self.offsets]).astype(np.int64)

    @classmethod
    def from_rows(cls, deny=None, allow=None, normalise: str = "request") -> "RequestLists":
        """Lists straight from catalog rows: per request a deny or an allow array (not both).

        Parameters
        ----------
        deny, allow : sequence of ``batch`` int arrays (or None), optional
        normalise : {"request", "catalog"}
        """
        n = len(deny if deny is not None else allow)
        lists, mode = [], np.zeros(n, dtype=np.int32)
        for r in range(n):
            a = None if allow is None else allow[r]
            if a is not None:
                lists.append(np.unique(np.asarray(a, dtype=np.int64)))
                mode[r] = 1
            else:
                d = None if deny is None else deny[r]
                lists.append(np.unique(np.asarray([] if d is None else d, dtype=np.int64)))
        offsets = np.zeros(n + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([x.size for x in lists])
        rows = np.concatenate(lists) if lists else np.zeros(0, dtype=np.int64)
        return cls(offsets, rows.astype(np.int64), mode, normalise=normalise)

    def to_device(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(offsets, rows, mode)`` tensors for :func:`zerogr_kernels.constrain_slots` (rows padded to ≥ 1)."""
        rows = np.concatenate([self.glob, self.rows, np.zeros(1, dtype=np.int64)]).astype(np.int64)
        return (torch.from_numpy(self.device_offsets()).to(device), torch.from_numpy(rows).to(device),
                torch.from_numpy(self.device_mode()).to(device))


def _id_array(items, what: str, request: int | None = None) -> np.ndarray:
    """One request's ids as a 1-D array (a bare id where a list was meant is refused: it
    would silently become a one-item list). Messages name ``what``, or ``what[request]``
    (formatted only on an error, as a batch's loop calls this per request)."""
    if type(items) is np.ndarray and items.ndim == 1:  # as most callers pass ids: nothing to convert
        return items
    given = type(items).__name__
    if isinstance(items, torch.Tensor):  # on any device: its ids cross to the host here
        items = items.detach().cpu()
    arr = np.asarray(items if not isinstance(items, (set, frozenset)) else list(items))
    if arr.ndim != 1:
        named = what if request is None else f"{what}[{request}]"
        raise ZeroGRError(f"{named} must be a list of item ids (or None), got {given} of {arr.ndim} dimensions")
    return arr


def _per_request(items, batch: int, name: str) -> Sequence:
    if items is None:
        return [None] * batch
    if isinstance(items, str):  # one registered list for the whole batch
        return [items] * batch
    if isinstance(items, bytes) or not hasattr(items, "__len__"):
        raise ZeroGRError(f"{name} must be a sequence of {batch} id lists (or None), got {type(items).__name__}")
    if len(items) != batch:
        raise ZeroGRError(f"{name} lists {len(items)} requests, batch_size is {batch}")
    return items


def is_empty_request(items) -> bool:
    """Whether one request's list entry asks for nothing: ``None`` or an empty id list
    (cheap: no conversion, so an absent or empty list costs no host work)."""
    if items is None:
        return True
    if isinstance(items, str):
        return False
    try:
        return len(items) == 0
    except TypeError:
        return False


def _segments(catalog, entries: Sequence, name: str, registry) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, offsets)``: every request's list as sorted, duplicate-free catalog rows in
    CSR form (ids not in the catalog skipped).

    One pass over the batch, one vectorised id lookup for every request's ids
    (:meth:`Catalog.rows_of`; a registered list, a name, contributes its stored rows),
    then each request's rows sorted where they lie: many short sorts of int32 rows cost
    less than one sort of the batch's ``request * N + row`` keys, and need no keys."""
    parts, owners, stored, firsts = [], [], [], []
    ends, total = [0], 0  # where each request's rows end, before dropping misses and repeats
    for r, items in enumerate(entries):
        if items is not None:
            if isinstance(items, str):
                part = registry.rows(items, name, r) if registry is not None else _unregistered(items, name, r)
                if part.size:
                    stored.append(len(parts))
            else:
                part = _id_array(items, name, r)
            if part.size:
                parts.append(part)
                owners.append(r)
                firsts.append(total)
                total += part.size
        ends.append(total)
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(len(entries) + 1, dtype=np.int64)
    rows = _lookup(catalog, parts, owners, stored, name)
    for first, part in zip(firsts, parts):
        rows[first:first + part.size].sort()
    keep = rows >= 0  # unknown ids (-1) sort first in their request's segment
    fresh = rows[1:] != rows[:-1]
    if len(parts) > 1:  # a request's first row repeats nothing of the request before
        fresh[np.array(firsts[1:]) - 1] = True
    np.logical_and(keep[1:], fresh, out=keep[1:])
    if keep.all():  # as usual: every id known, none listed twice
        return rows.astype(np.int64), np.array(ends, dtype=np.int64)
    counts = np.zeros(len(ends), dtype=np.int64)
    counts[np.array(owners) + 1] = np.add.reduceat(keep, firsts, dtype=np.int64)
    return rows[keep].astype(np.int64), np.cumsum(counts, out=counts)


def _lookup(catalog, parts: list, owners: list, stored: list, name: str) -> np.ndarray:
    """The catalog rows of ``parts`` back to back (-1 for an unknown id), in a new array
    (the caller sorts it in place): the ids of every request in one lookup, the parts at
    the positions ``stored`` (registered rows) as they are."""
    if stored:
        ids = [i for i in range(len(parts)) if i not in stored]
        looked = {}
        if ids:
            rows = _lookup(catalog, [parts[i] for i in ids], [owners[i] for i in ids], [], name)
            looked = dict(zip(ids, np.split(rows, np.cumsum([parts[i].size for i in ids[:-1]], dtype=np.int64))))
        return np.concatenate([looked.get(i, part) for i, part in enumerate(parts)])
    try:
        ids = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return catalog.rows_of(ids, missing="mark", what=name, compact=True)
    except (ZeroGRError, TypeError, ValueError):
        # ids of mixed kinds, or a wrong id: look up per request (naming it in the error)
        return np.concatenate([catalog.rows_of(part, missing="mark", what=f"{name}[{r}]", compact=True)
                               for r, part in zip(owners, parts)])


def _unregistered(name_given: str, name: str, r: int):
    raise ZeroGRError(f"{name}[{r}]: {name_given!r} is not a registered list (Decoder.register_items)")


def build_lists(catalog, batch: int, allow_items=None, deny_items=None,
                global_deny_rows: np.ndarray | None = None, normalise: str = "request",
                registry=None) -> RequestLists:
    """Merge allow lists, deny lists and a global deny set into one list per request.

    Vectorised over the batch: one id lookup for every request's ids, each request's
    rows sorted in place, and set operations on ``request * N + row`` keys only when an
    allow list or a global list asks for them; nothing scales with the catalog.

    Parameters
    ----------
    catalog : Catalog
        Maps item ids to rows (:meth:`Catalog.rows_of`); ids it does not hold are skipped.
    batch : int
    allow_items, deny_items : sequence of ``batch`` entries, or str, optional
        Per request: only these items / never these items, as an id array, the name of
        a list registered in ``registry``, or ``None`` (no list). A single name stands
        for every request.
    global_deny_rows : np.ndarray, optional
        Sorted, duplicate-free rows no request may return (deleted items of a live
        catalog); kept once for the batch (the same array object, so an engine that
        already holds it on the device skips the copy).
    normalise : {"request", "catalog"}
        See :class:`RequestLists`.
    registry : ListRegistry, optional
        Resolves list names (:class:`~zerogr_core.decode.registry.ListRegistry`).

    Returns
    -------
    RequestLists
        A request with an allow list gets ``allow - deny - global`` in allow mode (an
        empty allow list allows nothing); the others ``deny - global`` in deny mode,
        with ``global`` shared.

    Raises
    ------
    ZeroGRError
        A list argument of the wrong length, an id of the wrong kind, or an unknown name.
    """
    allow = None if allow_items is None else _per_request(allow_items, batch, "allow_items")
    deny = _per_request(deny_items, batch, "deny_items")
    standing = None if registry is None or allow is not None or global_deny_rows is not None else \
        registry.shared(deny, "deny")
    if standing is not None:  # one registered deny set for the whole batch: its lists, once per batch size
        return registry.named_lists(standing, batch, normalise, lambda: _build_lists(
            catalog, batch, None, deny, None, normalise, registry))
    return _build_lists(catalog, batch, allow, deny, global_deny_rows, normalise, registry)


def _build_lists(catalog, batch: int, allow, deny, global_deny_rows, normalise: str, registry) -> RequestLists:
    """:func:`build_lists` of per-request ``allow`` (or ``None``: no allow argument) and ``deny`` entries."""
    deny, glob, named = _merge_standing(deny, global_deny_rows, normalise, registry, batch)
    if allow is not None:
        allowing = np.array([a is not None for a in allow], dtype=bool)
        allow = _segments(catalog, allow, "allow_items", registry)
    else:
        allowing, allow = np.zeros(batch, dtype=bool), None
    deny = _segments(catalog, deny, "deny_items", registry)
    if allowing.any() or (glob.size and deny[0].size):
        deny = _combine(allow, deny, allowing, glob, catalog.n_items)
    # else deny lists alone (each request's segment is its list), or a global list alone (every
    # segment empty): a registered deny set named by every request costs no set operation per call
    return RequestLists(deny[1], deny[0], allowing.astype(np.int32), glob, normalise,
                        standing=named and not deny[0].size and not allowing.any())


def _combine(allow, deny, allowing: np.ndarray, glob: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, offsets)`` of ``allow - deny - glob`` for the requests ``allowing``, and
    ``deny - glob`` for the others, from the ``(rows, offsets)`` segments of both lists
    (:func:`_segments`; ``allow`` may be ``None``), as set operations on sorted
    ``request * n + row`` keys."""
    batch = allowing.size

    def keys_of(segments):
        rows, offsets = segments
        return rows + np.repeat(np.arange(batch, dtype=np.int64) * n, np.diff(offsets))

    deny_keys = keys_of(deny)
    allow_keys = keys_of(allow) if allow is not None else deny_keys[:0]
    allow_keys = allow_keys[~_sorted_isin(allow_keys, deny_keys)]
    deny_keys = deny_keys[~allowing[deny_keys // n]] if deny_keys.size else deny_keys
    keys = np.concatenate([allow_keys, deny_keys])
    if allow_keys.size and deny_keys.size:
        keys.sort(kind="stable")
    rows = keys % n if n else keys
    if glob.size:
        keep = ~_sorted_isin(rows, glob)
        keys, rows = keys[keep], rows[keep]
    offsets = np.zeros(batch + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(np.bincount(keys // max(n, 1), minlength=batch))
    return rows.astype(np.int64, copy=False), offsets


def _merge_standing(deny: Sequence, global_deny_rows, normalise: str, registry, batch: int):
    """``(deny, glob, named)``: the sorted global deny rows, with a registered deny set that every
    request names moved into them (request-normalised lists only), and whether they are that set
    alone."""
    glob = np.zeros(0, dtype=np.int64) if global_deny_rows is None else \
        np.asarray(global_deny_rows, dtype=np.int64)
    if glob.size > 1 and not (glob[1:] > glob[:-1]).all():
        glob = np.unique(glob)
    if registry is not None and normalise == "request":
        # a deny set every request names is the batch's global segment: the registered
        # array itself, which the engine's device buffer keeps from call to call
        standing = registry.shared(deny, "deny")
        if standing is not None:
            named = not glob.size
            return [None] * batch, standing.rows if named else np.union1d(glob, standing.rows), named
    return deny, glob, False


def _sorted_isin(values: np.ndarray, sorted_rows: np.ndarray) -> np.ndarray:
    """``np.isin`` against a sorted array by binary search (no copy of the big side)."""
    if not sorted_rows.size or not values.size:
        return np.zeros(values.shape, dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_rows, values), sorted_rows.size - 1)
    return sorted_rows[pos] == values


class SlotConstraint:
    """Applies :class:`RequestLists` to the slots of a decode (reference path or engine).

    Parameters
    ----------
    index : StepIndex
    lists : RequestLists
    n_iter : int, optional
        Binary-search halvings (default: enough for the longest list).
    """

    def __init__(self, index: StepIndex, lists: RequestLists, n_iter: int | None = None):
        self.index, self.lists = index, lists
        self.starts = row_starts(index)
        self.offsets, self.rows, self.mode = lists.to_device(index.device)
        self.n_iter = n_iter or search_iterations(lists.longest)
        self.marks = RowMarks(index.n_items, index.device)
        self.marks.mark(self.offsets, self.rows)

    def __call__(self, step: int, slot_tokens: torch.Tensor, slot_succ: torch.Tensor,
                 slot_logits: torch.Tensor, defer: bool = False) -> None:
        """Kill, in place, the slots of step ``step`` with no allowed row below them
        (with ``defer``, not yet those of catalog-normalised requests: :meth:`rescore`)."""
        beams = slot_succ.shape[0] // self.lists.batch
        constrain_slots(slot_tokens, slot_succ, slot_logits, self.starts[step], self.offsets, self.rows,
                        self.mode, beams, self.n_iter, defer, **self.marks.args)

    def rescore(self, step: int, slot_tokens: torch.Tensor, slot_succ: torch.Tensor, slot_logits: torch.Tensor,
                scores: torch.Tensor) -> torch.Tensor:
        """After projection: drop the deferred slots and return the beam scores that keep
        the catalog's normalisation (:func:`zerogr_kernels.scored_constraints.constrain_scored_slots`).
        Returns ``scores`` unchanged when no request is catalog-normalised."""
        if not self.lists.catalog_normalised:
            return scores
        beams = slot_succ.shape[0] // self.lists.batch
        return constrain_scored_slots(slot_tokens, slot_succ, slot_logits, self.starts[step], self.offsets,
                                      self.rows, self.mode, beams, self.n_iter, scores.contiguous(),
                                      torch.empty_like(scores, dtype=torch.float32), **self.marks.args)


class RowMarks:
    """The bitmap of a decode's listed rows (:func:`zerogr_kernels.row_marks.mark_rows`),
    which lets the constraint kernels skip the searches of every slot whose prefix holds no
    listed row: about 2.5 MB for a catalog of 2·10^7 rows, at most 4 MiB for any.

    Parameters
    ----------
    n_rows : int
        Catalog rows.
    device : torch.device or str
    """

    def __init__(self, n_rows: int, device):
        self.shift = mark_shift(n_rows)
        self.words = torch.zeros(mark_words(n_rows), dtype=torch.int32, device=device)

    def mark(self, offsets: torch.Tensor, rows: torch.Tensor) -> None:
        """Set the bits of ``rows[offsets[0]:offsets[-1]]`` (clears the others; capturable)."""
        mark_rows(offsets, rows, self.words, self.shift)

    @property
    def args(self) -> dict:
        """Keyword arguments of the constraint kernels."""
        return {"marks": self.words, "mark_shift": self.shift}
