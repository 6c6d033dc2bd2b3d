"""Assertions and random inputs for the kernel tests.

``assert_kernel_equal`` compares integers exactly and floats within a per-dtype tolerance,
and names the first mismatches. ``assert_selection_equivalent`` accepts two top-k
selections that differ only by reordering of near-ties. The ``random_*`` helpers build
step mappings with empty segments and dead beams.
"""
from __future__ import annotations

import numpy as np
import torch

TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1e-2),
}
"""(rtol, atol) per precision: ``|got - expected| <= atol + rtol * |expected|``."""


def _fail(name: str, mask: torch.Tensor, got: torch.Tensor, expected: torch.Tensor, what: str,
          max_show: int) -> None:
    idx = mask.nonzero()
    lines = [f"{name}: {idx.shape[0]} of {mask.numel()} elements differ ({what}); first:"]
    for row in idx[:max_show].tolist():
        at = tuple(row)
        lines.append(f"  at {at}: got {got[at].item()!r}, expected {expected[at].item()!r}")
    raise AssertionError("\n".join(lines))


def assert_kernel_equal(got: torch.Tensor, expected: torch.Tensor, *, name: str = "tensor",
                        dtype: torch.dtype | None = None, rtol: float | None = None,
                        atol: float | None = None, max_show: int = 8) -> None:
    """Assert that a kernel output equals its reference.

    Integer and bool tensors must match exactly. Float tensors must have the same
    infinities at the same places, no NaN where the reference has none, and finite
    values within ``atol + rtol * |expected|``.

    Parameters
    ----------
    got, expected : torch.Tensor
        Same shape and dtype (compared on the CPU).
    name : str
        Shown in the failure message.
    dtype : torch.dtype, optional
        Precision whose tolerance applies (e.g. the kernel's input dtype); defaults to
        ``expected.dtype``. ``rtol`` / ``atol`` override it.
    max_show : int
        Number of mismatches listed.
    """
    assert got.shape == expected.shape, f"{name}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
    assert got.dtype == expected.dtype, f"{name}: dtype {got.dtype} != {expected.dtype}"
    got, expected = got.detach().cpu(), expected.detach().cpu()
    if not got.is_floating_point():
        bad = got != expected
        if bad.any():
            _fail(name, bad, got, expected, "exact", max_show)
        return
    d_rtol, d_atol = TOLERANCES.get(dtype or expected.dtype, TOLERANCES[torch.float32])
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    g, e = got.double(), expected.double()
    nan_bad = torch.isnan(g) != torch.isnan(e)
    if nan_bad.any():
        _fail(name, nan_bad, got, expected, "NaN", max_show)
    inf_bad = (torch.isinf(g) | torch.isinf(e)) & (g != e)
    if inf_bad.any():
        _fail(name, inf_bad, got, expected, "infinity", max_show)
    fin = torch.isfinite(e)
    bad = fin & ((g - e).abs() > atol + rtol * e.abs())
    if bad.any():
        _fail(name, bad, got, expected, f"rtol={rtol}, atol={atol}", max_show)


def assert_outputs_equal(got, expected, *, names, **tol) -> None:
    """:func:`assert_kernel_equal` over parallel tuples of outputs."""
    for g, e, n in zip(got, expected, names, strict=True):
        assert_kernel_equal(g, e, name=n, **tol)


