"""Whole-decode latency of the two orders, timed so that the ranking holds when it is run again:
what the Decode page and ``compare-orders`` report, at the same implementation quality (graph
against graph on a GPU, the reference loop for both on a CPU).

One sample of a CPU decode says little: on a shared machine a call can be descheduled and
take several times its usual time. :func:`time_orders` therefore times the orders in
turns (each round runs every order once, so they see the same load) until each has at
least :attr:`LatencyProtocol.min_repeats` samples and :attr:`LatencyProtocol.min_seconds`
of work, and :func:`winner` names a faster order only when the two 10–90 % bands do not
overlap; otherwise the two are a tie within noise, and a rerun says so again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import ZeroGRError
from ..timing import summarize, time_runs


@dataclass(frozen=True)
class LatencyProtocol:
    """How long the orders are timed.

    Attributes
    ----------
    min_repeats : int
        Timed decodes per order, at least.
    min_seconds : float
        Seconds of timed decodes per order, at least (small shapes repeat more).
    max_seconds : float
        Wall-clock budget of the whole timing; it stops early only past ``min_repeats``.
    """

    min_repeats: int = 20
    min_seconds: float = 1.0
    max_seconds: float = 20.0

    def __post_init__(self):
        if self.min_repeats < 2 or self.min_seconds < 0 or self.max_seconds <= 0:
            raise ZeroGRError(f"latency protocol needs min_repeats ≥ 2, min_seconds ≥ 0 and max_seconds > 0, got "
                              f"{self.min_repeats}, {self.min_seconds}, {self.max_seconds}")


#: ``page``: the Decode page's default (≥ 20 repeats and ≥ 1 s per order); ``quick``: a
#: preview of slow shapes, whose ranking a rerun may change.
LATENCY_PROTOCOLS = {"page": LatencyProtocol(), "quick": LatencyProtocol(min_repeats=3, min_seconds=0.0,
                                                                        max_seconds=5.0)}


@dataclass
class Latency:
    """Timed decodes of one order.

    Attributes
    ----------
    implementation : str
        What ran, in words (e.g. "CUDA graph of the GPU engine").
    samples_ms : list of float
        Every timed decode, in the order they ran.
    """

    implementation: str
    samples_ms: list[float] = field(default_factory=list)

    @property
    def stats(self) -> dict:
        """:func:`zerogr_core.timing.summarize` of the samples (median, p10, p90, …)."""
        return summarize(self.samples_ms)

    @property
    def median_ms(self) -> float:
        return self.stats["median_ms"]


def time_orders(runs: dict[str, tuple[str, Callable[[], object]]], device, protocol: LatencyProtocol,
                progress: Callable[[float], None] | None = None) -> dict[str, Latency]:
    """Time whole decodes of each order in turns until ``protocol`` is met.

    Parameters
    ----------
    runs : dict
        Order → (implementation in words, a callable running one whole decode). Each
        callable has run once already (warm-up, planning, graph capture).
    device : torch.device or str
        Synchronised around each timed decode (CUDA events on a GPU, wall clock on a CPU).
    protocol : LatencyProtocol
    progress : callable(fraction), optional
        Told how far the timing is (0 … 1).

    Returns
    -------
    dict
        Order → :class:`Latency`.
    """
    out = {name: Latency(label) for name, (label, _) in runs.items()}
    start = time.perf_counter()
    while True:
        for name, (_, fn) in runs.items():
            out[name].samples_ms += time_runs(fn, device, repeats=1, warmup=0)
        counts = min(len(lat.samples_ms) for lat in out.values())
        work = min(sum(lat.samples_ms) for lat in out.values()) / 1e3
        elapsed = time.perf_counter() - start
        if counts >= protocol.min_repeats and (work >= protocol.min_seconds or elapsed >= protocol.max_seconds):
            return out
        if progress is not None:
            done = min(counts / protocol.min_repeats, work / protocol.min_seconds if protocol.min_seconds else 1.0)
            progress(min(1.0, max(done, elapsed / protocol.max_seconds)))


def winner(latencies: dict[str, Latency]) -> tuple[str | None, float]:
    """The order faster beyond noise, and how many times faster its median is.

    An order wins only when its p90 is below every other order's p10 (the 10–90 % bands do
    not overlap). Otherwise there is no winner (``None``): the medians differ by less than
    the spread of the samples, and another run could rank them either way.

    Returns
    -------
    (str or None, float)
        The winner (or None) and the ratio slowest median / fastest median (≥ 1).
    """
    stats = {name: lat.stats for name, lat in latencies.items()}
    fastest = min(stats, key=lambda n: stats[n]["median_ms"])
    slowest = max(stats, key=lambda n: stats[n]["median_ms"])
    ratio = stats[slowest]["median_ms"] / max(stats[fastest]["median_ms"], 1e-12)
    clear = all(stats[fastest]["p90_ms"] < s["p10_ms"] for n, s in stats.items() if n != fastest)
    return (fastest if clear else None), ratio


#: What each order runs, in the page's words.
CPU_LOOP = "PyTorch reference loop, step by step (CPU)"
GPU_GRAPH = "CUDA graph of the GPU engine (planned per step)"
GPU_EAGER = "GPU engine, eager (the graph capture failed)"
STATIC_GRAPH = "CUDA graph of the benchmark suite's STATIC-style scoring first (GEMM over the head, mask after)"
STATIC_EAGER = "eager scoring-first loop of Triton kernels (no graph: {why})"


def order_runs(catalog, decoders: dict, hidden_fn, batch: int, *, lists=None,
               constraints: dict | None = None) -> tuple[dict, list[str]]:
    """One whole decode per order, as callables for :func:`time_orders`, each run once (warm-up).

    On a CPU both orders run the decoders' step-by-step reference loop. On a GPU both run
    as CUDA graphs: filtering first as the GPU engine's graph, scoring first as the
    benchmark suite's graphed STATIC-style baseline at the same shape
    (:func:`zerogr_core.bench.methods.make_runner`); where that cannot run (per-request
    lists, a failed capture), scoring first runs eagerly and ``notes`` says why.

    Parameters
    ----------
    catalog : Catalog
        The catalog of the decoders' index (the STATIC-style index is built from it).
    decoders : dict
        ``{"filter-first": Decoder, "score-first": Decoder}`` over the same index and heads.
    hidden_fn : callable or StepModel
    batch : int
    lists : RequestLists, optional
    constraints : dict, optional
        Other item constraints of every decode, as :meth:`~zerogr_core.Decoder.decode`
        takes them (``allow_items``, ``deny_items``, ``normalise``).

    Returns
    -------
    (dict, list of str)
        Order → (implementation in words, callable), and notes for the page.
    """
    from ..timing import StageTimer

    ff, sf = decoders["filter-first"], decoders["score-first"]
    dev = ff.index.device
    notes: list[str] = []
    kw = dict(constraints or {}, lists=lists)
    if dev.type != "cuda":
        # the observed (timer) path is the CPU's reference loop even under the Triton interpreter
        runs = {o: (CPU_LOOP, lambda d=d: d.decode(hidden_fn, batch, **kw, timer=StageTimer(dev)))
                for o, d in decoders.items()}
    else:
        ff.decode(hidden_fn, batch, **kw)  # plan + capture
        label = GPU_EAGER if ff.graph_error(batch) else GPU_GRAPH
        runs = {"filter-first": (label, lambda: ff.decode(hidden_fn, batch, **kw))}
        listed = lists is not None or any(v is not None for v in (constraints or {}).values())
        why = "item lists and sets are not part of the suite's baseline" if listed else None
        if why is None:
            try:
                runner = _static_runner(catalog, ff, hidden_fn, batch)
                if runner.graph is not None:
                    # the callable holds the runner: its index and loop buffers were allocated
                    # before the capture, so the graph reads memory that only the runner keeps
                    runs["score-first"] = (STATIC_GRAPH, lambda r=runner: r.graph.replay())
                else:
                    why = runner.graph_error or "no graph"
            except Exception as exc:  # noqa: BLE001 — the page still compares, eagerly, and says why
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if "score-first" not in runs:
            runs["score-first"] = (STATIC_EAGER.format(why=why),
                                   lambda: sf.decode(hidden_fn, batch, **kw))
            notes.append(f"Scoring first ran eagerly ({why}); filtering first as a graph: the gap includes the "
                         "graph's saving, not only the order's.")
    for _, fn in runs.values():
        fn()
    return runs, notes


def _static_runner(catalog, decoder, hidden_fn, batch: int):
    """The suite's STATIC-style scoring-first runner at this shape, captured."""
    from .methods import make_runner
    from .workload import STATIC_DENSE_LIMIT
    from ..index.static_style import build_static_index

    heads = decoder.heads
    vocab = max(o + s for o, s in zip(heads.band_offsets, catalog.codebook_sizes))
    # the suite's rule: two dense levels when their table fits
    dense = 2 if catalog.n_levels >= 2 and vocab ** 2 * 5 <= STATIC_DENSE_LIMIT else 1
    static = build_static_index(catalog, decoder.index.device, dense_levels=dense, band_offsets=heads.band_offsets)
    runner = make_runner("static", engine=decoder.gpu_engine, heads=heads, static=static, trie=None, model=hidden_fn,
                         batch=batch, beam_width=decoder.beam_width)
    runner.capture()
    return runner
