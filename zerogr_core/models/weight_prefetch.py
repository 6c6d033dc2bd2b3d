"""Weights brought into L2 on a side stream while the kernels before their GEMM run.

A Qwen3 decode step's weight GEMMs run at 256 rows a request, too few to hide HBM's latency; the
attention, norms and rotary kernels between them barely use HBM. :class:`WeightPrefetch` forks a
side stream at a point of the layer loop and issues :func:`zerogr_kernels.prefetch_l2` there over
the weights named in :data:`PREFETCH`, so the GEMM that follows finds them in L2. It works the same
inside a CUDA graph capture (the fork and the join become graph edges) and eagerly; without CUDA it
does nothing.
"""
from __future__ import annotations

import threading

import torch

from zerogr_kernels.l2_prefetch import CHUNK, prefetch_l2

PREFETCH: tuple[str, ...] = ()
"""Which decode-step weights are prefetched, any of:

* ``"o"``: the attention's output projection, during the attention;
* ``"gate"``: the gate/up projection, its first :data:`SPLIT` during the attention and the rest during
  the norm after the output projection;
* ``"down"``: the down projection, during SwiGLU's gate;
* ``"qkv"``: the next layer's q/k/v projection, during its input norm.

Empty (the default): none, and no side stream."""
SPLIT = 0.5
"""Share of the gate/up weight prefetched during the attention (the rest follows the output projection)."""


class WeightPrefetch:
    """Forks of one side stream that prefetch weight spans; :meth:`join` before the caller's stream
    goes on past the layers (a graph capture must end with every fork joined).

    Parameters
    ----------
    device : torch.device
        A CUDA device.
    names : tuple of str
        The weights to prefetch (:data:`PREFETCH`).
    """

    def __init__(self, device: torch.device, names: tuple[str, ...]):
        self.names = frozenset(names)
        self.side = _side_stream(device)
        self.forked = False

    def __call__(self, *spans) -> None:
        """Prefetch each ``(name, weight, begin, end)`` whose name is chosen, ``begin`` and ``end``
        shares of the weight's bytes, on the side stream after the work queued so far."""
        spans = [s for s in spans if s[0] in self.names and s[1] is not None]
        if not spans:
            return
        self.side.wait_stream(torch.cuda.current_stream(self.side.device))
        with torch.cuda.stream(self.side):
            for _, w, begin, end in spans:
                total = w.numel() * w.element_size()
                a, b = _cut(total, begin), _cut(total, end)
                if b > a:
                    prefetch_l2(w, a, b - a)
        self.forked = True

    def join(self) -> None:
        """Make the caller's stream wait for every prefetch launched (a no-op when none was)."""
        if self.forked:
            torch.cuda.current_stream(self.side.device).wait_stream(self.side)
            self.forked = False


def _cut(total: int, share: float) -> int:
    """Byte offset of ``share`` of ``total`` bytes, on a prefetch chunk boundary (the end: exact)."""
    return total if share >= 1 else int(total * share) // CHUNK * CHUNK


_SIDE: dict = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    # one side stream per device and thread: prefetches never wait on each other, but two threads
    # capturing graphs at once must not fork onto the same stream
    index = torch.device(device).index
    key = (torch.cuda.current_device() if index is None else index, threading.get_ident())
    if key not in _SIDE:
        _SIDE[key] = torch.cuda.Stream(device=key[0])
    return _SIDE[key]


def weight_prefetch(x: torch.Tensor) -> WeightPrefetch | None:
    """A :class:`WeightPrefetch` for rows ``x`` on a GPU when :data:`PREFETCH` names any weight, else ``None``."""
    if not PREFETCH or not x.is_cuda:
        return None
    return WeightPrefetch(x.device, PREFETCH)
