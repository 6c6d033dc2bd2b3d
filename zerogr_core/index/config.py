"""What the index is asked for, without torch: its representation rule, presets and builders.

:class:`IndexConfig` decides per step between the sparse mapping and the dense table by
their bytes (:func:`sparse_bytes`, :func:`dense_bytes`); :data:`INDEX_PRESETS` names the
rules and :data:`BUILDERS` the builders of :func:`zerogr_core.index.build_index`. The CLI
offers both as choices when it builds its parser, which must not wait for torch to load
(:mod:`.layout` and :mod:`.builders` import it), so they live here.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ..arg_types import whole_value
from ..catalog.catalog import token_dtype
from ..errors import ZeroGRError

#: The index builders, byte-identical in what they build (see :mod:`.builders`).
BUILDERS = ("layout", "host-copy", "serial")


def offset_dtype(count: int) -> np.dtype:
    """int32 unless ``count`` reaches 2**31, then int64."""
    return np.dtype(np.int32) if count < 2**31 else np.dtype(np.int64)


def sparse_bytes(codebook: int, states: int, entries: int) -> int:
    """Bytes of a sparse mapping: tokens plus offsets."""
    return entries * token_dtype(codebook).itemsize + (states + 1) * offset_dtype(entries).itemsize


def dense_bytes(codebook: int, states: int, entries: int) -> int:
    """Bytes of a dense successor table (successor ids in the offset dtype)."""
    return states * codebook * offset_dtype(entries).itemsize


@dataclass(frozen=True)
class IndexConfig:
    """How the index picks its representation per step.

    A step is dense when its table costs at most ``dense_ratio`` times the sparse mapping
    and at most ``dense_budget_bytes``; ``overrides`` (1-based step → "dense"/"sparse")
    wins over the rule.

    Attributes
    ----------
    dense_ratio : float
    dense_budget_bytes : int
    overrides : tuple of (int, str)
    chunk_rows : int
        Rows per chunk of the layout-guided builder.
    workers : int
        Threads of the layout-guided builder (0: one per CPU core).
    staging_buffers : int
        Pinned staging buffers of the streaming builder (1 or 2).
    """

    dense_ratio: float = 4.0
    dense_budget_bytes: int = 256 << 20
    overrides: tuple[tuple[int, str], ...] = ()
    chunk_rows: int = 1 << 20
    workers: int = 0
    staging_buffers: int = 2

    def __post_init__(self):
        # checked here, where the value is given: a builder would fail on it deep in range() or a
        # thread pool, and an override of a step that does not exist (0-based, "1") would do nothing
        ratio = self.dense_ratio
        # NaN compares false with everything: it passed ``< 0`` and made every step sparse
        if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not ratio >= 0:
            raise ZeroGRError(f"IndexConfig dense_ratio: expected a number ≥ 0, got {ratio!r}")
        for name, low in (("dense_budget_bytes", 0), ("chunk_rows", 1), ("workers", 0)):
            # a whole float (1e6) is taken as an int: the builders' range() refused chunk_rows=2.0, and
            # int() of an infinite or NaN value raised OverflowError / ValueError here
            value = whole_value(getattr(self, name))
            if value is None or value < low:
                raise ZeroGRError(f"IndexConfig {name}: expected a whole number ≥ {low}, got {getattr(self, name)!r}")
            object.__setattr__(self, name, value)
        if self.staging_buffers not in (1, 2):
            raise ZeroGRError(f"IndexConfig staging_buffers: expected 1 or 2, got {self.staging_buffers!r}")
        for step, kind in self.overrides:
            _check_override(step, kind)

    def with_overrides(self, overrides: dict[int, str]) -> "IndexConfig":
        """Return a copy with per-step overrides (1-based step → "dense" or "sparse")."""
        for step, kind in overrides.items():
            _check_override(step, kind)
        merged = dict(self.overrides)
        merged.update({int(step): kind for step, kind in overrides.items()})
        return IndexConfig(self.dense_ratio, self.dense_budget_bytes, tuple(sorted(merged.items())),
                           self.chunk_rows, self.workers, self.staging_buffers)

    def choose(self, step: int, codebook: int, states: int, entries: int) -> str:
        """Representation of 0-based ``step`` under this config."""
        forced = dict(self.overrides).get(step + 1)
        if forced is not None:
            return forced
        dense = dense_bytes(codebook, states, entries)
        if dense <= self.dense_budget_bytes and dense <= self.dense_ratio * sparse_bytes(codebook, states, entries):
            return "dense"
        return "sparse"


def _check_override(step, kind) -> None:
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 1:
        raise ZeroGRError(f"override step {step!r}: steps are numbered from 1")
    if kind not in ("dense", "sparse"):
        raise ZeroGRError(f"step {step}: representation must be 'dense' or 'sparse', got {kind!r}")


INDEX_PRESETS: dict[str, IndexConfig] = {
    "default": IndexConfig(),
    "memory-lean": IndexConfig(dense_ratio=1.0),
    "all-sparse": IndexConfig(dense_ratio=0.0, dense_budget_bytes=0),
}
