"""Shared selective projection: beams in one state read their head rows once.

A state (a prefix) owns one segment of valid next tokens, so every beam in that state has
the same slot tokens and needs the same head rows. Beams of one request never share a
state (they are distinct prefixes), but beams of different requests do: at step 1 every
beam is in the root state, and later a batch's requests often reach the same popular
prefixes. :func:`selective_proj` gathers a token's head row once per beam that has it;
this op gathers it once per group of up to ``group_size`` beams in one state and takes
its dot products with all of their hidden vectors. The head rows are what bounds the
selective projection (on the H200, float32 H 4096 at batch 32, step 2 reads about 10 GB
of gathered rows), so the bytes saved are the beams that found a partner.

Grouping: :func:`zerogr_kernels.group_beams` sorts the beams by state (a counting sort, no
host synchronisation). A beam whose rank inside its state's run of the sorted order is
a multiple of ``group_size`` (at most :data:`MAX_GROUP`) leads the next ``group_size``
beams of its state. One program per (sorted position, 64-slot column block) does the work
of a leader and exits at once otherwise.

Per-request constraints kill slots per beam (token -1), so the beams of a group may differ
in which slots are alive: a program loads the head rows of the slots alive in any member
and stores each member's logits only into its own alive slots. Every member's logit is
computed by the same float32 arithmetic whatever the group's size or order, so the result
does not depend on the batch's other requests.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, cdiv, check_tensor, next_pow2, pdl_args, pdl_prologue, use_triton
from .beam_groups import BeamGroups
from .filtering import TASK_WIDTH
from .selective import slot_dot_products


def _check(hidden, weight, slot_tokens, slot_logits, groups, band_start, group_size) -> None:
    check_tensor("slot_tokens", slot_tokens, dtypes=(torch.int32,), ndim=2, contiguous=True)
    n_beams, K = slot_tokens.shape
    device = slot_tokens.device
    check_tensor("hidden", hidden, dtypes=FLOAT_DTYPES, ndim=2, device=device, shape=(n_beams, None))
    check_tensor("weight", weight, dtypes=(hidden.dtype,), ndim=2, device=device, shape=(None, hidden.shape[1]))
    check_tensor("slot_logits", slot_logits, dtypes=(torch.float32,), ndim=2, device=device,
                 shape=(n_beams, K), contiguous=True)
    if not isinstance(groups, BeamGroups):
        raise TypeError(f"groups must be a BeamGroups from group_beams, got {type(groups).__name__}")
    for name, t in zip(BeamGroups._fields[:3], groups):
        check_tensor(f"groups.{name}", t, dtypes=(torch.int64,), ndim=1, device=device, shape=(n_beams,),
                     contiguous=True)
    if not 0 <= band_start < max(weight.shape[0], 1):
        raise ValueError(f"band_start={band_start} outside the {weight.shape[0]} rows of weight")
    if group_size not in (1, 2, MAX_GROUP):
        raise ValueError(f"group_size must be 1, 2 or {MAX_GROUP}, got {group_size!r}")


MAX_GROUP = 4
"""Most beams one program serves (each has its own accumulator, unrolled in the kernel)."""


@triton.jit
def _member(order_ptr, sstate_ptr, slot_tok_ptr, pos, j, q, n_beams, K, slot, in_row):
    # beam at sorted position pos + j, whether it shares state q, and its slot tokens (-1 if not)
    at = pos + j
    ok = at < n_beams
    ok = ok & (tl.load(sstate_ptr + at, mask=ok, other=-1) == q)
    beam = tl.load(order_ptr + at, mask=ok, other=0)
    tok = tl.load(slot_tok_ptr + beam * K + slot, mask=in_row & ok, other=-1)
    return beam, ok, tok


@triton.jit
def _member_fma(acc, w, h_row, hh, h_ok, stride_hh):
    x = tl.load(h_row + hh * stride_hh, mask=h_ok, other=0.0).to(tl.float32)
    return acc + w * x[None, :]


@triton.jit
def _shared_proj_kernel(hidden_ptr, weight_ptr, slot_tok_ptr, order_ptr, sstate_ptr, first_ptr, out_ptr,
                        n_beams, K, band_start, stride_hb, stride_hh, stride_wv, stride_wh,
                        H: tl.constexpr, G: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                        PDL: tl.constexpr):
    pdl_prologue(PDL)
    # grid: (sorted position, column block of BLOCK_T slots). Members 1..G-1 are unrolled, each
    # with its own (slots x chunk) accumulator in the layout of the head tile, reduced once at the
    # end: a member costs its hidden-chunk loads and multiply-adds, an absent member a branch.
    pos = tl.program_id(0)
    q = tl.load(sstate_ptr + pos)
    rank = pos - tl.load(first_ptr + pos)
    if (q >= 0) & (rank % G == 0):
        slot = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        in_row = slot < K
        b0, _, t0 = _member(order_ptr, sstate_ptr, slot_tok_ptr, pos, 0, q, n_beams, K, slot, in_row)
        # a slot's token is the state's, or -1 where a member's lists killed it
        tok = t0
        if G > 1:
            b1, ok1, t1 = _member(order_ptr, sstate_ptr, slot_tok_ptr, pos, 1, q, n_beams, K, slot, in_row)
            tok = tl.maximum(tok, t1)
        if G > 2:
            b2, ok2, t2 = _member(order_ptr, sstate_ptr, slot_tok_ptr, pos, 2, q, n_beams, K, slot, in_row)
            b3, ok3, t3 = _member(order_ptr, sstate_ptr, slot_tok_ptr, pos, 3, q, n_beams, K, slot, in_row)
            tok = tl.maximum(tl.maximum(tok, t2), t3)
        need = tok >= 0
        if tl.max(need.to(tl.int32), axis=0) > 0:
            offs_h = tl.arange(0, BLOCK_H)
            w_rows = weight_ptr + (band_start + tok).to(tl.int64) * stride_wv
            acc0 = tl.zeros([BLOCK_T, BLOCK_H], tl.float32)
            acc1 = tl.zeros([BLOCK_T, BLOCK_H], tl.float32)
            acc2 = tl.zeros([BLOCK_T, BLOCK_H], tl.float32)
            acc3 = tl.zeros([BLOCK_T, BLOCK_H], tl.float32)
            for c in range(tl.cdiv(H, BLOCK_H)):
                hh = c * BLOCK_H + offs_h
                h_ok = hh < H
                w = tl.load(w_rows[:, None] + hh[None, :] * stride_wh, mask=need[:, None] & h_ok[None, :],
                            other=0.0).to(tl.float32)
                acc0 = _member_fma(acc0, w, hidden_ptr + b0 * stride_hb, hh, h_ok, stride_hh)
                if G > 1:
                    if ok1:
                        acc1 = _member_fma(acc1, w, hidden_ptr + b1 * stride_hb, hh, h_ok, stride_hh)
                if G > 2:
                    if ok2:
                        acc2 = _member_fma(acc2, w, hidden_ptr + b2 * stride_hb, hh, h_ok, stride_hh)
                    if ok3:
                        acc3 = _member_fma(acc3, w, hidden_ptr + b3 * stride_hb, hh, h_ok, stride_hh)
            tl.store(out_ptr + b0 * K + slot, tl.sum(acc0, axis=1), mask=t0 >= 0)
            if G > 1:
                tl.store(out_ptr + b1 * K + slot, tl.sum(acc1, axis=1), mask=t1 >= 0)
            if G > 2:
                tl.store(out_ptr + b2 * K + slot, tl.sum(acc2, axis=1), mask=t2 >= 0)
                tl.store(out_ptr + b3 * K + slot, tl.sum(acc3, axis=1), mask=t3 >= 0)


def default_tuning(K: int, H: int) -> tuple[int, int]:
    """``(block_h, num_warps)`` for rows of ``K`` slots and hidden size ``H``: 32-column chunks
    on 4 warps, the best of the H200 sweep on search-like step 2 for pairs and for groups of
    four, in float32 and float16 (``runs/results/projection-sweep/shared.json``; 64 columns
    with 8 warps was 12 % slower for pairs in float32 at batch 32, 14 % at batch 128)."""
    return min(next_pow2(H), 32), 4


def shared_selective_proj_triton(hidden: torch.Tensor, weight: torch.Tensor, slot_tokens: torch.Tensor,
                                 slot_logits: torch.Tensor, groups: BeamGroups, *, band_start: int = 0,
                                 group_size: int = MAX_GROUP, block_h: int | None = None,
                                 num_warps: int | None = None) -> torch.Tensor:
    """Triton launcher of :func:`shared_selective_proj` (same signature and output)."""
    _check(hidden, weight, slot_tokens, slot_logits, groups, band_start, group_size)
    n_beams, K = slot_tokens.shape
    if n_beams == 0:
        return slot_logits
    H = hidden.shape[1]
    block_t = min(TASK_WIDTH, next_pow2(K))
    auto_h, auto_warps = default_tuning(K, H)
    _shared_proj_kernel[(n_beams, cdiv(K, block_t))](
        hidden, weight, slot_tokens, groups.order, groups.states, groups.first, slot_logits,
        n_beams, K, band_start, hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1),
        H=H, G=group_size, BLOCK_T=block_t, BLOCK_H=auto_h if block_h is None else block_h,
        num_warps=auto_warps if num_warps is None else num_warps, **pdl_args(slot_logits.device))
    return slot_logits


def shared_selective_proj_reference(hidden: torch.Tensor, weight: torch.Tensor, slot_tokens: torch.Tensor,
                                    slot_logits: torch.Tensor, groups: BeamGroups, *, band_start: int = 0,
                                    group_size: int = MAX_GROUP, block_h: int | None = None,
                                    num_warps: int | None = None) -> torch.Tensor:
    """Pure-PyTorch reference of :func:`shared_selective_proj` (same signature and output).

    Computes every alive slot's logit beam by beam (the grouping only saves reads); the
    groups and tuning arguments are checked and otherwise ignored.
    """
    _check(hidden, weight, slot_tokens, slot_logits, groups, band_start, group_size)
    return slot_dot_products(hidden, weight, slot_tokens, slot_tokens >= 0, slot_logits, band_start)


def shared_selective_proj(hidden: torch.Tensor, weight: torch.Tensor, slot_tokens: torch.Tensor,
                          slot_logits: torch.Tensor, groups: BeamGroups, *, band_start: int = 0,
                          group_size: int = MAX_GROUP, block_h: int | None = None,
                          num_warps: int | None = None) -> torch.Tensor:
    """Logits of every alive slot, reading each head row once per group of beams in one state.

    Writes ``slot_logits[b, k] = hidden[b] . weight[band_start + slot_tokens[b, k]]``,
    accumulated in float32, wherever ``slot_tokens[b, k] >= 0``; other slots are left
    untouched. Same values as :func:`selective_proj` up to float32 summation order. Runs
    the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the PyTorch
    reference. No host synchronisation on the Triton path.

    Parameters
    ----------
    hidden : torch.Tensor
        ``(n_beams, H)`` float16, bfloat16 or float32 hidden states (any strides).
    weight : torch.Tensor
        ``(V_total, H)`` head of ``hidden``'s dtype (any strides; may be the whole shared
        head). Row ``band_start + t`` is token ``t``.
    slot_tokens : torch.Tensor
        ``(n_beams, K)`` int32 slot tokens from :func:`zerogr_kernels.filter_slots` (after any
        constraints), -1 = invalid. Beams in one state must have the same token in every slot
        that is alive in more than one of them, as filtering guarantees.
    slot_logits : torch.Tensor
        ``(n_beams, K)`` float32, contiguous; updated in place.
    groups : BeamGroups
        :func:`zerogr_kernels.group_beams` of the beams' states.
    band_start : int
        First row of the step's band in ``weight``.
    group_size : int
        Beams per group, 1, 2 or 4 (:data:`MAX_GROUP`): the most beams one program serves,
        so the most times one gathered row is used.
    block_h, num_warps : int, optional
        Triton tuning (:func:`default_tuning` when omitted).

    Returns
    -------
    torch.Tensor
        ``slot_logits``.
    """
    fn = shared_selective_proj_triton if use_triton(slot_tokens) else shared_selective_proj_reference
    return fn(hidden, weight, slot_tokens, slot_logits, groups, band_start=band_start, group_size=group_size,
              block_h=block_h, num_warps=num_warps)
