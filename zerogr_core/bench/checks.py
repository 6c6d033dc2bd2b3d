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
    neighbour, or is the last beam kept), or ``"different"``; ``passed`` is true for the
    first two.
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
        # the last live beam: the other decode kept another candidate within tol of it
        cut = both.clone()
        cut[:, :-1] &= ~both[:, 1:]
        ties_ok = bool(((left | right | cut) | ~mism).all())
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


#: Two beams whose float64 scores differ by at most this are an exact tie: each decode's
#: float32 score of a beam may be off by up to :data:`CONTRACT_TOLERANCE` (summation order),
#: so either decode may keep either beam of such a pair.
TIE_TOLERANCE = 2 * CONTRACT_TOLERANCE
#: A first divergence wider than this many beams per request is never a tie (not scored).
MAX_TIED_BEAMS = 64


def _live(prefixes: list) -> set:
    return {tuple(p) for p in prefixes if min(p, default=0) >= 0}


def compare_sets(got, ref, got_kept, ref_kept, score_of, tol: float, tie_tol: float = TIE_TOLERANCE) -> dict:
    """Compare two decodes request by request as sets of beams with their scores.

    Differences are tolerated only where they start at an exact tie: at the first step
    where a request's kept beams differ, the beams kept by one decode and not the other
    must all have the same float64 score (within ``tie_tol``, recomputed by ``score_of``
    independently of both decodes); what follows from that step differs legitimately.

    Parameters
    ----------
    got, ref : tuple
        (tokens (B, M, L) int64, scores (B, M) float32, ...) of the two decodes.
    got_kept, ref_kept : list of torch.Tensor
        Per step l, the beams kept (B, beams, l + 1) (:meth:`~.replay.StepTrace.kept`).
    score_of : callable(request, prefix tuple) -> float
        Float64 score of a prefix (:func:`~.replay.prefix_score`).
    tol : float
        Largest score difference of a beam present in both.

    Returns
    -------
    dict
        ``status``: ``"equal"`` (same tokens in the same order), ``"equal-as-sets"`` (same
        beams per request, order differing only among equal scores), ``"equal-up-to-ties"``
        (some requests diverge at an exact tie, listed in ``tie_requests``) or
        ``"different"`` (``failure`` says where); ``passed`` unless different; the largest
        score difference of common beams, beams not in the reference, mean overlap.
    """
    tg, sg, tr, sr = got[0], got[1], ref[0], ref[1]
    if tg.shape != tr.shape:
        return dict(passed=False, status="different", reason=f"shapes {tuple(tg.shape)} vs {tuple(tr.shape)}")
    tgl, sgl, trl, srl = tg.tolist(), sg.tolist(), tr.tolist(), sr.tolist()
    gk, rk = [k.tolist() for k in got_kept], [k.tolist() for k in ref_kept]
    max_diff, mismatched, overlaps, ties, failure, max_spread = 0.0, 0, [], [], None, 0.0
    for b in range(len(tgl)):
        fg = {tuple(t): s for t, s in zip(tgl[b], sgl[b]) if s != NEG_INF}
        fr = {tuple(t): s for t, s in zip(trl[b], srl[b]) if s != NEG_INF}
        common = fg.keys() & fr.keys()
        max_diff = max([max_diff] + [abs(fg[k] - fr[k]) for k in common])
        mismatched += len(fg) - len(common)
        overlaps.append(len(common) / max(len(fr), 1))
        if len(common) == len(fg) == len(fr):
            continue
        for level in range(len(rk)):
            gs, rs = _live(gk[level][b]), _live(rk[level][b])
            if gs != rs:
                break
        only_g, only_r = gs - rs, rs - gs
        where = f"request {b} step {level + 1}"
        if not only_g and not only_r:
            failure = failure or f"{where}: the same beams, but live beams or padding differ"
            continue
        if len(only_g) != len(only_r) or len(only_g) > MAX_TIED_BEAMS:
            failure = failure or f"{where}: {len(only_g)} beams only in this decode, {len(only_r)} only in the reference"
            continue
        scores = [score_of(b, p) for p in only_g | only_r]
        spread = max(scores) - min(scores)
        max_spread = max(max_spread, spread)
        if not spread <= tie_tol:
            failure = failure or (f"{where}: the {len(scores)} beams kept by only one decode span {spread:.3g} "
                                  f"in score (not a tie within {tie_tol:g})")
            continue
        ties.append(dict(request=b, step=level + 1, beams=len(only_g), spread=spread))
    sets_equal = mismatched == 0 and not ties and failure is None
    if failure is None and max_diff > tol:
        failure = f"a common beam's score differs by {max_diff:.3g} > {tol:g}"
    if failure is not None:
        status = "different"
    elif ties:
        status = "equal-up-to-ties"
    elif torch.equal(tg, tr):
        status = "equal"
    else:
        status = "equal-as-sets" if sets_equal else "different"
    return dict(passed=status != "different", status=status, tokens_equal=bool(torch.equal(tg, tr)),
                max_score_diff=max_diff, mismatched_beams=mismatched, tol=tol, tie_tol=tie_tol,
                tie_requests=ties[:16], n_tie_requests=len(ties), max_tie_spread=max_spread, failure=failure,
                mean_overlap=sum(overlaps) / max(len(overlaps), 1))
