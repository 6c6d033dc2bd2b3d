"""The cross-check policy: what each method's beams must equal before it is timed.

Every decode compared here runs on a :class:`~.replay.ContentReplayModel`, whose hidden
state is a function of the request and the prefix: with the position-keyed replay of the
latency runs, two decodes that order one near-tied pair of beams differently would feed
every later beam another hidden state, and a correct decoder would fail on a tie. The
method runs eagerly on it (the graph's equality with the eager decode is checked apart).

zerogr must equal the filter-first reference decode whatever its plan (strict: every
option keeps float32 logits, so common beams agree within :data:`CONTRACT_TOLERANCE` in
every dtype), as sets of beams per request, differing only where a request's first
divergence is an exact tie (:func:`~.checks.compare_sets`). A baseline is held against the
reference of the order it implements (:data:`CROSS_CHECKS`); across implementations (other
GEMM shapes, fused against unfused softmax) rounding can reorder near-ties and change
which beam survives, so a baseline also passes when 98 % of the items agree.
"""
from __future__ import annotations

from ..decode.decoder import Decoder
from .checks import CONTRACT_TOLERANCE, compare, compare_sets
from .replay import ContentReplayModel, StepTrace, prefix_score

#: Baseline -> (what its beams are compared with, which reference decode).
CROSS_CHECKS = {
    "static": ("score-first reference over the STATIC index", "score-first"),
    "static-adapted": ("filter-first reference (valid-token softmax)", "selective"),
    "naive-selective": ("filter-first reference, selective projection", "selective"),
    "cpu-trie": ("score-first reference over the STATIC index", "score-first"),
    "unconstrained": ("unconstrained reference", "unconstrained"),
}
ZEROGR_CHECK = "filter-first reference"
MIN_BASELINE_OVERLAP = 0.98


def check_model(workload, heads, beam: int, batch: int) -> ContentReplayModel:
    """The content-keyed model of one shape's checks (about two table rows per beam and step)."""
    return ContentReplayModel.draw(workload.index.n_levels, max(1024, 2 * batch * beam) + 1, heads.hidden_size,
                                   heads.dtype, heads.device, batch, seed=workload.seed * 7919 + beam)


class References:
    """Reference decodes of one shape (CPU-style reference ops), each made once on first use.

    Parameters
    ----------
    workload : Workload
    heads : Heads
    model : ContentReplayModel
        The hidden states of every decode compared.
    beam, batch : int
    static : StaticIndex or None
        The score-first references decode over it.
    """

    def __init__(self, workload, heads, model, beam: int, batch: int, static=None):
        self.index, self.model, self.beam, self.batch, self.static = workload.index, model, beam, batch, static
        self.head_set = heads
        self.heads = workload.decoder_heads(heads)
        self._done: dict = {}

    def get(self, kind: str, projection=None) -> tuple:
        """(tokens, scores, item rows) of reference ``kind``: ``"filter-first"`` (with
        ``projection`` per step), ``"selective"``, ``"score-first"`` or ``"unconstrained"``."""
        return self._decode(kind, projection)[0]

    def kept(self, kind: str, projection=None) -> list:
        """The beams reference ``kind`` kept at every step (:meth:`StepTrace.kept`)."""
        return self._decode(kind, projection)[1]

    def _decode(self, kind: str, projection=None) -> tuple:
        key = (kind, projection)
        if key not in self._done:
            self.model.load(0)
            common = dict(beam_width=self.beam, engine="reference", **self.heads)
            if kind == "filter-first":
                d = Decoder(self.index, projection=projection, **common)
            elif kind == "selective":
                d = Decoder(self.index, projection="selective", **common)
            elif kind == "score-first":
                d = Decoder(self.index, order="score-first", source=self.static, **common)
            else:
                d = Decoder(self.index, order="unconstrained", **common)
            trace = StepTrace(self.model)
            r = d.decode(trace, self.batch)
            self._done[key] = ((r.tokens, r.scores, r.item_rows), trace.kept(r.tokens, self.index.n_levels))
        return self._done[key]

    def score_of(self, request: int, prefix) -> float:
        """Float64 filter-first score of ``prefix`` (:func:`~.replay.prefix_score`)."""
        return prefix_score(self.index, self.head_set, self.model, request, prefix)

    def clear(self) -> None:
        self._done.clear()


def decode_on(runner, model) -> tuple:
    """(tokens, scores, states) of one eager decode of ``runner`` with ``model``'s hidden states."""
    saved = runner.model
    runner.model = model
    try:
        return tuple(t.clone() for t in runner.eager())
    finally:
        runner.model = saved


def cross_check(name: str, runner, refs: References, tol: float):
    """Decode method ``name`` eagerly on the references' model and compare with its reference.

    Returns
    -------
    (label, passed, strict, details) or None
        None when ``name`` has no reference.
    """
    if name != "zerogr" and name not in CROSS_CHECKS:
        return None
    trace = StepTrace(refs.model)
    out = decode_on(runner, trace)
    if name == "zerogr":
        kind = "filter-first"
        kept = trace.kept(out[0], refs.index.n_levels)
        c = compare_sets(out, refs.get(kind), kept, refs.kept(kind), refs.score_of, CONTRACT_TOLERANCE)
        return ZEROGR_CHECK, c["passed"], True, c
    label, kind = CROSS_CHECKS[name]
    c = compare(out, refs.get(kind), tol)
    return label, c["passed"] or c["mean_overlap"] >= MIN_BASELINE_OVERLAP, False, c
