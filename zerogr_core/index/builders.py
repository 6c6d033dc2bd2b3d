"""Index construction: the layout-guided two-pass builder and its two baselines.

With ``h_i = LCP(T[i-1], T[i])`` (``h_0 = 0``), row i contributes one entry to every step
l ≥ h_i (0-based). So for step l the entry rows are ``h <= l``, their tokens are
``T[rows, l]``, and the states of step l (entries of step l-1) open wherever ``h < l``
among those rows. Pass 1 counts, per chunk of rows and per step, the entries a chunk
contributes; exclusive prefix sums over chunks give every chunk its output range; pass 2
lets each chunk write its tokens and segment starts straight into the final arrays.

Builders (all byte-identical):

``layout``
    Two passes on threads. On a CUDA device the output streams to the GPU through
    reusable pinned staging buffers on a side stream, so filling and copying overlap.
``host-copy``
    The same two passes into host arrays, then one copy of the whole index.
``serial``
    The naive baseline: per step, a sort-based ``np.unique`` over packed prefixes.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ..catalog.catalog import Catalog, token_dtype
from ..devices import as_device
from ..errors import ZeroGRError
from .config import BUILDERS, INDEX_PRESETS, IndexConfig, offset_dtype
from .layout import StepIndex, StepMapping, torch_dtype


def _chunk_bounds(n: int, chunk_rows: int) -> list[tuple[int, int]]:
    return [(a, min(a + chunk_rows, n)) for a in range(0, n, chunk_rows)]


def _chunk_lcp(sids: np.ndarray, a: int, b: int) -> np.ndarray:
    """LCP of rows a..b-1 with their predecessors (row 0 gets 0), int8."""
    lo = max(a - 1, 0)
    block = sids[lo:b]
    h = np.zeros(b - a, dtype=np.int8)
    alive = np.ones(block.shape[0] - 1, dtype=bool)
    for level in range(sids.shape[1]):
        col = block[:, level]
        alive &= col[1:] == col[:-1]
        h[b - a - alive.size:] += alive
    return h


def _pass1(sids: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    h = _chunk_lcp(sids, a, b)
    if (h == sids.shape[1]).any():
        raise ZeroGRError(f"row {a + int(np.argmax(h == sids.shape[1])) + 1}: duplicate SID; "
                          "build the catalog with the collision option")
    counts = np.bincount(h, minlength=sids.shape[1])[:sids.shape[1]].cumsum()
    return h, counts


class _Layout:
    """Result of pass 1: per-row LCPs and each chunk's output ranges in every step."""

    def __init__(self, sids: np.ndarray, config: IndexConfig, pool: ThreadPoolExecutor):
        self.sids = sids
        self.levels = sids.shape[1]
        self.bounds = _chunk_bounds(sids.shape[0], config.chunk_rows)
        results = list(pool.map(lambda ab: _pass1(sids, *ab), self.bounds))
        self.h = [r[0] for r in results]
        counts = np.stack([r[1] for r in results])  # (chunks, L) entries per chunk and step
        self.entry_start = np.zeros_like(counts)
        self.entry_start[1:] = np.cumsum(counts, axis=0)[:-1]
        self.chunk_entries = counts
        self.entries = counts.sum(axis=0)
        self.states = np.concatenate([[1], self.entries[:-1]])

    def chunk_state_range(self, chunk: int, level: int) -> tuple[int, int]:
        """Rows of R_l that ``chunk`` writes: the states it opens at step ``level``."""
        if level == 0:
            return (0, 1) if chunk == 0 else (0, 0)
        start = int(self.entry_start[chunk, level - 1])
        return start, start + int(self.chunk_entries[chunk, level - 1])

    def fill(self, chunk: int, level: int, tokens_out: np.ndarray, offsets_out: np.ndarray) -> None:
        """Pass 2 for one (chunk, step): write the chunk's tokens and segment starts."""
        a, _ = self.bounds[chunk]
        hc = self.h[chunk]
        mask = hc <= level
        rows = np.flatnonzero(mask)
        tokens_out[:] = self.sids[a + rows, level]
        if level == 0:
            offsets_out[:] = 0
            return
        starts = np.flatnonzero(hc[mask] < level)
        np.add(starts, self.entry_start[chunk, level], out=offsets_out, casting="unsafe")


