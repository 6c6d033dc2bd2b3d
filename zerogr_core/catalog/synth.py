"""Seeded synthetic SID catalogs at any scale.

A catalog is grown top-down as a prefix tree. Step 1 opens ``k_1`` distinct top tokens;
each state of step l ≥ 2 draws its fan-out (number of children) as ``1 + Poisson(λ)``
with mean fan-out ``m_l`` (λ = m_l − 1), or, when the preset sets a dispersion ``k``,
with λ itself drawn from a Gamma(k, (m_l − 1)/k) so the segment lengths are skewed
(a negative-binomial fan-out). Fan-outs are capped by the codebook. A segment's tokens
are distinct, uniformly spread over the level's codebook and emitted in increasing
order, so the table comes out sorted and unique with no sort at all.

Scale: the preset fixes the mean fan-outs of steps 2…L; ``k_1`` is whatever
``n_items`` needs (about ``n / Π m_l``). When that exceeds the first codebook (times
``first_fill``), the surplus widens step 2, then step 3, … each capped at its codebook.
The last states are trimmed so the catalog has exactly ``n_items`` rows.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import numpy as np

from ..errors import ZeroGRError
from .catalog import MAX_TOKEN, Catalog, token_dtype


@dataclass(frozen=True)
class SynthConfig:
    """Shape of a synthetic catalog.

    Attributes
    ----------
    name : str
        Preset name, used in catalog names.
    codebook_sizes : tuple[int, ...]
        |V_l| per level, length L ≥ 1.
    fanouts : tuple[float, ...]
        Mean fan-out of steps 2…L (length L − 1), each ≥ 1 and ≤ its codebook.
    dispersion : tuple[float | None, ...]
        Per step 2…L: ``None`` for a ``1 + Poisson`` fan-out, or the Gamma shape ``k``
        of a negative-binomial fan-out (smaller is more skewed).
    shared_head : bool
        The model has one head with a band per level; the catalog then carries
        ``band_offsets`` = cumulative codebook sizes.
    first_fill : float
        Largest fraction of the first codebook that step 1 uses before the surplus
        moves to later steps.
    description : str
    """

    name: str
    codebook_sizes: tuple[int, ...]
    fanouts: tuple[float, ...]
    dispersion: tuple[float | None, ...]
    shared_head: bool = False
    first_fill: float = 0.98
    description: str = ""

    def __post_init__(self):
        n_levels = len(self.codebook_sizes)
        if n_levels < 1 or min(self.codebook_sizes) < 1 or max(self.codebook_sizes) > MAX_TOKEN + 1:
            raise ZeroGRError(f"synthetic config {self.name!r}: codebook_sizes must be in [1, {MAX_TOKEN + 1}] "
                              f"per level")
        if len(self.fanouts) != n_levels - 1 or len(self.dispersion) != n_levels - 1:
            raise ZeroGRError(f"synthetic config {self.name!r}: fanouts and dispersion need "
                              f"{n_levels - 1} values (steps 2…{n_levels})")
        for step, (mean, size) in enumerate(zip(self.fanouts, self.codebook_sizes[1:]), start=2):
            if not 1 <= mean <= size:
                raise ZeroGRError(f"synthetic config {self.name!r}: fan-out {mean} of step {step} "
                                  f"must lie in [1, {size}]")
        if not 0 < self.first_fill <= 1:
            raise ZeroGRError(f"synthetic config {self.name!r}: first_fill must lie in (0, 1]")

    @property
    def band_offsets(self) -> tuple[int, ...] | None:
        """First head row of each level's band (shared head), else ``None``."""
        if not self.shared_head:
            return None
        return tuple(int(v) for v in np.cumsum((0,) + self.codebook_sizes[:-1]))

    def plan(self, n_items: int) -> tuple[int, tuple[float, ...]]:
        """Top-token count and mean fan-outs for a catalog of about ``n_items`` SIDs.

        Returns
        -------
        (int, tuple of float)
            ``k_1`` and the mean fan-outs of steps 2…L after moving any surplus.
        """
        fanouts = list(self.fanouts)
        cap = max(1, int(self.first_fill * self.codebook_sizes[0]))
        need = n_items / math.prod(fanouts)
        if need > cap:
            surplus = need / cap
            for i, size in enumerate(self.codebook_sizes[1:]):
                grown = min(float(size), fanouts[i] * surplus)
                surplus *= fanouts[i] / grown
                fanouts[i] = grown
            need = cap * surplus
        return max(1, math.ceil(need)), tuple(fanouts)