def assert_selection_equivalent(got, expected, cand_scores: torch.Tensor,
                                slot_tokens: torch.Tensor, slot_succ: torch.Tensor, batch: int,
                                *, tol: float = 1e-4) -> None:
    """Assert two top-k selections agree up to the order of candidates within ``tol``.

    ``got`` and ``expected`` are ``(scores, parents, tokens, succ)`` tuples as returned
    by :func:`zerogr_kernels.topk_gather`; ``cand_scores`` ``(n_beams, K)`` are the reference
    candidate scores. Checks: scores equal rank by rank within ``tol``; every selected
    item is a real, distinct candidate of its request whose reference score is within
    ``tol`` of the reported one, with the right next state; every expected item clearly
    above the cut (by more than ``tol``) is selected.
    """
    gs, gp, gt, gn = (t.cpu() for t in got)
    es, ep, et, _ = (t.cpu() for t in expected)
    cand, toks, succ = cand_scores.cpu().double(), slot_tokens.cpu(), slot_succ.cpu()
    assert_kernel_equal(gs, es, name="scores", rtol=0.0, atol=tol)
    mb = cand.shape[0] // batch
    for r in range(batch):
        items = set()
        for i in range(gs.shape[1]):
            if gs[r, i] == float("-inf"):
                assert gp[r, i] == -1 and gt[r, i] == -1 and gn[r, i] == -1, f"request {r} rank {i}: bad padding"
                continue
            p, t = int(gp[r, i]), int(gt[r, i])
            assert r * mb <= p < (r + 1) * mb, f"request {r} rank {i}: parent {p} outside the request"
            ks = (toks[p] == t).nonzero().flatten()
            assert ks.numel() == 1, f"request {r} rank {i}: token {t} is not a slot of beam {p}"
            k = int(ks[0])
            assert abs(cand[p, k] - float(gs[r, i])) <= tol, f"request {r} rank {i}: score differs from its slot"
            assert gn[r, i] == succ[p, k], f"request {r} rank {i}: wrong next state"
            assert (p, t) not in items, f"request {r}: item ({p}, {t}) selected twice"
            items.add((p, t))
        finite = es[r] > float("-inf")
        if finite.any():
            cut = float(es[r][finite].min())
            for i in finite.nonzero().flatten().tolist():
                if float(es[r, i]) > cut + tol:
                    assert (int(ep[r, i]), int(et[r, i])) in items, f"request {r}: missed rank {i}"


def random_sparse_mapping(rng: np.random.Generator, n_states: int, vocab: int, max_len: int, *,
                          empty_frac: float = 0.25, token_dtype=torch.int16,
                          offset_dtype=torch.int32, device="cpu"):
    """Random sparse mapping ``(tokens, offsets, K)``.

    Each of ``n_states`` segments holds sorted distinct tokens of ``range(vocab)``, of
    length up to ``min(max_len, vocab)`` (about ``empty_frac`` of them empty; at least one
    segment has the maximum length). ``K`` is the longest segment, at least 1.
    """
    top = min(max_len, vocab)
    lens = rng.integers(1, top + 1, n_states)
    lens[rng.random(n_states) < empty_frac] = 0
    lens[rng.integers(n_states)] = top
    segs = [np.sort(rng.choice(vocab, size=n, replace=False)) for n in lens]
    tokens = np.concatenate(segs) if segs else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    return (torch.as_tensor(tokens.astype(np.int64)).to(token_dtype).to(device),
            torch.as_tensor(offsets).to(offset_dtype).to(device), int(max(lens.max(), 1)))


def random_dense_table(rng: np.random.Generator, n_states: int, vocab: int, *, density: float = 0.5,
                       dtype=torch.int64, device="cpu") -> torch.Tensor:
    """Random ``(n_states, vocab)`` successor table: valid cells numbered in row-major
    order (like real successors), -1 elsewhere; about ``density`` of the cells valid."""
    valid = rng.random((n_states, vocab)) < density
    table = np.where(valid, np.cumsum(valid).reshape(n_states, vocab) - 1, -1)
    return torch.as_tensor(table).to(dtype).to(device)


def random_states(rng: np.random.Generator, n_beams: int, n_states: int, *, dead_frac: float = 0.2,
                  device="cpu") -> torch.Tensor:
    """``(n_beams,)`` int64 states in ``[0, n_states)``, about ``dead_frac`` of them -1."""
    q = rng.integers(0, n_states, n_beams)
    q[rng.random(n_beams) < dead_frac] = -1
    return torch.as_tensor(q, dtype=torch.int64).to(device)


def kernel_device() -> str:
    """Device the kernel tests run on: the GPU when present, else the CPU (interpreter)."""
    return "cuda" if torch.cuda.is_available() else "cpu"
