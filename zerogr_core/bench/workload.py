"""What a benchmark decodes: a catalog, its indexes, heads and replayed hidden states.

One :class:`Workload` per catalog; the indexes are built once and shared by every suite
and method of a run. The STATIC-style index is assembled from the layout-built arrays
(:func:`static_from_index`, byte-identical to :func:`~zerogr_core.index.build_static_index`,
whose own construction time the ``build`` suite measures), so a 10^8-SID catalog does not
pay for a second, serial construction.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..catalog.catalog import Catalog
from ..catalog.synth import SYNTH_PRESETS, generate
from ..decode.engine import GpuEngine
from ..decode.options import PLANNED_TOPK
from ..decode.heads import HIDDEN_STD, Heads, random_heads
from ..errors import ZeroGRError
from ..index import INDEX_PRESETS, StaticIndex, build_index
from ..index.host_trie import HostTrie
from ..index.layout import StepIndex
from .methods import host_trie_from_index

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
#: Default catalog sizes (SIDs) per synthetic preset; the search-like one is the anchor catalog of docs/design.md §8
#: catalog (19,269,255 SIDs, "2×10^7").
DEFAULT_SCALE = {"search-like": 19_269_255, "watch-like": 20_000_000, "synthetic-7": 10_000_000}
QUICK_SCALE = 1200
QUICK_CODEBOOK = 32
#: Largest STATIC dense table (V^2 cells × 5 bytes) built with d = 2; beyond it d = 1.
STATIC_DENSE_LIMIT = 24 << 30


def format_count(n: int) -> str:
    """``20000000`` → ``"2e7"``; other numbers as they are."""
    text = str(n)
    head = text.rstrip("0")
    return f"{head}e{len(text) - 1}" if len(head) == 1 and len(text) > 3 else text


@dataclass(frozen=True)
class CatalogSpec:
    """A catalog argument resolved: preset (or file/sample spec), size, seed, codebook."""

    source: str
    scale: int | None
    seed: int
    codebook: int | None

    @property
    def synthetic(self) -> bool:
        return self.source in SYNTH_PRESETS

    @property
    def label(self) -> str:
        if not self.synthetic:
            return self.source
        return f"{self.source}-{format_count(self.scale)}" + (f"-V{self.codebook}" if self.codebook else "")


def load_catalog(spec: CatalogSpec) -> Catalog:
    """Generate (presets) or open (sample names, ``synth:`` specs, files) the catalog."""
    if spec.synthetic:
        return generate(spec.source, spec.scale, seed=spec.seed, codebook=spec.codebook)
    from ..catalog.samples import open_catalog

    return open_catalog(spec.source)


def catalog_fields(catalog: Catalog, spec: CatalogSpec) -> dict:
    """The catalog statistics every record carries (flat fields plus per-step stats)."""
    steps = catalog.step_stats()
    join = lambda key: "/".join(str(s[key]) for s in steps)  # noqa: E731
    return dict(catalog=spec.source, catalog_label=spec.label, scale=catalog.n_items, codebook=spec.codebook,
                n_items=catalog.n_items, n_levels=catalog.n_levels,
                codebooks="/".join(map(str, catalog.codebook_sizes)),
                shared_head=catalog.band_offsets is not None, states=join("states"), entries=join("entries"),
                max_segments=join("max_segment"),
                mean_segments="/".join(f"{s['mean_segment']:.3g}" for s in steps),
                sid_table_int16_bytes=catalog.sid_table_bytes_int16(),
                catalog_stats=[{k: (round(v, 6) if isinstance(v, float) else v) for k, v in s.items()}
                               for s in steps])


def static_from_index(catalog: Catalog, cpu_index: StepIndex, device, band_offsets, dense_levels: int = 2
                      ) -> StaticIndex:
    """The STATIC-style index of ``catalog``, assembled from an all-sparse CPU index.

    Same layout as :func:`zerogr_core.index.build_static_index` (dense V^d tables for the
    first ``dense_levels`` steps, CSR ``[global token, next]`` rows after), built from the
    already-built tokens/offsets (the dense tables filled on ``device``).
    """
    t0 = time.perf_counter()
    dev = torch.device(device)
    sizes = catalog.codebook_sizes
    offs = tuple(int(o) for o in band_offsets)
    vocab = int(max(o + s for o, s in zip(offs, sizes)))
    tokens = [s.tokens for s in cpu_index.steps]
    offsets = [s.offsets for s in cpu_index.steps]
    g0 = tokens[0].to(torch.int64) + offs[0]
    if dense_levels == 1:
        dense_mask = torch.zeros(vocab, dtype=torch.bool, device=dev)
        dense_states = torch.full((vocab,), -1, dtype=torch.int32, device=dev)
        g0d = g0.to(dev)
        dense_mask[g0d] = True
        dense_states[g0d] = torch.arange(g0.numel(), dtype=torch.int32, device=dev)
        first_mask = dense_mask
    else:
        seg1 = (offsets[1][1:] - offsets[1][:-1]).to(torch.int64)
        parent = torch.repeat_interleave(g0, seg1).to(dev)
        g1 = (tokens[1].to(torch.int64) + offs[1]).to(dev)
        dense_mask = torch.zeros((vocab, vocab), dtype=torch.bool, device=dev)
        dense_states = torch.full((vocab, vocab), -1, dtype=torch.int32, device=dev)
        dense_mask[parent, g1] = True
        dense_states[parent, g1] = torch.arange(g1.numel(), dtype=torch.int32, device=dev)
        first_mask = torch.zeros(vocab, dtype=torch.bool, device=dev)
        first_mask[g0.to(dev)] = True
    indptr, pairs, max_row = [], [], []
    for level in range(dense_levels, catalog.n_levels):
        ptr = offsets[level].to(torch.int32)
        indptr.append(ptr.to(dev))
        tok = tokens[level].to(torch.int32) + offs[level]
        pairs.append(torch.stack([tok, torch.arange(tok.numel(), dtype=torch.int32)], dim=1).to(dev))
        max_row.append(int((ptr[1:] - ptr[:-1]).max()))
    index = StaticIndex(vocab, offs, dense_levels, first_mask, dense_mask, dense_states, indptr, pairs, max_row,
                        catalog.n_levels)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    index.build = {"builder": "static-from-layout", "total_s": time.perf_counter() - t0}
    return index


def static_step_bytes(static: StaticIndex) -> list[int]:
    """Bytes of the STATIC-style index attributed to each step."""
    nb = lambda t: t.numel() * t.element_size()  # noqa: E731
    out = []
    for level in range(static.n_levels):
        if level < static.dense_levels:
            if static.dense_levels == 1 or level == 1:
                out.append(nb(static.dense_mask) + nb(static.dense_states))
            else:
                out.append(nb(static.first_mask))
        else:
            j = level - static.dense_levels
            out.append(nb(static.indptr[j]) + nb(static.pairs[j]))
    return out


class Context:
    """Heads, engine and hidden-state sets of one (dtype, hidden size, beam width)."""

    def __init__(self, workload: "Workload", dtype_name: str, hidden: int, beam: int, batch: int,
                 n_sets: int):
        self.workload, self.dtype_name, self.hidden, self.beam = workload, dtype_name, hidden, beam
        self.dtype = DTYPES[dtype_name]
        self.heads = workload.heads(dtype_name, hidden)
        self.engine = GpuEngine(workload.index, self.heads, beam, use_graph=workload.device.type == "cuda",
                                topk_paths=workload.topk_paths, plan_store=False)  # plans timed afresh
        dev = workload.device
        gen = torch.Generator(device=dev).manual_seed(workload.seed * 7919 + hidden * 31 + beam * 1009 + batch)
        levels = workload.catalog.n_levels
        self.sets = [[(HIDDEN_STD * torch.randn(batch, 1 if l == 0 else beam, hidden, generator=gen, device=dev))
                      .to(self.dtype) for l in range(levels)] for _ in range(n_sets)]
        self.batch = batch

    @property
    def label(self) -> str:
        return f"{self.dtype_name}/H{self.hidden}"

    def release(self) -> None:
        self.engine.release()
        self.sets = []


class Workload:
    """A catalog with its zerogr index on the benchmark device, and lazily the baselines'.

    Parameters
    ----------
    spec : CatalogSpec
    device : torch.device
    topk_paths : sequence of str
        Top-k paths the engine's planner times (default: the engine's).
    """

    def __init__(self, spec: CatalogSpec, device: torch.device, topk_paths=PLANNED_TOPK):
        self.spec, self.device, self.seed, self.topk_paths = spec, device, spec.seed, tuple(topk_paths)
        t0 = time.perf_counter()
        self.catalog = load_catalog(spec)
        self.catalog_s = time.perf_counter() - t0
        self.fields = catalog_fields(self.catalog, spec)
        self.index = build_index(self.catalog, device=device, builder="layout")
        self._cpu_index = self._static = self._trie = None
        self._heads: dict = {}

    # ------------------------------------------------------------------ baselines' structures
    @property
    def band_offsets(self) -> tuple[int, ...]:
        bo = self.catalog.band_offsets
        return tuple(bo) if bo is not None else (0,) * self.catalog.n_levels

    def cpu_index(self) -> StepIndex:
        if self._cpu_index is None:
            self._cpu_index = build_index(self.catalog, device="cpu", config=INDEX_PRESETS["all-sparse"])
        return self._cpu_index

    def trie(self) -> HostTrie:
        if self._trie is None:
            self._trie = host_trie_from_index(self.cpu_index())
        return self._trie

    def static_layout(self) -> tuple[int, int]:
        """(V, d) of the STATIC-style index: the whole vocabulary and its dense levels."""
        vocab = max(o + s for o, s in zip(self.band_offsets, self.catalog.codebook_sizes))
        d = 2 if self.catalog.n_levels >= 2 and vocab ** 2 * 5 <= STATIC_DENSE_LIMIT else 1
        return vocab, d

    def static(self) -> StaticIndex:
        if self._static is None:
            _, d = self.static_layout()
            self._static = static_from_index(self.catalog, self.cpu_index(), self.device, self.band_offsets, d)
        return self._static

    def baselines(self, methods) -> tuple:
        """(STATIC-style index or None, host trie or None): what ``methods`` need, built once."""
        static = self.static() if any(m.startswith("static") for m in methods) else None
        trie = self.trie() if "cpu-trie" in methods else None
        return static, trie

    # ------------------------------------------------------------------ model side
    def heads(self, dtype_name: str, hidden: int) -> Heads:
        """Seeded random heads: one shared head with a band per level when the catalog has
        band offsets (search-like), else one head per level; entries ~ N(0, 1/H)."""
        key = (dtype_name, hidden)
        if key not in self._heads:
            gen = torch.Generator(device=self.device).manual_seed(self.seed * 104729 + hidden)
            heads = random_heads(self.catalog.codebook_sizes, self.catalog.band_offsets, hidden, DTYPES[dtype_name],
                                 self.device, gen)
            self._heads = {key: heads}  # keep one config's heads at a time
        return self._heads[key]

    def context(self, dtype_name: str, hidden: int, beam: int, batch: int, n_sets: int) -> Context:
        """Heads, a fresh engine and ``n_sets`` seeded hidden-state sets for one shape."""
        if dtype_name not in DTYPES:
            raise ZeroGRError(f"unknown dtype {dtype_name!r}; choose from {', '.join(DTYPES)}")
        return Context(self, dtype_name, hidden, beam, batch, n_sets)

    def decoder_heads(self, heads: Heads) -> dict:
        """Keyword arguments that give :class:`~zerogr_core.Decoder` these heads."""
        if heads.shared is not None:
            return dict(heads=heads.shared, band_offsets=heads.band_offsets)
        return dict(heads=list(heads.bands))

    def release(self) -> None:
        self._heads.clear()
        self._static = self._trie = self._cpu_index = None
        self.index = None


class WorkloadCache:
    """Holds one workload at a time: a suite asking for another catalog frees the previous
    one's device memory first (two large catalogs need not fit side by side)."""

    def __init__(self, device: torch.device, topk_paths=PLANNED_TOPK):
        self.device, self.topk_paths = device, tuple(topk_paths)
        self.current: Workload | None = None

    def get(self, spec: CatalogSpec, log=print) -> tuple[Workload, bool]:
        """The workload of ``spec`` and whether it was built by this call."""
        if self.current is not None and self.current.spec == spec:
            return self.current, False
        if self.current is not None:
            self.current.release()
            self.current = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        t0 = time.perf_counter()
        log(f"[catalog] {spec.label}: generating/loading and building the index on {self.device} …")
        wl = self.current = Workload(spec, self.device, self.topk_paths)
        log(f"[catalog] {spec.label}: {wl.catalog.n_items:,} SIDs, codebooks {wl.fields['codebooks']}, "
            f"max segments {wl.fields['max_segments']} (catalog {wl.catalog_s:.1f} s, index "
            f"{wl.index.build.get('total_s', 0):.1f} s, total {time.perf_counter() - t0:.1f} s)")
        return wl, True


def default_scale(source: str, quick: bool) -> int | None:
    if source not in SYNTH_PRESETS:
        return None
    return QUICK_SCALE if quick else DEFAULT_SCALE.get(source, 1_000_000)


def order_batches(batches) -> list[int]:
    """Anchor batches first (min, max, 8), then the rest from large to small, so a run
    stopped at its time limit still has the figures that matter most."""
    uniq = sorted(set(int(b) for b in batches))
    if not uniq:
        return []
    first = [uniq[0]] + ([uniq[-1]] if len(uniq) > 1 else []) + ([8] if 8 in uniq[1:-1] else [])
    rest = [b for b in sorted(uniq, reverse=True) if b not in first]
    return first + rest


__all__ = ["CatalogSpec", "Context", "DEFAULT_SCALE", "DTYPES", "Workload", "WorkloadCache", "catalog_fields", "load_catalog",
           "order_batches", "static_from_index", "static_step_bytes"]