#: Named presets. ``search-like`` reproduces the anchor catalog of docs/design.md §8
#: (fan-outs 150/8/2/1, max segments about 199/24/11/1 at 1.93e7 SIDs).
SYNTH_PRESETS: dict[str, SynthConfig] = {
    "search-like": SynthConfig(
        name="search-like", codebook_sizes=(8192, 4096, 2048, 2048, 2048),
        fanouts=(150.0, 8.0, 2.0, 1.0), dispersion=(None, None, None, None), shared_head=True,
        description="5 levels 8192/4096/2048/2048/2048 as bands of one shared head; "
                    "fan-outs 150/8/2/1"),
    "watch-like": SynthConfig(
        name="watch-like", codebook_sizes=(8192, 8192, 8192),
        fanouts=(4096.0, 2.0), dispersion=(4.0, None),
        description="3 levels of 8192; dense early steps (step 2 fan-out ~4096, skewed), "
                    "sparse last step"),
    "synthetic-7": SynthConfig(
        name="synthetic-7", codebook_sizes=(2048,) * 7,
        fanouts=(16.0, 8.0, 4.0, 2.0, 2.0, 1.0), dispersion=(1.0, 2.0, None, None, None, None),
        description="7 levels of V (default 2048) tokens; fan-outs 16/8/4/2/2/1, skewed early"),
}


def resolve_config(kind_or_config: str | SynthConfig, codebook: int | None = None) -> SynthConfig:
    """The preset named ``kind_or_config`` (or the config itself), with every level's
    codebook set to ``codebook`` when given (fan-outs capped to fit).

    Raises
    ------
    ZeroGRError
        Unknown preset name or codebook < 1.
    """
    if isinstance(kind_or_config, SynthConfig):
        config = kind_or_config
    elif kind_or_config in SYNTH_PRESETS:
        config = SYNTH_PRESETS[kind_or_config]
    else:
        raise ZeroGRError(f"unknown synthetic kind {kind_or_config!r}; choose one of "
                          f"{', '.join(SYNTH_PRESETS)}")
    if codebook is None:
        return config
    if not 1 <= codebook <= MAX_TOKEN + 1:
        raise ZeroGRError(f"codebook must be in [1, {MAX_TOKEN + 1}], got {codebook}")
    n_levels = len(config.codebook_sizes)
    return replace(config, codebook_sizes=(int(codebook),) * n_levels,
                   fanouts=tuple(min(float(codebook), m) for m in config.fanouts))


GENERATE_BYTES_PER_SID = 96
"""Peak host memory per SID while :func:`generate` draws and sorts a catalog (83 bytes measured for
synthetic-7 at 10^7 SIDs, rounded up): past the machine's memory a call is refused, not killed."""


def physical_memory() -> int:
    """This machine's physical memory in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 0


def generate(kind_or_config: str | SynthConfig, n_items: int, *, seed: int = 0,
             codebook: int | None = None) -> Catalog:
    """Generate a sorted, duplicate-free synthetic catalog.

    Parameters
    ----------
    kind_or_config : str or SynthConfig
        A key of :data:`SYNTH_PRESETS` or a custom config.
    n_items : int
        Exact number of SIDs (rows), ≥ 1.
    seed : int
        Seed of the generator; equal seeds give identical catalogs.
    codebook : int, optional
        Use this codebook size at every level (the ``V`` of ``synthetic-7``).

    Returns
    -------
    Catalog
        ``sids`` of shape (n_items, L) in the smallest token dtype, ``item_ids`` =
        ``arange(n_items)``, band offsets for shared-head presets.

    Raises
    ------
    ZeroGRError
        Unknown kind, ``n_items`` < 1, a codebook too small for ``n_items`` SIDs, or more SIDs
        than this machine's memory holds (:data:`GENERATE_BYTES_PER_SID`).
    """
    config = resolve_config(kind_or_config, codebook)
    n_items = int(n_items)
    if n_items < 1:
        raise ZeroGRError(f"n_items must be ≥ 1, got {n_items}")
    capacity = math.prod(config.codebook_sizes)
    if n_items > capacity:
        raise ZeroGRError(f"{config.name}: {n_items:,} SIDs do not fit in codebooks "
                          f"{'×'.join(map(str, config.codebook_sizes))}")
    need, have = n_items * GENERATE_BYTES_PER_SID, physical_memory()
    if have and need > have:
        raise ZeroGRError(f"{config.name}: {n_items:,} SIDs need about {need / 2**30:,.0f} GB to generate, more "
                          f"than this machine's {have / 2**30:,.0f} GB of memory")
    rng = np.random.default_rng(seed)
    target = math.ceil(n_items * 1.02) + 8   # small margin over the expected size
    while True:
        first, fanouts = config.plan(target)
        first = min(first, config.codebook_sizes[0])
        tokens, parents = _grow(rng, config, first, fanouts)
        if tokens[-1].size >= n_items:
            break
        # Rare shortfall from the random fan-outs: aim higher and redraw.
        target = math.ceil(target * 1.05) + 1
    table = _assemble(tokens, parents, n_items, token_dtype(max(config.codebook_sizes)))
    return Catalog.from_sids(table, config.codebook_sizes, band_offsets=config.band_offsets,
                             name=f"{config.name}-{n_items}", assume_sorted=True)


def _grow(rng: np.random.Generator, config: SynthConfig, first: int,
          fanouts: tuple[float, ...]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Entry tokens and parent states of every step, top-down.

    Returns
    -------
    tokens : list of np.ndarray, one per step, shape (E_l,), int32
    parents : list of np.ndarray, one per step ≥ 2, shape (E_l,), int32 or int64
        State (entry of the previous step) that each entry hangs under.
    """
    sizes = config.codebook_sizes
    tokens = [_sorted_distinct(rng, np.array([first]), sizes[0])]
    parents = []
    for step in range(1, len(sizes)):
        n_states = tokens[-1].size
        mean, k = fanouts[step - 1], config.dispersion[step - 1]
        if mean >= sizes[step]:
            counts = np.full(n_states, sizes[step], dtype=np.int64)   # saturated: every token
        elif mean == 1:
            counts = np.ones(n_states, dtype=np.int64)
        else:
            lam = (rng.gamma(k, (mean - 1.0) / k, size=n_states) if k is not None
                   else np.full(n_states, mean - 1.0))
            counts = np.minimum(1 + rng.poisson(lam), sizes[step])
        tokens.append(_sorted_distinct(rng, counts, sizes[step]))
        index_dtype = np.int32 if n_states < 2**31 else np.int64
        parents.append(np.repeat(np.arange(n_states, dtype=index_dtype), counts))
    return tokens, parents


