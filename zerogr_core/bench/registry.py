"""The benchmark suites by name: what each records and where its code lives.

The one list of suites: the CLI (``bench --suite``), the session that runs them and the
app's Benchmarks page all read it. A new suite is one :class:`Suite` entry here plus its
function ``fn(session, suite_name)``. This module imports the standard library alone, so the
CLI can parse its arguments before torch loads; a suite's module loads when it runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module


@dataclass(frozen=True)
class Suite:
    """One benchmark suite.

    Attributes
    ----------
    name : str
        What ``--suite`` takes.
    target : str
        ``"module:function"`` under :mod:`zerogr_core.bench`; the function takes
        ``(session, suite_name)`` and writes its records through the session.
    records : str
        What it records (one line, for help texts).
    in_app : bool
        Offered by the app's live sweep.
    """

    name: str
    target: str
    records: str
    in_app: bool = True

    def function(self):
        module, _, func = self.target.partition(":")
        return getattr(import_module(f"zerogr_core.bench.{module}"), func)


SUITES = (
    Suite("headline", "latency:suite_headline",
          "whole-decode latency of every method (graph and eager), checks, speedups, the warm-up plan of every shape"),
    Suite("beam-sweep", "latency:suite_beam_sweep", "the same over beam widths (default synthetic-7)"),
    Suite("codebook-sweep", "latency:suite_codebook_sweep", "the same over the codebook size V of synthetic-7"),
    Suite("steps", "steps:suite_steps", "per-step latency of every method (each step's own graph), and the GEMMs"),
    Suite("stages", "steps:suite_stages",
          "per step: filtering+projection, normalisation (unfused), selection+gather"),
    # The naive variant packs a weight copy per call, which can exhaust the GPU memory the app shares.
    Suite("ablation", "steps:suite_ablation",
          "step 2 alone: full projection vs naive selective vs slot-based selective", in_app=False),
    Suite("memory", "index_suites:suite_memory",
          "index bytes per step: zerogr vs STATIC-style vs int16 SID table vs host trie"),
    Suite("build", "index_suites:suite_build",
          "index construction: layout streaming (2 and 1 staging buffers), full host then copy, serial, "
          "STATIC-style; H2D bandwidth for 60 s / 90 s windows"),
    Suite("interference", "index_suites:suite_interference",
          "decode p50/p99 while a streaming (or full-host) rebuild runs beside it"),
    # Fresh processes with empty caches would compete with the app's own GPU work.
    Suite("coldstart", "coldstart:suite_coldstart",
          "seconds to the first decode of a shape in a fresh process, with empty then warm plan and Triton caches",
          in_app=False),
    Suite("constraints", "live:suite_constraints",
          "decode latency with per-request deny lists (0, 100, 10,000 rows) and a 1 % allow list against none, "
          "on the engine with prebuilt lists and through Decoder.decode with item ids (registered sets too)"),
    # Threads decode while the catalog is rebuilt beside them: not for the app's shared GPU.
    Suite("live", "live:suite_live",
          "live-catalog load test: threads decode while items are deleted, added and the catalog replaced "
          "every second; failed requests, invalid/deleted items, p50/p99 against idle", in_app=False),
)

SUITE_NAMES = tuple(s.name for s in SUITES)
APP_SUITES = tuple(s.name for s in SUITES if s.in_app)
BY_NAME = {s.name: s for s in SUITES}

__all__ = ["APP_SUITES", "BY_NAME", "SUITES", "SUITE_NAMES", "Suite"]
