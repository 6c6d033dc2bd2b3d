"""The static list buffers of a captured constrained shape: each call's lists are staged in
a pinned block and copied into persistent device buffers that the CUDA graph reads
(:class:`ListBuffers`); :func:`attach_lists` gives the engine's step runners their
constraint over them. The lists themselves, and how a slot is judged, are
:mod:`zerogr_core.decode.constraints`.
"""
from __future__ import annotations

import numpy as np
import torch

from zerogr_kernels.allow_nodes import allow_nodes
from zerogr_kernels.constraints import SlotLists, search_iterations
from zerogr_kernels.deny_ids import IN_PLACE_WIDTH, deny_rows
from zerogr_kernels.list_spans import list_spans

from ..errors import ZeroGRError
from ..index.layout import StepIndex
from .constraints import RequestLists, RowMarks, glob_run, row_floors, row_starts
from .device_lists import copy_tensors, lookup_table, place_ids
from .id_lists import AllowIds, node_tables

MIN_CAPACITY = 1024
"""Smallest list buffer of a captured shape; capacities grow by powers of two."""


def capacity_for(rows_needed: int) -> int:
    """List-buffer capacity of a captured shape: the next power of two ≥ the rows, at least
    :data:`MIN_CAPACITY`. A call with more listed rows re-captures with a larger buffer."""
    cap = MIN_CAPACITY
    while cap < rows_needed:
        cap *= 2
    return cap