def _finish_offsets(offsets: np.ndarray | torch.Tensor, entries: int) -> None:
    offsets[-1] = entries


def _empty_arrays(layout: _Layout, sizes) -> tuple[list[np.ndarray], list[np.ndarray]]:
    tokens = [np.empty(int(layout.entries[l]), dtype=token_dtype(sizes[l])) for l in range(layout.levels)]
    offsets = [np.empty(int(layout.states[l]) + 1, dtype=offset_dtype(int(layout.entries[l])))
               for l in range(layout.levels)]
    return tokens, offsets


def _host_fill(layout: _Layout, sizes, pool: ThreadPoolExecutor):
    tokens, offsets = _empty_arrays(layout, sizes)

    def task(job):
        chunk, level = job
        e0 = int(layout.entry_start[chunk, level])
        e1 = e0 + int(layout.chunk_entries[chunk, level])
        s0, s1 = layout.chunk_state_range(chunk, level)
        layout.fill(chunk, level, tokens[level][e0:e1], offsets[level][s0:s1])

    list(pool.map(task, [(c, l) for c in range(len(layout.bounds)) for l in range(layout.levels)]))
    for level in range(layout.levels):
        _finish_offsets(offsets[level], int(layout.entries[level]))
    return tokens, offsets


def serial_arrays(sids: np.ndarray, sizes) -> tuple[list, list]:
    """Naive serial construction: distinct prefixes by sorting, one step at a time.

    Parameters
    ----------
    sids : np.ndarray, shape (N, L)
        Sorted SID rows.
    sizes : sequence of int
        Codebook size per level.

    Returns
    -------
    tokens, offsets : list of np.ndarray
        Per step the sparse mapping's tokens (E_l,) and offsets (E_{l-1} + 1,).
    """
    n, levels = sids.shape
    bits = [max(int(s - 1).bit_length(), 1) for s in sizes]
    tokens, offsets = [], []
    prev_keys = None
    key = np.zeros(n, dtype=np.int64)
    for level in range(levels):
        if sum(bits[:level + 1]) > 63:
            raise ZeroGRError("the serial baseline needs SID prefixes that pack into 63 bits")
        key = (key << bits[level]) | sids[:, level].astype(np.int64)
        uniq, first = np.unique(key, return_index=True)
        tokens.append(sids[first, level].astype(token_dtype(sizes[level])))
        odt = offset_dtype(uniq.size)
        if level == 0:
            offsets.append(np.array([0, uniq.size], dtype=odt))
        else:
            parent = np.searchsorted(prev_keys, uniq >> bits[level])
            offsets.append(np.searchsorted(parent, np.arange(prev_keys.size + 1)).astype(odt))
        prev_keys = uniq
    return tokens, offsets


def _mapping(level: int, kind: str, codebook: int, tokens, offsets, states: int, entries: int):
    """Wrap one step's arrays (numpy or torch, any device) into a StepMapping."""
    tokens = torch.as_tensor(tokens)
    offsets = torch.as_tensor(offsets)
    seg = offsets[1:] - offsets[:-1]
    max_segment = int(seg.max()) if seg.numel() else 0
    if kind == "sparse":
        return StepMapping(level, kind, codebook, states, entries, max_segment, tokens=tokens, offsets=offsets)
    # Dense: successor of every (state, token) pair; entry position e is the successor.
    state_of_entry = torch.repeat_interleave(torch.arange(states, device=offsets.device), seg.to(torch.int64))
    table = torch.full((states, codebook), -1, dtype=offsets.dtype, device=offsets.device)
    table[state_of_entry, tokens.to(torch.int64)] = torch.arange(entries, dtype=offsets.dtype,
                                                                 device=offsets.device)
    return StepMapping(level, kind, codebook, states, entries, max_segment, table=table)


def _assemble(tokens, offsets, sizes, config: IndexConfig, n_items: int, build: dict) -> StepIndex:
    steps = []
    for level, (tok, off) in enumerate(zip(tokens, offsets)):
        states, entries = off.shape[0] - 1, tok.shape[0]
        kind = config.choose(level, sizes[level], states, entries)
        steps.append(_mapping(level, kind, sizes[level], tok, off, states, entries))
    return StepIndex(steps, tuple(sizes), n_items, config, build)


