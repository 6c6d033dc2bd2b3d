"""Whole-decode latency of the two orders, timed so that the ranking holds when it is run again:
what the Decode page and ``compare-orders`` report, at the same implementation quality (graph
against graph on a GPU, the reference loop for both on a CPU). On a GPU, without item lists, a
third series runs with them: scoring first with the softmax over the valid tokens only
(:data:`VALID_TOKENS`), whose beams are filtering first's, so its gap to filtering first is the
order's cost alone.

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
from typing import Callable, Sequence

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


#: The two decode orders, what :func:`winner` decides between.
ORDERS = ("filter-first", "score-first")
#: The series timed besides the orders where it applies (:func:`order_runs`): scoring first
#: with the softmax over the valid tokens only, which returns filtering first's beams.
VALID_TOKENS = "score-first (valid tokens)"


def winner(latencies: dict[str, Latency], among: Sequence[str] = ORDERS) -> tuple[str | None, float]:
    """The order faster beyond noise, and how many times faster its median is.

    An order wins only when its p90 is below every other order's p10 (the 10–90 % bands do
    not overlap). Otherwise there is no winner (``None``): the medians differ by less than
    the spread of the samples, and another run could rank them either way.

    Parameters
    ----------
    latencies : dict
        Series → :class:`Latency`, as :func:`time_orders` returns them.
    among : sequence of str
        The series compared (default: the two orders; another series timed with them, such
        as :data:`VALID_TOKENS`, neither wins nor loses).

    Returns
    -------
    (str or None, float)
        The winner (or None) and the ratio slowest median / fastest median (≥ 1).
    """
    stats = {name: latencies[name].stats for name in among}
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
VALID_STATIC_GRAPH = ("CUDA graph of the suite's valid-token STATIC (scoring first, softmax over the valid tokens "
                      "only: filtering first's beams)")
#: Series → (the suite's method, its implementation): the scoring-first graphs of a GPU.
STATIC_SERIES = {"score-first": ("static", STATIC_GRAPH), VALID_TOKENS: ("static-adapted", VALID_STATIC_GRAPH)}


class GraphReplay:
    """One replay of a captured runner's graph, as :func:`time_orders` calls it.

    It holds the runner: the runner's index and loop buffers were allocated before the
    capture, so the graph reads memory that only the runner keeps (a replay after they were
    freed reads whatever was allocated there since).

    Attributes
    ----------
    runner : zerogr_core.bench.methods.Runner
        Captured; its ``graph_outputs`` hold the last replay's (tokens, scores, states).
    """

    def __init__(self, runner):
        self.runner = runner

    def __call__(self) -> None:
        self.runner.graph.replay()


def order_runs(catalog, decoders: dict, hidden_fn, batch: int, *, lists=None,
               constraints: dict | None = None) -> tuple[dict, list[str]]:
    """One whole decode per series, as callables for :func:`time_orders`, each run once (warm-up).

    On a CPU both orders run the decoders' step-by-step reference loop. On a GPU both run
    as CUDA graphs: filtering first as the GPU engine's graph, scoring first as the
    benchmark suite's graphed STATIC-style baseline at the same shape
    (:func:`zerogr_core.bench.methods.make_runner`); where that cannot run (per-request
    lists, a failed capture), scoring first runs eagerly and ``notes`` says why. Without
    lists a GPU also times :data:`VALID_TOKENS`, the suite's valid-token STATIC over the same
    index (filtering first's beams; left out, with a note, if its capture fails).

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
        Series → (implementation in words, callable): the two orders, and on a GPU
        :data:`VALID_TOKENS` where it ran; and notes for the page.
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
        # ``normalise`` only says how lists normalise: without lists filtering first normalises
        # over the catalog's valid tokens either way, as the suite's baselines decode
        listed = lists is not None or any(v is not None for k, v in (constraints or {}).items() if k != "normalise")
        why = "item lists and sets are not part of the suite's baseline" if listed else None
        runners = {}
        if why is None:
            try:
                runners = _static_runners(catalog, ff, hidden_fn, batch)
            except Exception as exc:  # noqa: BLE001 — the page still compares, eagerly, and says why
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        for series, (method, implementation) in STATIC_SERIES.items():
            runner = runners.get(method)
            if runner is not None and runner.graph is not None:
                runs[series] = (implementation, GraphReplay(runner))
        if "score-first" not in runs:
            why = why or runners["static"].graph_error or "no graph"
            runs["score-first"] = (STATIC_EAGER.format(why=why),
                                   lambda: sf.decode(hidden_fn, batch, **kw))
            notes.append(f"Scoring first ran eagerly ({why}); filtering first as a graph: the gap includes the "
                         "graph's saving, not only the order's.")
        if not listed and VALID_TOKENS not in runs:
            lost = runners["static-adapted"].graph_error if runners else why
            notes.append(f"Scoring first over the valid tokens only was not timed ({lost or 'no graph'}).")
    for _, fn in runs.values():
        fn()
    return runs, notes


def _static_runners(catalog, decoder, hidden_fn, batch: int,
                    names: Sequence[str] = ("static", "static-adapted")) -> dict:
    """The suite's scoring-first runners ``names`` at this shape over one STATIC-style index,
    each captured (a failed capture leaves its ``graph`` None and says why in ``graph_error``).

    Returns
    -------
    dict
        Method name → :class:`~zerogr_core.bench.methods.Runner`.
    """
    from .methods import make_runner
    from .workload import STATIC_DENSE_LIMIT
    from ..index.static_style import build_static_index

    heads = decoder.heads
    vocab = max(o + s for o, s in zip(heads.band_offsets, catalog.codebook_sizes))
    # the suite's rule: two dense levels when their table fits
    dense = 2 if catalog.n_levels >= 2 and vocab ** 2 * 5 <= STATIC_DENSE_LIMIT else 1
    static = build_static_index(catalog, decoder.index.device, dense_levels=dense, band_offsets=heads.band_offsets)
    runners = {name: make_runner(name, engine=decoder.gpu_engine, heads=heads, static=static, trie=None,
                                 model=hidden_fn, batch=batch, beam_width=decoder.beam_width) for name in names}
    for runner in runners.values():
        runner.capture()
    return runners