class ListBuffers:
    """Persistent list buffers of a captured shape (``capacity`` rows), one block per side.

    One int64 device block holds, in order, the offsets (``batch + 2``), the modes
    (``batch`` int32, in ``batch`` int64 slots) and the rows (the global deny list first,
    then the requests' lists); :attr:`offsets`, :attr:`mode` and :attr:`rows` are views of
    it, which the captured graph reads. A pinned host block of the same layout stages each
    call's lists, so a call is one or two non-blocking copies (header and rows; the global
    list only when it changed). ``loaded_glob`` is the global array last copied in, so a run
    of calls with the same global list (one live-catalog version, or a registered deny set)
    copies only the per-request rows. ``marks`` is the bitmap of the listed rows
    (:class:`RowMarks` over ``n_rows`` catalog rows), and ``spans`` bound each segment's
    longest run of consecutive rows (:func:`~zerogr_kernels.list_spans.list_spans`): the first
    step of every replay refills both from the rows.

    With ``width`` (deny ids, :class:`~zerogr_core.decode.id_lists.DenyIds`) the header also
    holds the offsets of each request's ids, which follow it back to back, request
    ``r``'s rows are ``rows[r * width:(r + 1) * width]`` (no global list), and the replay's
    first kernel writes them from the ids (:func:`zerogr_kernels.deny_ids.deny_rows`). On a GPU,
    up to :data:`~zerogr_kernels.deny_ids.IN_PLACE_WIDTH`, that kernel reads the id offsets and the
    ids where the call wrote them, in the pinned block (:attr:`in_place`): a call is then a
    write into host memory and the replay, with no copy to launch; the offsets and modes,
    the same for every call of the shape, cross once.

    With ``nodes`` (a :class:`~zerogr_core.decode.id_lists.NodeTables`; allow ids,
    :class:`~zerogr_core.decode.id_lists.AllowIds`) the header holds the id offsets, ``capacity``
    ids follow it, every request's row segment stays empty, and the replay's first kernel
    (:func:`zerogr_kernels.allow_nodes.allow_nodes`) fills :attr:`nodes`, each request's bitmaps of
    the successors that hold an allowed row, which the filters read instead of searching rows.

    A decode resolves its lists first (:meth:`begin`: ``deny_rows`` in width mode, ``allow_nodes``
    in bitmap mode, else the row bitmap), on a side stream that forks from the decode's stream, so
    this work overlaps the model's first step and projection, and the first filter waits for it
    (:meth:`join`). Read in
    place, the pinned block is guarded by an event recorded right after ``deny_rows``, inside the
    captured graph (an external event node), so the next call stages its ids as soon as they are
    read, with no event recorded on the host per call.
    """

    def __init__(self, batch: int, capacity: int, device, n_rows: int = 1, width: int = 0, nodes=None,
                 copy_ids: bool = False):
        device = torch.device(device)
        self.batch, self.capacity, self.width = batch, capacity, width
        # bitmap mode (allow ids): ``capacity`` ids, each request's bitmaps of alive successors, no rows
        self.nodes = None if nodes is None else torch.zeros(batch, nodes.stride, dtype=torch.int32, device=device)
        self.marks = RowMarks(1 if nodes is not None else n_rows, device)
        # width and bitmap modes (deny and allow ids, :mod:`.id_lists`): the ids' offsets in the header
        # too, then the ids
        self.header = 3 * batch + 3 if width or nodes is not None else 2 * batch + 2
        rows_at = self.header + (capacity if nodes is not None else batch * width)
        size = rows_at + (1 if nodes is not None else capacity)
        self.block = torch.zeros(size, dtype=torch.int64, device=device)
        self.offsets = self.block[:batch + 2]
        self.mode = self.block[batch + 2:2 * batch + 2].view(torch.int32)[:batch]
        self.id_offsets = self.block[2 * batch + 2:self.header]
        self.ids = self.block[self.header:rows_at]
        self.rows = self.block[rows_at:]
        # bounds on each segment's longest run of consecutive rows (the global list's first, 0 in
        # width mode), which the first step of every replay writes (not in bitmap mode: allow ids)
        self.spans = torch.zeros(batch + 1, dtype=torch.int64, device=device) if nodes is None else None
        cuda = device.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.int64, pin_memory=cuda)
        self._host = self.host.numpy()
        self._host_mode = self._host[batch + 2:2 * batch + 2].view(np.int32)[:batch]
        if width:  # request r's rows are always rows[r * width:(r + 1) * width]: no global list
            self._host[1:batch + 2] = np.arange(batch + 1, dtype=np.int64) * width
        # the last copies out of ``host`` (in place: the last ``deny_rows`` reading it, an event the
        # graph records), refilled only once done
        self.copied = torch.cuda.Event(external=True) if cuda else None
        self.pending = False
        # resolving the lists (set by :func:`attach_lists`), and where it runs beside the decode
        self.resolve = None
        self.side = torch.cuda.Stream(device) if cuda else None
        self.resolved = torch.cuda.Event() if cuda else None
        self.loaded_glob = None
        self.loaded_lists = None  # standing lists last loaded (:meth:`load`)
        self.table = None  # id modes: the id table the captured graph reads, of the catalog lookup below
        self.lookup = None
        self.in_place = bool(cuda and width and width <= IN_PLACE_WIDTH and not copy_ids)
        self.header_loaded = None  # width mode: the requests' mode last written (and, in place, copied)
        if self.in_place:  # the kernel's views of the pinned block
            self.id_offsets = self.host[2 * batch + 2:self.header]
            self.ids = self.host[self.header:rows_at]

    def load(self, lists: "RequestLists") -> None:
        """Stage ``lists`` in the pinned block and copy them in, stream-ordered before the
        replay that reads them (no host synchronisation but the previous copy's). Standing lists
        (the same :class:`RequestLists` object call after call, which the decodes only read) that
        were the last ones loaded are in place already: nothing is written or copied."""
        if lists is self.loaded_lists:
            return
        self.loaded_lists = None
        if self.pending:
            self.copied.synchronize()
        if self.width:
            return self._load_ids(lists)
        if self.nodes is not None:
            return self._load_allow(lists)
        if isinstance(lists.rows, torch.Tensor):
            return self._load_device(lists)
        b, h, g, r = self.batch, self.header, int(lists.glob.size), int(lists.rows.size)
        host = self._host
        host[0] = 0
        np.add(lists.offsets, g, out=host[1:b + 2])
        lists.device_mode(out=self._host_mode)
        fresh = g and self.loaded_glob is not lists.glob
        if fresh:
            host[h:h + g] = lists.glob
        host[h + g:h + g + r] = lists.rows
        if fresh or not g:
            self.block[:h + g + r].copy_(self.host[:h + g + r], non_blocking=True)
        else:
            self.block[:h].copy_(self.host[:h], non_blocking=True)
            if r:
                self.block[h + g:h + g + r].copy_(self.host[h + g:h + g + r], non_blocking=True)
        # with no global list the request rows start at 0 and overwrite the old one
        self.loaded_glob = lists.glob if g else None
        self._guard()
        self.loaded_lists = lists if lists.standing else None


    def _load_ids(self, lists) -> None:
        """Deny ids (:class:`~zerogr_core.decode.id_lists.DenyIds`): the header and the ids
        back to back in the pinned block, then one copy of both."""
        host, b, h = self._host, self.batch, self.header
        # every request of such lists has the same mode, which the pinned block keeps between calls
        fresh = self.header_loaded != lists.mode
        if fresh:
            lists.device_mode(out=self._host_mode)
            self.header_loaded = lists.mode
        host[2 * b + 3:h] = lists.ends
        n = lists.n_ids
        if lists.on_device:  # never in place (the shape's key): numpy ids cross with the header, tensors after
            gathered, tensors = place_ids(lists.parts, self.host, h)
            self.block[:gathered].copy_(self.host[:gathered], non_blocking=True)
            if len(tensors) == len(lists.parts):  # one launch for the batch (a copy per request cost more)
                torch.cat(lists.parts, out=self.block[h:h + n])
            else:
                copy_tensors(tensors, self.block)
            self._guard()
            return
        if n:
            np.concatenate(lists.parts, out=host[h:h + n])
        if not self.in_place:
            self.block[:h + n].copy_(self.host[:h + n], non_blocking=True)
            self._guard()
        elif fresh:
            self.block[:2 * b + 2].copy_(self.host[:2 * b + 2], non_blocking=True)
            self._guard()

    def _load_allow(self, lists) -> None:
        """Allow ids (:class:`~zerogr_core.decode.id_lists.AllowIds`): the header and the numpy ids
        back to back in the pinned block, one copy of both, then the tensors' copies (every
        request's row segment stays empty: the bitmaps hold the lists)."""
        host, b, h = self._host, self.batch, self.header
        lists.device_mode(out=self._host_mode)
        host[2 * b + 3:h] = lists.ends
        gathered, tensors = place_ids(lists.parts, self.host, h)
        self.block[:gathered].copy_(self.host[:gathered], non_blocking=True)
        copy_tensors(tensors, self.block)
        self._guard()

    def begin(self) -> None:
        """At the start of a decode: resolve its lists on the side stream (inline on a CPU),
        after the work queued so far, then guard the pinned block they were read from."""
        if self.side is None:
            self.resolve()
            return
        self.side.wait_stream(torch.cuda.current_stream(self.side.device))
        with torch.cuda.stream(self.side):
            self.resolve()
            if self.in_place:
                self.copied.record(self.side)
            self.resolved.record(self.side)

    def join(self) -> None:
        """Before the decode's first filter: wait for :meth:`begin`'s work."""
        if self.resolved is not None:
            torch.cuda.current_stream(self.side.device).wait_event(self.resolved)

    def launched(self) -> None:
        """After the decode that reads this call's lists was launched: with the ids read in
        place, the pinned block is refilled only once ``deny_rows`` has read them (the event
        :meth:`begin` records inside the decode; no wait here)."""
        if self.in_place and self.copied is not None:
            self.pending = True

    def _guard(self) -> None:
        """The pinned block is read by work queued so far: the next :meth:`load` waits for it."""
        if self.copied is not None:
            self.copied.record()
            self.pending = True

    def _load_device(self, lists) -> None:
        """Lists built on the device (:class:`~zerogr_core.decode.device_lists.DeviceRequestLists`):
        the modes and a changed global list cross from the pinned block, the offsets and
        rows are copied device to device, all stream-ordered and without synchronising."""
        b, h, g, r = self.batch, self.header, int(lists.glob.size), int(lists.rows.numel())
        lists.device_mode(out=self._host_mode)
        fresh = g and self.loaded_glob is not lists.glob
        if fresh:
            self._host[h:h + g] = lists.glob
        end = h + g if fresh else h
        self.block[:end].copy_(self.host[:end], non_blocking=True)
        # after the header's copy on the same stream, so these values win
        self.block[0] = 0
        torch.add(lists.offsets, g, out=self.block[1:b + 2])
        if r:
            self.block[h + g:h + g + r].copy_(lists.rows, non_blocking=True)
        self.loaded_glob = lists.glob if g else None
        self._guard()


