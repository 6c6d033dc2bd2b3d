"""Catalog refresh and rebuild while a decode loop keeps serving.

:func:`refresh_catalog` removes a share of the items and adds new ones (new SIDs that
reuse random existing prefixes, so they land inside the tree like real new items).
:func:`rebuild_while_decoding` rebuilds the index of the refreshed catalog in a
background thread — the streaming ``layout`` builder on a GPU, the same two passes on
the host without one — while the caller's decode function keeps running on the old
index, and reports decode latency before, during and after.
"""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..catalog.catalog import Catalog
from ..errors import ZeroGRError
from ..index.builders import build_index, h2d_gbps as build_h2d_gbps
from ..index.config import IndexConfig
from ..index.layout import StepIndex
from ..timing import Stopwatch


def refresh_catalog(catalog: Catalog, add_share: float, remove_share: float, seed: int = 0) -> tuple[Catalog, dict]:
    """A refreshed copy of ``catalog``.

    Parameters
    ----------
    catalog : Catalog
    add_share, remove_share : float
        Shares of the current item count to add and to remove, each in [0, 1].
    seed : int

    Returns
    -------
    catalog : Catalog
        Same codebooks and band offsets; new items get ids above the current maximum.
    change : dict
        ``removed``, ``added``, ``items_before``, ``items_after``.
    """
    for name, share in (("add share", add_share), ("remove share", remove_share)):
        if not 0 <= share <= 1:
            raise ZeroGRError(f"{name} must be between 0 and 1, got {share}")
    rng = np.random.default_rng(seed)
    n, levels = catalog.sids.shape
    n_remove = min(int(round(remove_share * n)), n - 1)
    keep = np.ones(n, dtype=bool)
    if n_remove:
        keep[rng.choice(n, size=n_remove, replace=False)] = False
    kept = catalog.sids[keep].astype(np.int64)
    sizes = np.asarray(catalog.codebook_sizes, dtype=np.int64)
    want = int(round(add_share * n))
    capacity = float(np.prod(sizes.astype(np.float64)))
    if want > capacity - kept.shape[0]:
        raise ZeroGRError(f"cannot add {want:,} items: the codebooks hold only {capacity:,.0f} distinct SIDs")
    existing = {row.tobytes() for row in kept} if want else set()
    fresh: list[np.ndarray] = []
    tries = 0
    while len(fresh) < want:
        tries += 1
        if tries > 50:
            raise ZeroGRError(f"could only find {len(fresh):,} new distinct SIDs of the {want:,} asked for")
        batch = max(16, 2 * (want - len(fresh)))
        parents = catalog.sids[rng.integers(0, n, size=batch)].astype(np.int64)
        # Keep a random prefix of an existing item, draw the remaining tokens at random.
        keep_len = rng.integers(0, levels, size=batch)
        draws = rng.integers(0, sizes[None, :], size=(batch, levels))
        mask = np.arange(levels)[None, :] < keep_len[:, None]
        candidates = np.where(mask, parents, draws)
        for row in candidates:
            key = row.tobytes()
            if key not in existing:
                existing.add(key)
                fresh.append(row)
                if len(fresh) == want:
                    break
    ids = catalog.item_ids[keep]
    titles = None if catalog.titles is None else catalog.titles[keep]
    if want:
        table = np.concatenate([kept, np.stack(fresh)])
        new_ids = catalog.fresh_ids(want)
        ids = np.concatenate([ids, new_ids])
        if titles is not None:
            titles = np.concatenate([titles, np.array([f"new item {i}" for i in new_ids], dtype=object)])
    else:
        table = kept
    refreshed = Catalog.from_sids(table, catalog.codebook_sizes, item_ids=ids, titles=titles,
                                  band_offsets=catalog.band_offsets, name=f"{catalog.name}-refreshed")
    return refreshed, dict(removed=n_remove, added=want, items_before=n, items_after=refreshed.n_items)


def percentile(samples: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples), q)) if samples else float("nan")


