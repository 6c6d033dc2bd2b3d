"""Per-call lists built on the index's device (:func:`build_lists_on`).

The host path (:func:`~zerogr_core.decode.constraints.build_lists`) looks ids up and sorts
each request's rows with numpy: at batch 32 a deny list of 10,000 items (320k keys)
or an allow list of 1 % of a 2·10^7 catalog (6.4 M ids) costs tenths of a second of host
sorting. Here the host only concatenates the ids; they cross in one pinned, non-blocking
copy, and the lookup (a dense id → row table kept on the device once per catalog), the
sort and the removal of duplicates, misses and vetoed keys run on the device without a
host synchronisation. The same torch code runs on CPU tensors, which is how the tests
compare it with the host path.

Without a synchronisation the number of surviving rows is not known on the host, so
:class:`DeviceRequestLists` keeps the list buffer at its upper bound (every id given) and
the offsets say where each request's rows end; the rows past ``offsets[-1]`` are filler
that no kernel reads.

Those steps are some 60 small launches, whose host cost, not the GPU's, set the build's
time (about a millisecond whatever the size). Up to :data:`GRAPH_MAX_IDS` ids with
per-call ids only (no registered names, no global list; numpy arrays, or tensors that are pinned
or on the device, which cross without the gather), the ids are padded to a power-of-two
capacity and the steps replay from a CUDA graph captured once per (batch, capacity)
(:class:`GraphedBuild`).
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from ..catalog.item_ids import fits_int64
from ..errors import ZeroGRError
from ..timing import capture
from .constraints import NORMALISE, RequestLists, _id_array, _merge_standing, _per_request, _unregistered

LIST_PATHS = ("auto", "host", "device")
"""Where :meth:`Decoder.request_lists <zerogr_core.decode.decoder.Decoder.request_lists>`
builds per-call lists: on the index's device when it is a GPU, on the host, or on the
index's device whatever it is (tests run the device path on CPU tensors)."""

DEVICE_MIN_IDS = 32_768
"""Fewest per-call ids for which ``"auto"`` builds the lists on the GPU. The device path costs
a few tenths of a millisecond whatever the size (staging, one copy, a graph replay, or some 60
launches past :data:`GRAPH_MAX_IDS`), the host's numpy work grows with the ids: on the H200
(``runs/results/constraints/74aa928``) the host built 100 ids per request in 0.03–0.15 ms at
batch 1–32 and 10,000 at batch 1 in 0.13 ms (device 0.24–0.40 and 0.24 ms), while 80,000 ids
(10,000 at batch 8) took the host 1.15 ms and the device 0.48 ms."""


def listed_ids(allow_items, deny_items, batch: int) -> int:
    """How many per-call ids the requests list (registered names count nothing: their rows
    are on the device already); cheap, no conversion."""
    total = 0
    for items, name in ((allow_items, "allow_items"), (deny_items, "deny_items")):
        if items is None or isinstance(items, str):
            continue
        for entry in _per_request(items, batch, name):
            if isinstance(entry, torch.Tensor):  # a 0-d one (a bare id) is refused later, in one line
                total += entry.numel()
            elif type(entry) is np.ndarray or (entry is not None and not isinstance(entry, str)
                                               and hasattr(entry, "__len__")):
                total += len(entry)
    return total

_TABLES: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()
_COPIES: dict = {}


def device_id_table(catalog, device) -> tuple[int, torch.Tensor] | None:
    """``(base, table)``: the catalog's dense id → row table on ``device`` (row of id ``v``
    at ``table[v - base]``, -1 where absent), built once per catalog and device; ``None``
    when the ids are strings or too sparse for a table (those keep the host path)."""
    return lookup_table(catalog._id_lookup, device)


def lookup_table(lookup, device) -> tuple[int, torch.Tensor] | None:
    """:func:`device_id_table` of a catalog's id lookup (``catalog._id_lookup``)."""
    if lookup.table is None:
        return None
    per_device = _TABLES.setdefault(lookup, {})
    key = str(torch.device(device))
    if key not in per_device:
        per_device[key] = torch.from_numpy(lookup.table).to(device)
    return lookup.base, per_device[key]


