"""Per-step density of a catalog, and how much of scoring first's work is wasted.

Definitions (docs/design.md §9, glossary):

* catalog-level density of step l: E_l / (S_l · |V_l|), the mean share of the codebook
  that is valid after a state, every state of the prefix tree counted once;
* beam-weighted density ρ_l: Σ_b |Next_l(p_b)| / (B_l · |V_l|) over the *active* beams
  of a real decode, where B_l is the number of active beams at step l. Popular prefixes
  hold many beams, so ρ_l can differ a lot from the catalog-level figure;
* wasted share: scoring first computes a logit for every row it projects (the level's
  codebook, or the whole shared head) for every beam; only Σ_b |Next_l(p_b)| of them can
  ever be chosen, the rest is wasted.
"""
from __future__ import annotations

import numpy as np
import torch

from ..catalog.catalog import Catalog


def segment_lengths(catalog: Catalog) -> list[np.ndarray]:
    """Branching factor of every state, per step (``[S_l]`` int64 arrays)."""
    return [catalog.segment_lengths(level) for level in range(catalog.n_levels)]


def beam_weighted_density(catalog: Catalog, states: list[torch.Tensor], projected_rows=None,
                          seg_lengths: list[np.ndarray] | None = None) -> list[dict]:
    """Beam-weighted density and wasted logits of a decode.

    Parameters
    ----------
    catalog : Catalog
    states : list of torch.Tensor
        Per step, the input state of every beam (-1 for a dead beam), as recorded by
        :func:`zerogr_core.app_support.profile.profiled_decode`.
    projected_rows : sequence of int, optional
        Rows scoring first projects per beam at each step (default: the level's codebook;
        pass the shared head's row count for a shared head).
    seg_lengths : list of np.ndarray, optional
        Precomputed :func:`segment_lengths`.

    Returns
    -------
    list of dict
        Per step: ``step``, ``codebook``, ``active_beams``, ``valid_logits`` (Σ|Next|),
        ``beam_density`` (ρ_l), ``scored_logits`` (what scoring first computes),
        ``wasted_share``, ``mean_valid`` (mean |Next| per active beam).
    """
    seg_lengths = seg_lengths or segment_lengths(catalog)
    rows = []
    for level, st in enumerate(states):
        st = st.detach().cpu().numpy()
        alive = st[st >= 0]
        seg = seg_lengths[level]
        valid = int(seg[alive].sum()) if alive.size else 0
        codebook = int(catalog.codebook_sizes[level])
        projected = int(projected_rows[level]) if projected_rows is not None else codebook
        beams = int(alive.size)
        scored = beams * projected
        rows.append(dict(step=level + 1, codebook=codebook, active_beams=beams, valid_logits=valid,
                         beam_density=valid / (beams * codebook) if beams else float("nan"),
                         scored_logits=scored, wasted_share=1 - valid / scored if scored else float("nan"),
                         mean_valid=valid / beams if beams else float("nan")))
    return rows


def total_waste(rows: list[dict]) -> float:
    """Share of all scoring-first logits (over every step) that no beam can choose."""
    scored = sum(r["scored_logits"] for r in rows)
    valid = sum(r["valid_logits"] for r in rows)
    return 1 - valid / scored if scored else float("nan")


def histogram_counts(lengths: np.ndarray, max_bins: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Counts of each segment length (exact when few distinct values, else binned).

    Returns
    -------
    values : np.ndarray — segment length (bin start)
    counts : np.ndarray — number of states
    """
    values, counts = np.unique(lengths, return_counts=True)
    if values.size <= max_bins:
        return values, counts
    edges = np.unique(np.linspace(values.min(), values.max() + 1, max_bins + 1).astype(np.int64))
    hist, edges = np.histogram(lengths, bins=edges)
    return edges[:-1], hist
