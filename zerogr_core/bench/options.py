"""Benchmark options: what the command line asked for, and each suite's defaults."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..decode.options import PLANNED_TOPK
from .methods import METHODS

FAST_METHODS = ["zerogr", "static", "static-adapted", "unconstrained"]


@dataclass
class Options:
    """Resolved command-line options (``None``: the suite's default)."""

    suites: list
    catalog: str | None = None
    scale: int | None = None
    methods: list | None = None
    batches: list | None = None
    beams: list | None = None
    configs: list | None = None
    codebooks: list | None = None
    seed: int = 0
    repeats: int | None = None
    warmup: int | None = None
    quick: bool = False
    budget_s: float | None = None
    check: str = "ends"
    build_repeats: int | None = None
    interference_s: float | None = None
    suite_budgets: dict = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    topk_paths: tuple = PLANNED_TOPK

    @property
    def n_sets(self) -> int:
        return 2 if self.quick else 4

    def rep(self) -> int:
        return self.repeats if self.repeats is not None else (3 if self.quick else 30)

    def warm(self) -> int:
        return self.warmup if self.warmup is not None else (1 if self.quick else 5)


def suite_defaults(suite: str, quick: bool) -> dict:
    """Catalog, batches, beams, configs, methods and codebooks a suite uses unless told."""
    both = [("fp16", 32), ("fp32", 48)] if quick else [("fp16", 1024), ("fp32", 4096)]
    small = [2] if quick else [1, 8, 32]
    d = dict(catalog="search-like", batches=[1, 2] if quick else [1, 2, 4, 8, 16, 32],
             beams=[4] if quick else [128], configs=both, methods=list(METHODS), codebooks=None)
    if suite == "beam-sweep":
        d.update(catalog="synthetic-7", batches=small, beams=[2, 4] if quick else [64, 128, 256],
                 configs=both[:1], methods=list(FAST_METHODS))
    elif suite == "codebook-sweep":
        d.update(catalog="synthetic-7", batches=small, configs=both[:1], methods=list(FAST_METHODS),
                 codebooks=[16, 32] if quick else [2048, 4096, 8192, 16384])
    elif suite in ("steps", "stages", "ablation"):
        d.update(batches=small)
    elif suite == "interference":
        d.update(batches=[2] if quick else [8], configs=both[:1])
    elif suite == "coldstart":
        d.update(batches=[2] if quick else [1, 32], configs=both[:1] if quick else both)
    elif suite in ("constraints", "live"):
        d.update(batches=[2] if quick else ([1, 8, 32] if suite == "constraints" else [8]), configs=both[:1])
    return d