def device_copy(arr: np.ndarray, device) -> torch.Tensor:
    """``arr`` on ``device``, copied once for as long as the array object lives (registered
    lists and a live catalog's deletions are the same object from call to call)."""
    key = (id(arr), str(torch.device(device)))
    hit = _COPIES.get(key)
    if hit is not None and hit[0]() is arr:
        return hit[1]
    out = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.int64)).to(device)
    _COPIES[key] = (weakref.ref(arr), out)
    weakref.finalize(arr, _COPIES.pop, key, None)
    return out


@dataclass
class DeviceRequestLists:
    """:class:`~zerogr_core.decode.constraints.RequestLists` whose per-request part lives on
    the device.

    Attributes
    ----------
    offsets : torch.Tensor, shape (batch + 1,), int64, on the device
    rows : torch.Tensor, shape (capacity,), int64, on the device
        Request ``r``'s sorted, duplicate-free rows are ``rows[offsets[r]:offsets[r + 1]]``;
        ``capacity`` is an upper bound of ``offsets[-1]`` known without synchronising.
    mode : np.ndarray, shape (batch,), int32
        1: allow list, 0: deny list (known on the host: which requests name an allow list).
    glob : np.ndarray, shape (g,), int64
        The global deny rows, on the host as in :class:`RequestLists` (the engine copies
        them only when the array object changes).
    normalise : {"request", "catalog"}
    """

    offsets: torch.Tensor
    rows: torch.Tensor
    mode: np.ndarray
    glob: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    normalise: str = "request"
    _host: RequestLists | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.normalise not in NORMALISE:
            raise ZeroGRError(f"normalise must be one of {NORMALISE}, got {self.normalise!r}")

    @property
    def empty(self) -> bool:
        """Whether nothing is listed (decided without synchronising: ids that all miss the
        catalog still count as listed and take the constrained path, with the same result)."""
        return not self.rows.numel() and not self.glob.size and not (self.mode & 1).any()

    @property
    def catalog_normalised(self) -> bool:
        return self.normalise == "catalog"

    @property
    def batch(self) -> int:
        return int(self.mode.shape[0])

    @property
    def longest(self) -> int:
        """An upper bound of the longest list (what the binary searches must cover)."""
        return max(int(self.rows.numel()), int(self.glob.size))

    @property
    def total_rows(self) -> int:
        """Rows of the device buffer (an upper bound): the global list, then the requests'."""
        return int(self.glob.size + self.rows.numel())

    def device_mode(self, out: np.ndarray | None = None) -> np.ndarray:
        return RequestLists.device_mode(self, out)

    def to_host(self) -> RequestLists:
        """The same lists as a host :class:`RequestLists` (synchronises)."""
        offsets = self.offsets.cpu().numpy().astype(np.int64)
        rows = self.rows[:int(offsets[-1])].cpu().numpy().astype(np.int64)
        return RequestLists(offsets, rows, self.mode.copy(), self.glob, self.normalise)

    def allowed_counts(self, n_items: int) -> np.ndarray:
        return self._on_host().allowed_counts(n_items)

    def allows(self, request: int, rows: np.ndarray) -> np.ndarray:
        """As :meth:`RequestLists.allows` (the first call copies the lists to the host)."""
        return self._on_host().allows(request, rows)

    def _on_host(self) -> RequestLists:
        if self._host is None:
            self._host = self.to_host()
        return self._host

    def to_device(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(offsets, rows, mode)`` for :func:`zerogr_kernels.constrain_slots`, as
        :meth:`RequestLists.to_device` lays them out."""
        g = int(self.glob.size)
        glob = device_copy(self.glob, device) if g else self.rows[:0]
        rows = torch.cat([glob, self.rows.to(device), self.rows.new_zeros(1)])
        offsets = torch.cat([self.offsets.new_zeros(1), self.offsets + g]).to(device)
        return offsets, rows, torch.from_numpy(self.device_mode()).to(device)


KEY32_LIMIT = torch.iinfo(torch.int32).max
"""Sort keys ``(request · n + row) · 2 + kind`` below this are sorted as int32 (half the radix
passes of int64), others as int64."""


def _stage(arrays: list, device) -> list[torch.Tensor]:
    """Each of ``arrays`` on ``device`` as int64. Tensors already there stay; pinned host
    tensors cross as they are; numpy arrays and pageable tensors are gathered into one
    pinned block (torch's parallel copy) that crosses in one non-blocking copy (a pageable
    copy would wait for the work queued before it). Copying each stretch as soon as it is
    gathered was no faster on the H200's host: the gather then ran a third slower."""
    device = torch.device(device)
    out: list = [None] * len(arrays)
    staged = []
    for i, a in enumerate(arrays):
        if isinstance(a, torch.Tensor) and _crosses_as_is(a, device):
            out[i] = a.to(device=device, dtype=torch.int64, non_blocking=True)
        else:
            staged.append((i, a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))))
    if staged:
        total = sum(int(t.numel()) for _, t in staged)
        host = torch.empty(total, dtype=torch.int64, pin_memory=device.type == "cuda")
        at = 0
        for _, t in staged:
            host[at:at + t.numel()].copy_(t)
            at += t.numel()
        block = host.to(device, non_blocking=True)
        at = 0
        for i, t in staged:
            out[i] = block[at:at + t.numel()]
            at += t.numel()
    return out


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts as one tensor: a view when they lie back to back in one block (ids staged
    together), else a concatenation."""
    first = parts[0]
    size = first.element_size()
    at = first.data_ptr() + first.numel() * size
    for p in parts[1:]:
        if p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() or p.data_ptr() != at:
            return torch.cat(parts)
        at += p.numel() * size
    return first.as_strided((sum(p.numel() for p in parts),), (1,))


def on_device(t: torch.Tensor, device: torch.device) -> bool:
    """Whether tensor ``t`` is on ``device`` (``"cuda"`` without an index meaning the current GPU)."""
    if t.device.type != device.type:
        return False
    index = device.index if device.index is not None or device.type != "cuda" else torch.cuda.current_device()
    return t.device.index == index


def _crosses_as_is(t: torch.Tensor, device: torch.device) -> bool:
    """Whether tensor ``t`` reaches ``device`` without a gather into pinned memory: it is there
    already, or it is pinned."""
    return on_device(t, device) or (t.device.type == "cpu" and t.is_pinned())


PARALLEL_GATHER = 1 << 15
"""Ids of a numpy part from which :func:`place_ids` gathers it with torch's copy (parallel over
the host's cores) rather than numpy's (one core, but less overhead per call)."""


def place_ids(parts: list, host: torch.Tensor, start: int) -> tuple[int, list]:
    """Lay 1-D id ``parts`` back to back from ``start``: numpy parts are written into ``host`` (a
    pinned int64 block, which crosses in one copy), tensors (on the device, or pinned) are
    returned as ``(offset, tensor)`` for :func:`copy_tensors` after that copy, on the same stream.
    Returns ``(end of the last numpy part, or start, tensors)``."""
    tensors, at, gathered = [], start, start
    host_np = None
    for part in parts:
        k = part.shape[0]
        if isinstance(part, torch.Tensor):
            tensors.append((at, part))
        elif k >= PARALLEL_GATHER:
            host[at:at + k].copy_(torch.from_numpy(np.ascontiguousarray(part)))
            gathered = at + k
        else:
            host_np = host.numpy() if host_np is None else host_np
            host_np[at:at + k] = part
            gathered = at + k
        at += k
    return gathered, tensors


def copy_tensors(tensors: list, block: torch.Tensor) -> None:
    """Copy :func:`place_ids`'s tensors into their stretches of the device ``block`` (non-blocking)."""
    for at, part in tensors:
        block[at:at + part.shape[0]].copy_(part, non_blocking=True)


