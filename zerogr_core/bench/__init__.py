"""The benchmark suite: ZeroGR against its baselines, as one reproducible command.

``python -m zerogr_core bench`` (see :mod:`zerogr_core.bench.commands`) times the
filtering-first GPU engine against scoring first over a STATIC-style index (as published
and adapted), unconstrained decoding, a host-side trie and the naive selective
projection, on the same catalog, hidden states and heads; plus per-step, per-stage,
step-2 ablation, index memory, index construction and rebuild-interference reports.

The timing path imports with torch, numpy and triton alone (it runs on the lent GPU,
which has no Polars or Plotly); :mod:`zerogr_core.bench.figures` turns the JSON/CSV
results into Plotly figures afterwards.
"""
from .results import load_results

__all__ = ["load_results"]