#: Entries per vectorised batch: keeps temporaries small enough to be reused, not re-mapped.
_CHUNK = 1 << 20


def _sorted_distinct(rng: np.random.Generator, counts: np.ndarray, size: int) -> np.ndarray:
    """For each segment s, ``counts[s]`` distinct tokens of ``0 … size-1`` in increasing order.

    Parameters
    ----------
    counts : np.ndarray, shape (S,), int, each in 1 … size
    size : int

    Returns
    -------
    np.ndarray, shape (counts.sum(),), int32, segments concatenated
    """
    counts = counts.astype(np.int64)
    if np.all(counts == 1):
        return rng.integers(0, size, counts.size, dtype=np.int32)
    ends = np.cumsum(counts)
    out = np.empty(int(ends[-1]), dtype=np.int32)
    a = 0
    while a < counts.size:   # batches of whole segments, about _CHUNK entries each
        lo = int(ends[a] - counts[a])
        b = max(a + 1, int(np.searchsorted(ends, lo + _CHUNK, side="right")))
        _fill_sorted_distinct(rng, counts[a:b], size, out[lo:int(ends[b - 1])])
        a = b
    return out


def _fill_sorted_distinct(rng: np.random.Generator, counts: np.ndarray, size: int, out: np.ndarray) -> None:
    """Write one batch of :func:`_sorted_distinct` into ``out`` (shape (counts.sum(),)).

    Sorted uniforms come from normalised exponential spacings (no sort): segment s owns
    ``counts[s] + 1`` spacings, the last of which only closes its interval. Scaling them to
    ``0 … size - c`` and adding each token's rank in its segment makes them distinct.
    """
    running = np.cumsum(rng.standard_exponential(out.size + counts.size))
    ends = np.cumsum(counts + 1) - 1
    closing = running[ends]
    base = np.concatenate(([0.0], closing[:-1]))
    keep = np.ones(running.size, dtype=bool)
    keep[ends] = False
    # u = (running - base) / (closing - base) lies in [0, 1]; the factor just below 1 keeps
    # floor(u · room) ≤ room - 1 despite rounding.
    scale = (size - counts + 1) * (1.0 - 1e-9) / (closing - base)
    position = running[keep]
    position -= np.repeat(base, counts)
    position *= np.repeat(scale, counts)
    out[:] = position                                            # floor (non-negative values)
    out += np.arange(out.size, dtype=np.int32)
    out -= np.repeat((np.cumsum(counts) - counts).astype(np.int32), counts)   # + rank in segment


def _assemble(tokens: list[np.ndarray], parents: list[np.ndarray], n_items: int,
              dtype: np.dtype) -> np.ndarray:
    """The first ``n_items`` rows of the SID table, shape (n_items, L), ``dtype``."""
    n_levels = len(tokens)
    table = np.empty((n_items, n_levels), dtype=dtype)
    for lo in range(0, n_items, _CHUNK):
        hi = min(lo + _CHUNK, n_items)
        entry = np.arange(lo, hi)
        for step in range(n_levels - 1, -1, -1):
            table[lo:hi, step] = tokens[step][entry]
            if step:
                entry = parents[step - 1][entry]
    return table