def _integer_ids(items, what: str):
    """One request's ids as an integer array or tensor, or ``None`` when they are of another
    kind (strings, integer strings: the host path converts or refuses them)."""
    if isinstance(items, torch.Tensor):
        if items.ndim != 1:
            raise ZeroGRError(f"{what} must be a list of item ids (or None), got a tensor of {items.ndim} dimensions")
        return items if not items.is_floating_point() and items.dtype != torch.bool else None
    arr = _id_array(items, what)
    return arr if not arr.size or (arr.dtype.kind in "iu" and fits_int64(arr)) else None


def build_lists_on(device, catalog, batch: int, allow_items=None, deny_items=None,
                   global_deny_rows: np.ndarray | None = None, normalise: str = "request",
                   registry=None) -> DeviceRequestLists | None:
    """:func:`~zerogr_core.decode.constraints.build_lists` computed on ``device``: the same
    lists, for a catalog with a dense integer-id table and integer ids.

    Parameters
    ----------
    device : torch.device or str
        Where the lookup, sort and compaction run (a CUDA device, or the CPU in tests).
    catalog, batch, allow_items, deny_items, global_deny_rows, normalise, registry
        As :func:`~zerogr_core.decode.constraints.build_lists`; per-request ids may also be
        1-D integer tensors.

    Returns
    -------
    DeviceRequestLists, or None
        ``None`` when the catalog's ids have no dense table or a request's ids are not
        integers (strings, integer strings): the host path converts those, or names what
        is wrong.
    """
    device = torch.device(device)
    table = device_id_table(catalog, device)
    if table is None:
        return None
    allow = _per_request(allow_items, batch, "allow_items")
    deny = _per_request(deny_items, batch, "deny_items")
    deny, glob, _ = _merge_standing(deny, global_deny_rows, normalise, registry, batch)
    n = catalog.n_items
    allowing = np.array([a is not None for a in allow], dtype=bool)
    # every listed entry: ids (looked up here) or registered rows, with its request and kind
    id_parts, id_sizes, row_parts, row_sizes = [], [], [], []
    for kind, entries, name in ((1, allow, "allow_items"), (0, deny, "deny_items")):
        for r, items in enumerate(entries):
            if items is None:
                continue
            if isinstance(items, str):
                rows = registry.rows(items, name, r) if registry is not None else _unregistered(items, name, r)
                if rows.size:
                    row_parts.append(device_copy(rows, device))
                    row_sizes.append((r, kind, int(rows.size)))
                continue
            ids = _integer_ids(items, f"{name}[{r}]")
            if ids is None:
                return None
            k = int(ids.numel() if isinstance(ids, torch.Tensor) else ids.size)
            if k:
                id_parts.append(ids)
                id_sizes.append((r, kind, k))
    total = sum(s[2] for s in id_sizes) + sum(s[2] for s in row_sizes)
    mode = allowing.astype(np.int32)
    if not total:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return DeviceRequestLists(torch.zeros(batch + 1, dtype=torch.int64, device=device), empty, mode, glob,
                                  normalise)
    if not row_parts and not glob.size and device.type == "cuda" and all(
            type(p) is np.ndarray or _crosses_as_is(p, device) for p in id_parts):
        graphed = _graphed_build(catalog, table, device, batch, total)
        if graphed is not None:
            offsets, rows = graphed(id_parts, id_sizes, mode)
            return DeviceRequestLists(offsets, rows, mode, glob, normalise)
    # which request and kind each entry belongs to, and the modes, cross with the ids;
    # the entries' owners are expanded on the device (``output_size`` spares a synchronisation)
    meta = np.array([[r * 2 + kind, k] for r, kind, k in id_sizes + row_sizes], dtype=np.int64)
    staged = _stage(id_parts + [meta.ravel(), mode.astype(np.int64)], device)
    meta, mode_dev = staged[-2].view(-1, 2), staged[-1]
    rows = []
    if id_parts:
        rows.append(_table_rows(_joined(staged[:-2]), table))
    rows.extend(row_parts)
    rows = torch.cat(rows) if len(rows) > 1 else rows[0]
    offsets, packed = _compact(rows, meta, mode_dev, glob, batch, n, total, device)
    return DeviceRequestLists(offsets, packed, mode, glob, normalise)


