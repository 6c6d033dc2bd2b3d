"""The cross-check policy: what each method's beams must equal before it is timed.

zerogr must equal the filter-first reference decode whatever its plan (strict: every
option keeps float32 logits, so within :data:`CONTRACT_TOLERANCE` in every dtype). A baseline is held against the reference of the
order it implements (:data:`CROSS_CHECKS`); across implementations (other GEMM shapes, fused
against unfused softmax) rounding can reorder near-ties and change which beam survives, so
a baseline also passes when 98 % of the items agree.
"""
from __future__ import annotations

from ..decode.decoder import Decoder
from .checks import CONTRACT_TOLERANCE, compare

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


class References:
    """Reference decodes of one shape (CPU-style reference ops), each made once on first use.

    Parameters
    ----------
    workload : Workload
    heads : Heads
    model : ReplayModel
        Replayed from its first hidden-state set.
    beam, batch : int
    static : StaticIndex or None
        The score-first references decode over it.
    """

    def __init__(self, workload, heads, model, beam: int, batch: int, static=None):
        self.index, self.model, self.beam, self.batch, self.static = workload.index, model, beam, batch, static
        self.heads = workload.decoder_heads(heads)
        self._done: dict = {}

    def get(self, kind: str, projection=None) -> tuple:
        """(tokens, scores, item rows) of reference ``kind``: ``"filter-first"`` (with
        ``projection`` per step), ``"selective"``, ``"score-first"`` or ``"unconstrained"``."""
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
            r = d.decode(self.model, self.batch)
            self._done[key] = (r.tokens, r.scores, r.item_rows)
        return self._done[key]

    def clear(self) -> None:
        self._done.clear()


def cross_check(name: str, out: tuple, refs: References, tol: float):
    """Compare method ``name``'s outputs with its reference.

    Returns
    -------
    (label, passed, strict, details) or None
        None when ``name`` has no reference.
    """
    if name == "zerogr":
        label, ref, strict, tol = ZEROGR_CHECK, refs.get("filter-first"), True, CONTRACT_TOLERANCE
    elif name in CROSS_CHECKS:
        label, kind = CROSS_CHECKS[name]
        ref, strict = refs.get(kind), False
    else:
        return None
    c = compare(out, ref, tol)
    passed = c["passed"] if strict else (c["passed"] or c["mean_overlap"] >= MIN_BASELINE_OVERLAP)
    return label, passed, strict, c