def _stream_to_device(layout: _Layout, sizes, device: torch.device, config: IndexConfig,
                      pool: ThreadPoolExecutor, build: dict):
    """Pass 2 into pinned staging buffers, copied to ``device`` on a side stream."""
    levels = layout.levels
    tok_dtypes = [token_dtype(sizes[l]) for l in range(levels)]
    off_dtypes = [offset_dtype(int(layout.entries[l])) for l in range(levels)]
    dev_tokens = [torch.empty(int(layout.entries[l]), dtype=torch_dtype(tok_dtypes[l]), device=device)
                  for l in range(levels)]
    dev_offsets = [torch.empty(int(layout.states[l]) + 1, dtype=torch_dtype(off_dtypes[l]), device=device)
                   for l in range(levels)]
    # One staging buffer holds the largest chunk's output for every step.
    chunk_bytes = (layout.chunk_entries * np.array([d.itemsize for d in tok_dtypes])).sum(axis=1)
    chunk_bytes += (np.concatenate([np.ones((len(layout.bounds), 1), np.int64), layout.chunk_entries[:, :-1]],
                                   axis=1) * np.array([d.itemsize for d in off_dtypes])).sum(axis=1)
    cap = int(chunk_bytes.max()) + 16 * 2 * levels
    n_buf = max(1, min(config.staging_buffers, 2))
    buffers = [torch.empty(cap, dtype=torch.uint8, pin_memory=True) for _ in range(n_buf)]
    events = [torch.cuda.Event() for _ in range(n_buf)]
    stream = torch.cuda.Stream(device=device)
    fill_s = 0.0
    copied = 0
    for chunk in range(len(layout.bounds)):
        slot = chunk % n_buf
        events[slot].synchronize()  # the buffer's previous copy has landed
        t0 = time.perf_counter()
        host = buffers[slot].numpy()
        pieces, pos = [], 0
        for level in range(levels):
            e0 = int(layout.entry_start[chunk, level])
            ne = int(layout.chunk_entries[chunk, level])
            s0, s1 = layout.chunk_state_range(chunk, level)
            pos = -(-pos // 8) * 8
            tok_view = host[pos:pos + ne * tok_dtypes[level].itemsize].view(tok_dtypes[level])
            pos += ne * tok_dtypes[level].itemsize
            pos = -(-pos // 8) * 8
            off_view = host[pos:pos + (s1 - s0) * off_dtypes[level].itemsize].view(off_dtypes[level])
            pos += (s1 - s0) * off_dtypes[level].itemsize
            pieces.append((level, e0, ne, s0, s1, tok_view, off_view))
        list(pool.map(lambda p: layout.fill(chunk, p[0], p[5], p[6]), pieces))
        fill_s += time.perf_counter() - t0
        with torch.cuda.stream(stream):
            for level, e0, ne, s0, s1, tok_view, off_view in pieces:
                if ne:
                    dev_tokens[level][e0:e0 + ne].copy_(torch.from_numpy(tok_view), non_blocking=True)
                if s1 > s0:
                    dev_offsets[level][s0:s1].copy_(torch.from_numpy(off_view), non_blocking=True)
                copied += tok_view.nbytes + off_view.nbytes
            events[slot].record(stream)
    t0 = time.perf_counter()
    stream.synchronize()
    build["h2d_tail_s"] = time.perf_counter() - t0
    build["fill_s"] = fill_s
    build["h2d_bytes"] = copied
    for level in range(levels):
        dev_offsets[level][-1] = int(layout.entries[level])
    return dev_tokens, dev_offsets


H2D_PHASE = "H2D (not hidden)"


def build_phases(build: dict) -> dict[str, float]:
    """Seconds per phase of a build's timings (``StepIndex.build``).

    ``layout pass``, ``fill``, :data:`H2D_PHASE` and ``assemble``. The H2D phase is the copy
    time the build waited for: all of it (``h2d_s``) when the copy follows the fill
    (host-copy, serial), the tail after the last chunk (``h2d_tail_s``) when streaming,
    where the rest overlaps filling. ``assemble`` is what the total holds beyond the other
    three (wrapping the arrays into mappings, dense tables).
    """
    phases = {"layout pass": build.get("layout_pass_s", 0.0), "fill": build.get("fill_s", 0.0),
              H2D_PHASE: build["h2d_s"] if "h2d_s" in build else build.get("h2d_tail_s", 0.0)}
    phases["assemble"] = max(0.0, build.get("total_s", 0.0) - sum(phases.values()))
    return phases


def h2d_gbps(build: dict) -> float | None:
    """Host-to-device rate of one build in GB/s, or ``None`` when nothing was copied.

    A copy after the fill is timed alone (``h2d_s``); a streaming copy runs while the
    chunks fill, so its time is the fill plus the tail not hidden behind it.
    """
    nbytes = build.get("h2d_bytes")
    seconds = build["h2d_s"] if "h2d_s" in build else build.get("fill_s", 0.0) + build.get("h2d_tail_s", 0.0)
    return nbytes / seconds / 1e9 if nbytes and seconds > 0 else None


def _index_config(config) -> IndexConfig:
    """``config`` as an :class:`IndexConfig`: a preset's name resolves to the preset."""
    if config is None:
        return IndexConfig()
    if isinstance(config, str) and config in INDEX_PRESETS:
        return INDEX_PRESETS[config]
    if not isinstance(config, IndexConfig):
        raise ZeroGRError(f"config: expected an IndexConfig or one of {', '.join(INDEX_PRESETS)}, got {config!r}")
    return config


def build_index(catalog: Catalog, device=None, builder: str = "layout",
                config: IndexConfig | None = None) -> StepIndex:
    """Build the step-sliced index of ``catalog``.

    Parameters
    ----------
    catalog : Catalog
        Sorted, unique SID table (N, L).
    device : str or torch.device, optional
        Where the index lives (default CPU). With a CUDA device the ``layout`` builder
        streams its output to the GPU during construction.
    builder : {"layout", "host-copy", "serial"}
    config : IndexConfig or str, optional
        Representation rule and builder settings, or the name of one of ``INDEX_PRESETS``
        (default ``INDEX_PRESETS["default"]``).

    Returns
    -------
    StepIndex
        ``build`` holds the timings: ``layout_pass_s``, ``fill_s``, ``h2d_s`` (or
        ``h2d_tail_s`` for streaming, the copy time not hidden behind filling), ``total_s``.
    """
    if not isinstance(catalog, Catalog):  # a bare SID table has no validation, order or item ids yet
        raise ZeroGRError(f"catalog: expected a Catalog (Catalog.from_sids), got {type(catalog).__name__}")
    if builder not in BUILDERS:
        raise ZeroGRError(f"builder must be one of {', '.join(BUILDERS)}, got {builder!r}")
    config = _index_config(config)
    beyond = [step for step, _ in config.overrides if step > catalog.n_levels]
    if beyond:
        raise ZeroGRError(f"override step {beyond[0]}: the catalog has {catalog.n_levels} steps (numbered from 1)")
    device = as_device(device, default="cpu")
    sids = catalog.sids
    sizes = catalog.codebook_sizes
    build: dict = {"builder": builder, "device": str(device), "rows": catalog.n_items}
    t_start = time.perf_counter()
    if builder == "serial":
        tokens, offsets = serial_arrays(sids, sizes)
        build["fill_s"] = time.perf_counter() - t_start
    else:
        workers = config.workers or os.cpu_count() or 1
        with ThreadPoolExecutor(max_workers=workers) as pool:
            layout = _Layout(sids, config, pool)
            build["layout_pass_s"] = time.perf_counter() - t_start
            if builder == "layout" and device.type == "cuda":
                tokens, offsets = _stream_to_device(layout, sizes, device, config, pool, build)
            else:
                t0 = time.perf_counter()
                tokens, offsets = _host_fill(layout, sizes, pool)
                build["fill_s"] = time.perf_counter() - t0
    if device.type != "cpu" and not isinstance(tokens[0], torch.Tensor):
        t0 = time.perf_counter()
        tokens = [torch.from_numpy(t).to(device) for t in tokens]
        offsets = [torch.from_numpy(o).to(device) for o in offsets]
        torch.cuda.synchronize(device)
        build["h2d_s"] = time.perf_counter() - t0
        build["h2d_bytes"] = sum(t.numel() * t.element_size() for t in tokens + offsets)
    index = _assemble(tokens, offsets, sizes, config, catalog.n_items, build)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    build["total_s"] = time.perf_counter() - t_start
    return index