def _table_rows(ids: torch.Tensor, table) -> torch.Tensor:
    """Catalog rows of int64 ``ids`` through the dense table (-1 for an id it does not hold)."""
    base, tab = table
    pos = ids - base
    inside = (pos >= 0) & (pos < tab.numel())
    return torch.where(inside, tab[torch.where(inside, pos, 0)].long(), -1)


def _compact(rows: torch.Tensor, meta: torch.Tensor, mode_dev: torch.Tensor, glob: np.ndarray, batch: int,
             n: int, total: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(offsets, rows)`` of the requests' sorted, duplicate-free lists from every listed entry's
    row (-1: skipped) and the entries' ``(request · 2 + kind, count)`` runs in ``meta``; no host
    synchronisation, fixed shapes for fixed ``total`` (what a CUDA graph needs)."""
    # each entry's run by a binary search of the runs' ends (repeat_interleave's kernel walks
    # each run in one thread: 0.4 ms for 32 runs of 200,000); empty runs are never found
    ends = torch.cumsum(meta[:, 1], 0)
    run = torch.searchsorted(ends, torch.arange(total, dtype=ends.dtype, device=device), right=True)
    owner_kind = meta[:, 0][run.clamp_(max=meta.shape[0] - 1)]
    owner, kind = owner_kind >> 1, owner_kind & 1
    valid = rows >= 0
    if glob.size:
        g = device_copy(glob, device)
        at = torch.searchsorted(g, rows).clamp_(max=g.numel() - 1)
        valid &= g[at] != rows
    # sort key (request, row, kind): a request's deny entry of a row sorts before its allow
    # entries, so keeping only first occurrences drops allow ∩ deny and every duplicate
    # in int32 when every key fits: the radix sort then makes half the passes
    dtype = torch.int32 if 2 * batch * max(n, 1) + 1 < KEY32_LIMIT else torch.int64
    sentinel = torch.iinfo(dtype).max
    key = torch.where(valid, ((owner * n + rows) << 1) | kind, sentinel).to(dtype)
    key = torch.sort(key).values
    base_key = key >> 1
    first = torch.ones_like(valid)
    first[1:] = base_key[1:] != base_key[:-1]
    live = key != sentinel
    req = torch.where(live, base_key // max(n, 1), 0)
    keep = live & first & ((key & 1) == mode_dev[req])
    # compaction by scatter (a boolean index would synchronise to size its result)
    slot = torch.cumsum(keep, 0) - 1
    packed = torch.full((total + 1,), sentinel >> 1, dtype=dtype, device=device)
    packed.scatter_(0, torch.where(keep, slot, total), base_key)
    packed = packed[:total]
    bounds = torch.arange(batch + 1, dtype=dtype, device=device) * n
    return torch.searchsorted(packed, bounds), (packed % max(n, 1)).long()


GRAPH_MAX_IDS = 1 << 21
"""Most per-call ids whose device build is captured in a CUDA graph (:class:`GraphedBuild`);
its buffers stay reserved per (batch, capacity), so the widest builds run eagerly. 2^21 holds
an allow list of 1 % of a 2·10^7-item catalog at batch 8 (1.6 M ids)."""
_CAPTURE_LOCK = threading.Lock()


class GraphedBuild:
    """The device build of one (catalog table, device, batch, capacity) shape, captured once
    in a CUDA graph: the eager build issues some 60 small launches a call, whose host cost
    (not the GPU's) made it last a millisecond or two whatever the list size.

    A call gathers its ids into a pinned block and copies them in, pads them on the device with
    an id the table does not hold, copies in the entries' ``(request · 2 + kind, count)`` runs
    (padded with one run over the padding and empty runs) and the modes, and replays the
    graph; the lists are clones of the graph's outputs, so a later build never changes them. Calls take turns, and one refills the buffers only after the previous
    call's copy, replay and clones finished (whatever stream it ran on).

    Parameters
    ----------
    table : tuple of (int, torch.Tensor)
        :func:`device_id_table`'s ``(base, table)``.
    device : torch.device
        A CUDA device (on a CPU nothing is captured: each call runs the same steps eagerly).
    batch, n_items, capacity : int
        Requests, catalog rows, and the ids the shape holds (a power of two).
    """

    def __init__(self, table, device, batch: int, n_items: int, capacity: int):
        device = torch.device(device)
        cuda = device.type == "cuda"
        self.table, self.batch, self.n, self.capacity = table, batch, n_items, capacity
        self.runs = 2 * batch + 1
        size = capacity + 2 * self.runs + batch
        self.host = torch.zeros(size, dtype=torch.int64, pin_memory=cuda)
        self._host = self.host.numpy()
        self.block = torch.zeros(size, dtype=torch.int64, device=device)
        self.pad_id = table[0] - 1
        self.graph = self.outputs = None
        # one call at a time: its staging, copy, replay and clones use the shared buffers,
        # which the next call refills only once that work is done (``done``: a no-op to wait
        # on before its first record)
        self.lock = threading.Lock()
        self.done = torch.cuda.Event() if cuda else None
        if cuda:  # (on a CPU, as in the tests, every call builds eagerly from the same padded block)
            ids, meta, _ = self._views()
            meta[:, 1] = 0
            meta[0, 1] = capacity  # a valid layout for the warm-up: every id a miss
            ids.fill_(self.pad_id)
            self.graph, self.outputs = capture(lambda: self._build(*self._views()))

    def _views(self):
        c, r = self.capacity, self.runs
        return self.block[:c], self.block[c:c + 2 * r].view(r, 2), self.block[c + 2 * r:]

    def _build(self, ids, meta, mode):
        return _compact(_table_rows(ids, self.table), meta, mode, np.zeros(0, dtype=np.int64), self.batch,
                        self.n, self.capacity, ids.device)

    def __call__(self, id_parts: list, id_sizes: list, mode: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """``(offsets, rows)`` of the lists given as ``id_parts`` (1-D integer numpy arrays, or
        tensors on the device or pinned) owned by ``id_sizes`` ``(request, kind, count)``, with the
        requests' ``mode``. Thread-safe."""
        with self.lock:
            return self._call(id_parts, id_sizes, mode)

    def _call(self, id_parts: list, id_sizes: list, mode: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if self.done is not None:
            self.done.synchronize()
        c, r, host = self.capacity, self.runs, self._host
        total = sum(k for _, _, k in id_sizes)
        meta = host[c:c + 2 * r].reshape(r, 2)
        meta[:] = 0
        k = len(id_sizes)
        if k:
            meta[:k] = [(req * 2 + kind, count) for req, kind, count in id_sizes]
        meta[k] = (0, c - total)
        host[c + 2 * r:] = mode
        gathered, tensors = place_ids(id_parts, self.host, 0)
        if gathered:
            self.block[:gathered].copy_(self.host[:gathered], non_blocking=True)
        copy_tensors(tensors, self.block)
        self.block[total:c].fill_(self.pad_id)
        self.block[c:].copy_(self.host[c:], non_blocking=True)
        if self.graph is None:
            return self._build(*self._views())
        self.graph.replay()
        offsets, rows = self.outputs
        out = offsets.clone(), rows.clone()
        self.done.record()
        return out


def _graphed_build(catalog, table, device, batch: int, total: int):
    """The :class:`GraphedBuild` that holds ``total`` ids (built and captured on first use,
    kept with the catalog's device table, so it goes when the catalog goes), or ``None``
    past :data:`GRAPH_MAX_IDS`."""
    capacity = max(DEVICE_MIN_IDS, 1 << max(total - 1, 0).bit_length())
    if capacity > GRAPH_MAX_IDS:
        return None
    key = ("graph", str(torch.device(device)), batch, capacity)
    with _CAPTURE_LOCK:  # two threads never capture the same shape, nor at once
        per_lookup = _TABLES.setdefault(catalog._id_lookup, {})
        if key not in per_lookup:
            per_lookup[key] = GraphedBuild(table, device, batch, catalog.n_items, capacity)
        return per_lookup[key]
