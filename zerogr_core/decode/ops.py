"""Which implementation of the kernel ops a reference decode calls, and its stage timer.

:data:`DISPATCH` calls the public ops of :mod:`zerogr_kernels` (Triton on CUDA tensors or under
``TRITON_INTERPRET=1``, PyTorch references otherwise). :data:`REFERENCE` always calls the
PyTorch references: what the app uses on a CPU, where the Triton interpreter would only
slow it down.

A *timer* is a callable ``timer(step, stage)`` returning a context manager around one
stage of one step (stages: ``model``, ``filter``, ``project``, ``normalise``, ``select``);
:func:`no_timer` times nothing.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import zerogr_kernels

STAGES = ("model", "filter", "project", "normalise", "select")


@dataclass(frozen=True)
class KernelOps:
    """The four kernel ops of a decoding step (signatures of :mod:`zerogr_kernels`)."""

    filter: Callable
    selective: Callable
    log_softmax: Callable
    topk: Callable


DISPATCH = KernelOps(
    zerogr_kernels.filter_slots, zerogr_kernels.selective_proj, zerogr_kernels.log_softmax_slots, zerogr_kernels.topk_gather)
REFERENCE = KernelOps(
    zerogr_kernels.filter_slots_reference, zerogr_kernels.selective_proj_reference, zerogr_kernels.log_softmax_slots_reference,
    zerogr_kernels.topk_gather_reference)


def no_timer(step: int, stage: str):
    """A timer that times nothing."""
    return contextlib.nullcontext()
