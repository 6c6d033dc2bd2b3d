"""Output checks run before timing: valid catalog items, and equality with a reference."""
from __future__ import annotations

import torch

from ..decode.orders import resolve_rows
from ..index.layout import StepIndex

NEG_INF = float("-inf")
#: Score tolerance (absolute, on accumulated log-probabilities) per head dtype.
TOLERANCE = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}
#: Score tolerance of zerogr under its plan against the filter-first reference, any head
#: dtype: both keep float32 logits, so only float32 summation order differs.
CONTRACT_TOLERANCE = 1e-4


def check_valid(index: StepIndex, tokens: torch.Tensor, scores: torch.Tensor, states: torch.Tensor, *,
                constrained: bool) -> dict:
    """Are the beams catalog items or padding?

    Parameters
    ----------
    tokens : (B, M, L) int64; scores : (B, M) float32; states : (B, M) int64 (catalog rows
        for constrained decoders)
    constrained : bool
        Whether every non-padded beam must be an item (all but unconstrained decoding).

    Returns
    -------
    dict
        ``passed`` and the counts behind it: beams, padded, valid items, duplicates,
        wrong final rows, unsorted requests, malformed padding.
    """
    B, M, L = tokens.shape
    pad = scores == NEG_INF
    rows = resolve_rows(index, tokens.reshape(-1, L).to(torch.int64)).view(B, M)
    live = ~pad
    is_item = (rows >= 0) & live
    bad_padding = int(((tokens != -1).any(-1) & pad).sum())
    if constrained:
        bad_padding += int(((states != -1) & pad).sum())
    wrong_rows = int(((states != rows) & is_item).sum()) if constrained else 0
    # duplicates: equal item rows within a request
    keyed = torch.where(is_item, rows, -1 - torch.arange(M, device=rows.device)[None, :])
    sorted_rows, _ = keyed.sort(dim=1)
    dups = int(((sorted_rows[:, 1:] == sorted_rows[:, :-1]) & (sorted_rows[:, 1:] >= 0)).sum())
    finite = torch.where(live, scores, torch.tensor(NEG_INF, device=scores.device))
    unsorted = int((finite[:, 1:] > finite[:, :-1] + 1e-6).any(1).sum())
    # padding must come last
    pad_then_live = int((pad[:, :-1] & live[:, 1:]).sum())
    n_live = int(live.sum())
    n_items = int(is_item.sum())
    passed = bad_padding == 0 and unsorted == 0 and pad_then_live == 0 and (
        not constrained or (n_items == n_live and wrong_rows == 0 and dups == 0))
    return dict(passed=bool(passed), beams=B * M, padded=int(pad.sum()), live=n_live, items=n_items,
                item_fraction=n_items / max(n_live, 1), duplicates=dups, wrong_rows=wrong_rows,
                unsorted_requests=unsorted, bad_padding=bad_padding + pad_then_live)


def compare(got, ref, tol: float) -> dict:
    """Compare two decodes (tokens, scores, states), tolerating reordered near-ties.

    ``status`` is ``"equal"`` (same tokens, scores within ``tol``), ``"equal-up-to-ties"``
    (scores within ``tol`` and every beam whose tokens differ sits at a near-tie with a
    neighbour), or ``"different"``; ``passed`` is true for the first two.
    """
    tg, sg = got[0], got[1]
    tr, sr = ref[0], ref[1]
    if tg.shape != tr.shape:
        return dict(passed=False, status="different", reason=f"shapes {tuple(tg.shape)} vs {tuple(tr.shape)}")
    pad_g, pad_r = sg == NEG_INF, sr == NEG_INF
    same_padding = bool(torch.equal(pad_g, pad_r))
    both = ~pad_g & ~pad_r
    diff = (sg - sr).abs()[both]
    max_diff = float(diff.max()) if diff.numel() else 0.0
    tokens_equal = bool(torch.equal(tg, tr))
    mism = (tg != tr).any(-1) & both
    n_mism = int(mism.sum())
    ties_ok = True
    if n_mism:
        s = sr
        left = torch.zeros_like(mism)
        right = torch.zeros_like(mism)
        left[:, 1:] = (s[:, 1:] - s[:, :-1]).abs() <= tol
        right[:, :-1] = (s[:, :-1] - s[:, 1:]).abs() <= tol
        ties_ok = bool(((left | right) | ~mism).all())
    # item-set overlap per request (the quality measure of the paper)
    B, M, L = tg.shape
    overlap = []
    for b in range(B):
        a = {tuple(r) for r, live in zip(tg[b].tolist(), (~pad_g[b]).tolist()) if live}
        c = {tuple(r) for r, live in zip(tr[b].tolist(), (~pad_r[b]).tolist()) if live}
        overlap.append(len(a & c) / max(len(c), 1))
    close = same_padding and max_diff <= tol
    if tokens_equal and close:
        status = "equal"
    elif close and ties_ok:
        status = "equal-up-to-ties"
    else:
        status = "different"
    return dict(passed=status != "different", status=status, tokens_equal=tokens_equal,
                same_padding=same_padding, max_score_diff=max_diff, mismatched_beams=n_mism, tol=tol,
                mean_overlap=sum(overlap) / len(overlap))