def attach_lists(runners, index: StepIndex, batch: int, capacity: int, normalise: str = "request",
                 ids=None, skip: int = 0) -> ListBuffers:
    """Give each engine step runner a constraint over shared static list buffers.

    The buffers live as long as the shape; :func:`load_lists` refills them before a
    replay, so the captured graph reads each call's lists. ``n_iter`` follows the
    capacity, never one call's lists, so the graph stays valid for every fill. Under
    ``normalise="catalog"`` the filter defers the slots only a request's own list removes and
    the runners' selection counts them in its normaliser, then drops them
    (:func:`zerogr_kernels.topk_gather`'s ``deferred``); the shape then serves
    catalog-normalised lists only. With ``ids`` (a :class:`~zerogr_core.decode.id_lists.DenyIds`
    or :class:`~zerogr_core.decode.id_lists.AllowIds`) the buffers take such ids, looked up in
    the device copy of its catalog's id table, which the shape keeps (fetched here, under the
    engine's lock, so a first copy never meets another thread's capture). The first ``skip`` steps run
    without the lists (:func:`listed_from`: no prefix of theirs can be emptied by the lists the shape
    serves).
    """
    catalog = normalise == "catalog"
    dev = index.device
    width = getattr(ids, "width", 0)
    tables = node_tables(index) if isinstance(ids, AllowIds) else None
    buffers = ListBuffers(batch, capacity, dev, index.n_items, width, tables, copy_ids=getattr(ids, "copied", False))
    if ids is not None:  # under the engine's lock: a first copy of the table never meets a capture
        buffers.lookup = ids.lookup
        base, buffers.table = lookup_table(ids.lookup, dev)
    starts = row_starts(index)
    n_iter = search_iterations(capacity)
    marks = buffers.marks

    def resolve() -> None:  # this call's ids into rows or bitmaps, and the rows into the row bitmap
        if width:  # marking the rows it writes (no global list here)
            deny_rows(buffers.ids, buffers.id_offsets, width, buffers.table, base, buffers.rows, buffers.offsets,
                      index.n_items, **marks.args, spans=buffers.spans[1:])
        elif tables is not None:
            allow_nodes(buffers.ids, buffers.id_offsets, buffers.table, base, tables.rank_bits, tables.rank_before,
                        tables.level_words, buffers.nodes, tables.derived)
        else:
            marks.mark(buffers.offsets, buffers.rows)
            list_spans(buffers.offsets, buffers.rows, buffers.spans)

    buffers.resolve = resolve
    # deny ids: at most ``width`` rows per request and no global list, so a step whose every
    # successor holds more rows keeps all its slots; its filter runs without the lists, and the
    # first filter with them waits for them (deny_rows overlaps the steps before); row lists the
    # same from the host's bound (``skip``)
    floors = row_floors(index)
    constrained = [level >= skip and (not width or floors[level] <= width) for level in range(len(runners))]
    first = constrained.index(True)

    def make(level: int, beams: int):
        if not constrained[level]:
            return None, None
        if tables is not None:  # one load per slot in its request's bitmap of the step
            extra = {"nodes": buffers.nodes, "node_off": tables.words[level], "node_stride": tables.stride}
        else:
            extra = dict(marks.args, spans=buffers.spans, floor=floors[level])
        lists = SlotLists(starts[level], buffers.offsets, buffers.rows, buffers.mode, beams, n_iter, catalog,
                          **extra)
        return lists, buffers.join if level == first else None

    for level, runner in enumerate(runners):
        runner.slot_lists, runner.prepare_lists = make(level, runner.filter_out.slot_succ.shape[0] // batch)
        runner.deferred = catalog
    return buffers


def listed_from(index: StepIndex, lists) -> int:
    """The first step whose slots ``lists`` may kill, for deny lists that are only a global segment
    (a registered deny set that every request names, a catalog version's deletions): the segment
    empties no prefix of more rows than its run bound (:func:`glob_run`), so the steps whose every
    successor holds more (:func:`row_floors`) run without the lists, and the lists' marks and run
    bounds overlap them. 0 for every other list (requests' own rows change from call to call, and a
    shape per bound would re-capture while serving; an allow list empties every prefix it lists
    nothing of)."""
    if not isinstance(lists, RequestLists) or lists.rows.size or not lists.glob.size or (
            not lists.standing and (lists.mode & 1).any()):  # a standing set allows nothing
        return 0
    bound = glob_run(lists.glob)
    floors = row_floors(index)
    first = 0
    while first < len(floors) - 1 and floors[first] > bound:
        first += 1
    return first


def load_lists(buffers: ListBuffers, lists: RequestLists) -> None:
    """Copy ``lists`` into a shape's static buffers (stream-ordered before the replay)."""
    if lists.total_rows > buffers.capacity:
        raise ZeroGRError(f"{lists.total_rows} listed rows exceed the buffer capacity {buffers.capacity}")
    if lists.batch != buffers.batch:
        raise ZeroGRError(f"lists cover {lists.batch} requests, the shape has {buffers.batch}")
    width = getattr(lists, "width", 0)
    if bool(width) != bool(buffers.width) or width > buffers.width:
        raise ZeroGRError(f"lists of {width} ids per request, the shape takes {buffers.width}")
    if isinstance(lists, AllowIds) != (buffers.nodes is not None):
        raise ZeroGRError("allow ids need a shape with bitmaps, and only such a shape takes them")
    buffers.load(lists)
