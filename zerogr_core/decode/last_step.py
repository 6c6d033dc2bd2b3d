"""The captured decode of a model that computes only the beams the last step reads.

A step model with ``partial_last_step`` (:mod:`zerogr_core.decode.loop`) computes the last
step's hidden states for a number of rows per request that is known only once the step before
it has chosen its beams. A CUDA graph has fixed shapes, so such a decode is captured in pieces:
one graph for every step but the last, then one graph of the last step per row count, picked by
the host after it reads the count.
"""
from __future__ import annotations

import torch

from zerogr_kernels._common import pdl_disabled

from ..timing import capture
from .loop import partial_rows

__all__ = ["PartialLastStep"]


class PartialLastStep:
    """The captured decode of a shape whose model computes the last step's wanted beams only
    (:mod:`zerogr_core.decode.loop`): :attr:`first` holds every step but the last and copies the
    count of wanted beams to the host, which picks the last step's graph for that many rows per
    request (captured the first time a count needs it; at most ``M / ROW_GRANULE + 1`` of them, sharing
    one memory pool). The host waits for the count, so such a call synchronises once mid-decode.

    Parameters
    ----------
    shape : zerogr_core.decode.engine.ShapeState
        The engine's state of one shape (its beam loop); this module does not import the engine,
        which imports it.
    model : StepModel
        Prefilled; ``partial_last_step`` is true.
    no_pdl : bool
        Capture with programmatic dependent launch off (as the shape's first graph).
    """

    def __init__(self, shape, model, no_pdl: bool):
        self.shape, self.model, self.no_pdl = shape, model, no_pdl
        self.most = torch.zeros((), dtype=torch.int64).pin_memory()
        self.ready = torch.cuda.Event()
        self.graphs: dict[int, tuple | None] = {}
        #: why a count's last step could not be captured (it then runs eagerly)
        self.errors: dict[int, str] = {}
        self.pool = None
        self.first, _ = capture(self._begin, warmup=0)

    def _begin(self) -> None:
        self.shape.begin(self.model)
        self.most.copy_(self.shape.loop.most, non_blocking=True)

    def replay(self):
        """One decode: the first graph, the count, the last step's graph; returns the outputs
        ``(tokens, scores, rows)``, views of the shape's static buffers."""
        self.first.replay()
        self.ready.record()
        self.ready.synchronize()
        rows = partial_rows(int(self.most), self.shape.loop.beam_width)
        if rows not in self.graphs:
            try:
                with pdl_disabled(self.no_pdl):
                    self.graphs[rows] = capture(lambda: self.shape.loop.finish(self.model, rows), warmup=1,
                                                pool=self.pool)
                self.pool = self.pool or self.graphs[rows][0].pool()
            except Exception as exc:  # e.g. out of memory: this count's last step runs eagerly from now on
                torch.cuda.synchronize()
                self.graphs[rows] = None
                self.errors[rows] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        entry = self.graphs[rows]
        if entry is None:
            return self.shape.loop.finish(self.model, rows)
        entry[0].replay()
        return entry[1]