@dataclass
class RebuildReport:
    """What a rebuild-while-decoding run measured (times in ms unless named _s)."""

    device: str
    builder: str
    builds: list[dict] = field(default_factory=list)
    before_ms: list[float] = field(default_factory=list)
    during_ms: list[float] = field(default_factory=list)
    after_ms: list[float] = field(default_factory=list)
    index: StepIndex | None = None

    @property
    def rebuild_s(self) -> float:
        """Median wall time of one rebuild."""
        return statistics.median(b["total_s"] for b in self.builds) if self.builds else float("nan")

    @property
    def h2d_gbps(self) -> float | None:
        """Host-to-device rate of the rebuilds in GB/s, or ``None`` on a CPU.

        Streaming builds copy while they fill, so the rate is bytes over fill plus the
        copy tail not hidden behind filling; a host-copy build reports its copy alone.
        """
        rates = [r for r in (build_h2d_gbps(b) for b in self.builds) if r is not None]
        return statistics.median(rates) if rates else None

    def latency_rows(self) -> list[dict]:
        rows = []
        for phase, samples in (("before", self.before_ms), ("during", self.during_ms), ("after", self.after_ms)):
            rows.append(dict(phase=phase, decodes=len(samples), p50_ms=percentile(samples, 50),
                             p99_ms=percentile(samples, 99), max_ms=max(samples) if samples else float("nan")))
        return rows


def rebuild_while_decoding(catalog: Catalog, decode_once: Callable[[StepIndex | None], None], *, device=None,
                           config: IndexConfig | None = None, before: int = 20, after: int = 10,
                           min_seconds: float = 1.0, max_builds: int = 50,
                           progress: Callable[[float, str], None] | None = None) -> RebuildReport:
    """Rebuild ``catalog``'s index while decoding keeps running.

    Parameters
    ----------
    catalog : Catalog
        The refreshed catalog.
    decode_once : callable(index or None)
        One decode on the serving index; called with ``None`` before and during the
        rebuild (the old index) and with the new index after it.
    device : str or torch.device, optional
        Where the new index goes (default CPU). On CUDA the ``layout`` builder streams its
        output through pinned buffers; on a CPU it fills host arrays.
    before, after : int
        Decodes timed before and after the rebuild (one untimed warm-up call on the new
        index precedes the ``after`` ones).
    min_seconds : float
        Rebuilds repeat back to back until at least this long has passed (small catalogs
        build in milliseconds, shorter than one decode), up to ``max_builds``.
    progress : callable(fraction, text), optional

    Returns
    -------
    RebuildReport
    """
    dev = torch.device(device or "cpu")
    config = config or IndexConfig()
    report = RebuildReport(device=str(dev), builder="layout (streaming to the GPU)" if dev.type == "cuda"
                           else "layout (host arrays, CPU)")
    say = progress or (lambda f, t: None)

    def timed(index):
        with Stopwatch(dev) as watch:
            decode_once(index)
        return watch.ms

    say(0.0, "decoding on the current index (before)")
    for i in range(before):
        report.before_ms.append(timed(None))
    box: dict = {}
    stop = threading.Event()

    def builder():
        try:
            start = time.perf_counter()
            while True:
                index = build_index(catalog, device=dev, builder="layout", config=config)
                report.builds.append(dict(index.build))
                box["index"] = index
                if time.perf_counter() - start >= min_seconds or len(report.builds) >= max_builds or stop.is_set():
                    break
        except BaseException as exc:  # surfaced to the caller below
            box["error"] = exc

    say(0.3, "rebuilding while decoding")
    thread = threading.Thread(target=builder, name="zerogr-rebuild", daemon=True)
    thread.start()
    while thread.is_alive():
        report.during_ms.append(timed(None))
    thread.join()
    if "error" in box:
        raise box["error"]
    report.index = box["index"]
    say(0.8, "decoding on the new index (after)")
    if after:
        decode_once(report.index)  # untimed: the first call on a new index may plan and capture
    for _ in range(after):
        report.after_ms.append(timed(report.index))
    say(1.0, "done")
    return report


def live_load_test(catalog: Catalog, make_decoder: Callable, hidden_fn, batch: int, *, device, warmup=None,
                   threads: int, seconds: float, change_every_s: float, changes_per_step: int):
    """Decode from a versioned catalog store while items are deleted and added.

    A :class:`~zerogr_core.decode.store.CatalogStore` over ``catalog`` serves the
    decoders ``make_decoder(catalog, index)`` builds; the serving suite's load test
    (:func:`zerogr_core.bench.live.run_load_test`) decodes ``batch`` requests per call on
    ``threads`` threads for ``seconds`` per phase, deleting and adding
    ``changes_per_step`` items every ``change_every_s`` seconds.

    Returns
    -------
    The load test's report.
    """
    from ..bench.live import run_load_test
    from ..decode.store import CatalogStore

    store = CatalogStore(catalog, make_decoder, device=device, warmup=warmup)
    return run_load_test(store, hidden_fn, batch, threads=threads, seconds=seconds, change_every_s=change_every_s,
                         deletes_per_change=changes_per_step, adds_per_change=changes_per_step)
