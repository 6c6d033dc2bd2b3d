"""A training step replayed from one CUDA graph.

Eager PyTorch launches every operator of a step (the forward pass, the backward pass,
gradient clipping, AdamW) from Python one by one. The TIGER-size T5 runs about 2,600 of them
per step, each a few microseconds of work, so the GPU waits on the host most of the time.
Capturing the whole step once and replaying it launches it as one unit.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..errors import ZeroGRError


class GraphedTrainStep:
    """Forward, backward, clipping and optimizer step of a fixed-size batch, captured once.

    The first ``warmup`` calls run eagerly on a side stream (CUDA graphs need the
    optimizer state and the autograd buffers to exist before capture); the next call
    captures the step and every call from then on replays it. Every call is a real
    training step on its own batch.

    Parameters
    ----------
    body : callable(idx, drawn) -> torch.Tensor
        One training step on the transitions ``idx`` (B,) int64 (and ``drawn`` (B,) int64
        or None): forward, ``backward()``, clipping and ``optimizer.step()``, returning the
        detached float32 loss, a 0-d tensor. It must not synchronise with the host and must
        keep every shape fixed.
    optimizer : torch.optim.Optimizer
        The optimizer ``body`` steps. Its param groups get a device tensor as ``lr`` (set
        per call) and ``capturable=True``.
    batch : int
        Transitions per step (the graph's fixed batch).
    with_drawn : bool
        Whether ``body`` takes a ``drawn`` index tensor.
    device : torch.device
        A CUDA device.
    warmup : int
        Eager steps before the capture.
    """

    def __init__(self, body: Callable, optimizer: torch.optim.Optimizer, batch: int, with_drawn: bool,
                 device: torch.device, warmup: int = 3):
        if torch.device(device).type != "cuda":
            raise ZeroGRError(f"--cuda-graph: CUDA graphs need a CUDA device, got {device}")
        self.body, self.optimizer, self.batch, self.warmup = body, optimizer, int(batch), int(warmup)
        self.idx = torch.zeros(self.batch, dtype=torch.int64, device=device)
        self.drawn = torch.zeros(self.batch, dtype=torch.int64, device=device) if with_drawn else None
        self.lr = torch.zeros((), dtype=torch.float32, device=device)
        for group in optimizer.param_groups:
            group["lr"] = self.lr
            group["capturable"] = True
        self.graph: torch.cuda.CUDAGraph | None = None
        self.loss: torch.Tensor | None = None
        self.eager_steps = 0

    def __call__(self, idx: torch.Tensor, drawn: torch.Tensor | None, lr: float) -> torch.Tensor:
        """One training step on ``idx`` (B,) int64 at learning rate ``lr``.

        Returns
        -------
        torch.Tensor, 0-d, float32
            The batch's loss. After the capture it is the graph's output buffer, which the
            next call overwrites: read or accumulate it before then (stream order suffices).
        """
        if idx.numel() != self.batch:
            raise ZeroGRError(f"--cuda-graph: a captured step takes batches of {self.batch}, got {idx.numel()}")
        self.idx.copy_(idx)
        if self.drawn is not None:
            self.drawn.copy_(drawn)
        self.lr.fill_(lr)
        if self.graph is None:
            if self.eager_steps < self.warmup:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    self.optimizer.zero_grad(set_to_none=True)
                    loss = self.body(self.idx, self.drawn)
                torch.cuda.current_stream().wait_stream(side)
                self.eager_steps += 1
                return loss
            # Gradients set to None before capture are allocated inside the graph's pool, so each
            # replay's backward writes them afresh instead of accumulating.
            self.optimizer.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.loss = self.body(self.idx, self.drawn)
            self.graph = graph
        self.graph.replay()
        return self.loss

    def eager(self, idx: torch.Tensor, drawn: torch.Tensor | None, lr: float) -> torch.Tensor:
        """One eager step of any batch size (an epoch's last, partial batch), same optimizer."""
        self.lr.fill_(lr)
        self.optimizer.zero_grad(set_to_none=True)
        return self.body(idx, drawn)
