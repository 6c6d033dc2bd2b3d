"""Decode attention of a request's beams over its shared context plus each beam's own lineage.

At a decode step of the Qwen3 recommender (``zerogr_core.models.qwen3``) every beam of a
request attends to the same context keys (the request's prompt, stored once) and to its own
few lineage keys (the SID tokens it chose so far, at most ``P`` of them). The ``g`` query
heads of a KV head and all ``M`` beams form one ``(M · g, D)`` query matrix per (request, KV
head): a prefill-sized matrix against one short key sequence, so the context is read once
per query tile, never once per beam.

Flash-decoding: a program takes a block of those query rows and one split of the context,
streams the split's keys ``[start, min(end, len_b))`` once with an online float32 softmax,
and, with more than one split, writes its partial (row max, row sum, weighted values) to a
float32 workspace that a second kernel merges. The splits exist to fill the GPU: at batch 1
the (query block, request, KV head) programs alone would cover a quarter of an H200's SMs.
Padding past ``len_b`` is skipped, not masked, and no bias tensor is read. Each row's own
lineage keys are scored directly (a dot product per key: at most ``P`` per row), so the other
beams' lineage slots are never scored: by the merge kernel, beside its loads of the partials,
or by the only split's program when there is one. A beam's lineage key of position ``t``
sits in the slot of the beam that chose it (an ancestor table says which), so a step that
reorders the beams copies a few indices, not every layer's lineage keys.

Scores and softmax are float32 (in base 2, the scale folded into one multiplier); the
probabilities are rounded to the input dtype before they weight the values, as the fused
SDPA kernels do.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, cdiv, check_tensor, interpreting, next_pow2, use_triton

BLOCK_M = 64
"""Query rows per program on a GPU (a (request, KV head) has ``M · g`` of them). With
:data:`NUM_WARPS` 4 it beat 128 rows and 8 warps at every Qwen3-1.7B decode shape of the H200
sweep (``runs/results/llm/attention-tune.txt``: 16.0 against 16.8 µs at 1 × 1,024 keys, 38.5
against 51.8 at 1 × 5,056, 65.4 against 83.9 at 8 × 1,024, 245 against 305 at 8 × 5,056)."""
BLOCK_N = 64
"""Context keys per inner iteration on a GPU."""
MERGE_BLOCK_M = 16
"""Query rows per program of the merge kernel on a GPU."""
MERGE_NUM_WARPS = 8
"""Warps of a merge program. On a lent H100 (``runs/results/llm/session-2026-12-06/``) 16 rows and
8 warps, with the lineage scores summed in chunks (:data:`LINEAGE_CHUNK_D`), took 14.7 and 30.6 µs a
call at 1 × 1,024 and 1 × 5,056 keys, against 15.1 and 31.3 with 32 rows, 4 warps and whole-head
scores, and 15.5 and 31.3 with 32 rows, 4 warps and the chunks."""
NUM_WARPS = 4
NUM_STAGES = None
"""Software-pipelining depth of the key loop on a GPU; ``None`` chooses by the key blocks a split
streams (:func:`pipeline_stages`)."""
DEEP_PIPELINE_BLOCKS = 8
"""Key blocks per split from which three stages pay: in the H200 sweep
(``runs/results/llm/session-2026-12-04b/tune-variants.txt``) three stages took 8 × 5,056 keys from 230.5
to 196.3 µs, 8 × 1,024 (16 blocks) from 64.4 to 56.0 and 1 × 5,056 (4 splits of 20 blocks) from 33.0 to
30.3, while 1 × 1,024 (4 splits of 4 blocks) went from 14.4 to 14.8 µs."""
LINEAGE_CHUNK_D = 16
"""Head-dimension columns a lineage key's score sums at a time in the merge kernel
(:func:`_lineage_keys`; the chunks are unrolled, so the compiler may still issue their loads
together). The one-split kernel sums the whole head at once: chunked, it took 59.5 against 57.0 µs
at 8 × 1,024 keys on the H100 (249 registers against 229, neither spilling there)."""
MIN_SPLIT_KEYS = 256
"""Fewest context keys per split: below it the workspace traffic outweighs the extra programs."""
MAX_SPLITS = 32
LOG2E = 1.4426950408889634

_SMS: dict = {}


@triton.jit
def _context_block(q, k_base, v_base, n0, end, m_i, l_i, acc, sk_s, sv_s, dd, d_ok, qk_scale,
                   BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, MASKED: tl.constexpr):
    """Keys and values ``[n0, min(n0 + BLOCK_N, end))`` into the running softmax of the rows
    of ``q``; ``n0 < end``, so the block holds a key and the new row maxima are finite.
    Without ``MASKED`` the block is whole (``n0 + BLOCK_N ≤ end``) and the head dimension
    is ``BLOCK_D``: loads and scores go unpredicated, as in all but a split's last block."""
    n = n0 + tl.arange(0, BLOCK_N)
    n_ok = n < end
    if MASKED:
        k = tl.load(k_base + n[None, :] * sk_s + dd[:, None], mask=n_ok[None, :] & d_ok[:, None], other=0.0)
    else:
        k = tl.load(k_base + n[None, :] * sk_s + dd[:, None])
    if UPCAST:
        k = k.to(tl.float32)
    s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
    if MASKED:
        s = tl.where(n_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if MASKED:
        v = tl.load(v_base + n[:, None] * sv_s + dd[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    else:
        v = tl.load(v_base + n[:, None] * sv_s + dd[None, :])
    pv = p.to(v.dtype)
    if UPCAST:
        pv, v = pv.to(tl.float32), v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _lineage_keys(q_rows, q, k_base, v_base, anc_ptr, b, beam, r_ok, dd, d_ok, m_i, l_i, acc, R, D, context_len,
                  step, sk_s, sv_s, qk_scale, G: tl.constexpr, P: tl.constexpr, BLOCK_D: tl.constexpr,
                  CHUNK_D: tl.constexpr, TILE: tl.constexpr, HAS_ANC: tl.constexpr):
    """The rows' own lineage keys into their running softmax: one gathered key per row and SID
    position ``t < step``, in the slot of the beam that chose that position's token (the row's
    ancestor), or the beam's own. With ``TILE`` each score is one product with ``q``, the rows'
    query tile the caller holds; without, ``q_rows`` points at each row's query and each score
    sums ``CHUNK_D`` columns at a time, the query reloaded, so no float32 copy of the whole query
    tile and the whole gathered key stay live beside ``acc``."""
    for t in tl.static_range(P):
        ok = r_ok & (t < step)
        if HAS_ANC:
            owner = tl.load(anc_ptr + (b * (R // G) + beam) * P + t, mask=ok, other=0)
        else:
            owner = beam
        slot = context_len + owner * P + t
        if TILE:
            kl = tl.load(k_base + slot[:, None] * sk_s + dd[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)
            s = tl.sum(q.to(tl.float32) * kl.to(tl.float32), axis=1)
        else:
            s = tl.zeros_like(m_i)
            for c in tl.static_range(0, BLOCK_D, CHUNK_D):
                dc = c + tl.arange(0, CHUNK_D)
                m2 = ok[:, None] & (dc < D)[None, :]
                qc = tl.load(q_rows[:, None] + dc[None, :], mask=m2, other=0.0).to(tl.float32)
                kc = tl.load(k_base + slot[:, None] * sk_s + dc[None, :], mask=m2, other=0.0).to(tl.float32)
                s += tl.sum(qc * kc, axis=1)
        s = tl.where(ok, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, s)
        # a row with nothing scored yet keeps -inf; a finite reference keeps it free of NaN
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - ref)
        p = tl.math.exp2(s - ref)
        vl = tl.load(v_base + slot[:, None] * sv_s + dd[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)
        l_i = l_i * alpha + p
        acc = acc * alpha[:, None] + p.to(vl.dtype).to(tl.float32)[:, None] * vl.to(tl.float32)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _program_rows(R, KVH, D, G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """A program's (request, KV head) pair ``bh``, its request ``b`` and KV head ``kh``, and its query rows:
    row ``r`` of the head's ``M · g`` is beam ``r // g``'s query head ``kh · g + r % g``."""
    bh = tl.program_id(1)
    b = (bh // KVH).to(tl.int64)
    kh = bh % KVH
    r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dd = tl.arange(0, BLOCK_D)
    r_ok, d_ok = r < R, dd < D
    return bh, b, kh, r, r // G, kh * G + r % G, dd, r_ok, d_ok, r_ok[:, None] & d_ok[None, :]


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, len_ptr, anc_ptr, out_ptr, ws_m_ptr, ws_l_ptr, ws_acc_ptr,
                  R, KVH, D, context_len, step, chunk, qk_scale,
                  sq_b, sq_m, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
                  G: tl.constexpr, P: tl.constexpr, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK_BLOCKS: tl.constexpr, PRECISION: tl.constexpr,
                  UPCAST: tl.constexpr, EVEN_D: tl.constexpr, HAS_ANC: tl.constexpr):
    split = tl.program_id(2)
    bh, b, kh, r, beam, head, dd, r_ok, d_ok, rd_ok = _program_rows(R, KVH, D, G, BLOCK_M, BLOCK_D)
    q_rows = q_ptr + b * sq_b + beam * sq_m + head * sq_h
    q = tl.load(q_rows[:, None] + dd[None, :], mask=rd_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    k_base = k_ptr + b * sk_b + kh * sk_h
    v_base = v_ptr + b * sv_b + kh * sv_h
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # with several splits the merge kernel scores the lineage keys, so no split waits on their
    # dependent loads (the ancestor, then the key); one split scores them here
    if SPLITS == 1:
        m_i, l_i, acc = _lineage_keys(q_rows, q, k_base, v_base, anc_ptr, b, beam, r_ok, dd, d_ok, m_i, l_i, acc, R,
                                      D, context_len, step, sk_s, sv_s, qk_scale, G, P, BLOCK_D, BLOCK_D, True,
                                      HAS_ANC)

    length = tl.minimum(tl.load(len_ptr + b).to(tl.int32), context_len)
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    # whole blocks first, unpredicated (with an exact head dimension); the last, partial one masked
    whole = start + (tl.maximum(end - start, 0) // BLOCK_N) * BLOCK_N if EVEN_D else start
    if CHUNK_BLOCKS == 0:
        for n0 in range(start, whole, BLOCK_N):
            m_i, l_i, acc = _context_block(q, k_base, v_base, n0, end, m_i, l_i, acc, sk_s, sv_s, dd, d_ok, qk_scale,
                                           BLOCK_N, PRECISION, UPCAST, False)
        for n0 in range(whole, end, BLOCK_N):
            m_i, l_i, acc = _context_block(q, k_base, v_base, n0, end, m_i, l_i, acc, sk_s, sv_s, dd, d_ok, qk_scale,
                                           BLOCK_N, PRECISION, UPCAST, True)
    else:
        # the interpreter cannot take a loop bound read from memory: a fixed count, blocks past `end` skipped
        for i in range(CHUNK_BLOCKS):
            n0 = start + i * BLOCK_N
            if n0 < whole:
                m_i, l_i, acc = _context_block(q, k_base, v_base, n0, end, m_i, l_i, acc, sk_s, sv_s, dd, d_ok,
                                               qk_scale, BLOCK_N, PRECISION, UPCAST, False)
            elif n0 < end:
                m_i, l_i, acc = _context_block(q, k_base, v_base, n0, end, m_i, l_i, acc, sk_s, sv_s, dd, d_ok,
                                               qk_scale, BLOCK_N, PRECISION, UPCAST, True)

    if SPLITS == 1:
        o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        dst = out_ptr + ((b * (R // G) + beam) * (KVH * G) + head)[:, None] * D + dd[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=rd_ok)
    else:
        row = (bh * SPLITS + split).to(tl.int64) * R + r
        tl.store(ws_m_ptr + row, m_i, mask=r_ok)
        tl.store(ws_l_ptr + row, l_i, mask=r_ok)
        tl.store(ws_acc_ptr + row[:, None] * D + dd[None, :], acc, mask=rd_ok)


@triton.jit
def _merge_kernel(ws_m_ptr, ws_l_ptr, ws_acc_ptr, out_ptr, q_ptr, k_ptr, v_ptr, anc_ptr, R, KVH, D, context_len, step,
                  qk_scale, sq_b, sq_m, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h,
                  G: tl.constexpr, P: tl.constexpr, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_D: tl.constexpr, HAS_ANC: tl.constexpr, CHUNK_D: tl.constexpr):
    bh, b, kh, r, beam, head, dd, r_ok, d_ok, rd_ok = _program_rows(R, KVH, D, G, BLOCK_M, BLOCK_D)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # the rows' lineage keys first: their loads are independent of the partials' below
    q_rows = q_ptr + b * sq_b + beam * sq_m + head * sq_h
    m, l_sum, acc = _lineage_keys(q_rows, q_rows, k_ptr + b * sk_b + kh * sk_h, v_ptr + b * sv_b + kh * sv_h, anc_ptr,
                                  b, beam, r_ok, dd, d_ok, m, l_sum, acc, R, D, context_len, step, sk_s, sv_s, qk_scale,
                                  G, P, BLOCK_D, CHUNK_D, False, HAS_ANC)
    for s in tl.static_range(SPLITS):
        row = (bh * SPLITS + s).to(tl.int64) * R + r
        ms = tl.load(ws_m_ptr + row, mask=r_ok, other=float("-inf"))
        ls = tl.load(ws_l_ptr + row, mask=r_ok, other=0.0)
        accs = tl.load(ws_acc_ptr + row[:, None] * D + dd[None, :], mask=rd_ok, other=0.0)
        m_new = tl.maximum(m, ms)
        # an empty split (its keys all past len_b) carries -inf and weighs nothing
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        a, c = tl.math.exp2(m - ref), tl.math.exp2(ms - ref)
        l_sum = l_sum * a + ls * c
        acc = acc * a[:, None] + accs * c[:, None]
        m = m_new
    o = acc / tl.where(l_sum > 0.0, l_sum, 1.0)[:, None]
    dst = out_ptr + ((b * (R // G) + beam) * (KVH * G) + head)[:, None] * D + dd[None, :]
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=rd_ok)


def _unit_last(name, x) -> None:
    if x.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride in its last dimension")


def _check(q, k, v, lengths, context_len, lineage_len, step, lineage=None) -> int:
    """Validate the arguments; return g, the query heads per KV head."""
    check_tensor("q", q, dtypes=FLOAT_DTYPES, ndim=4)
    _unit_last("q", q)
    b, m, h, d = q.shape
    check_tensor("k", k, dtypes=(q.dtype,), ndim=4, device=q.device, shape=(b, None, None, d))
    _unit_last("k", k)
    s, kvh = k.shape[1], k.shape[2]
    check_tensor("v", v, dtypes=(q.dtype,), ndim=4, device=q.device, shape=(b, s, kvh, d))
    _unit_last("v", v)
    check_tensor("lengths", lengths, dtypes=(torch.int32, torch.int64), ndim=1, device=q.device, shape=(b,))
    if kvh < 1 or h % kvh:
        raise ValueError(f"q: {h} query heads are not a multiple of k's {kvh} KV heads")
    if not (isinstance(context_len, int) and context_len >= 1):
        raise ValueError(f"context_len must be an integer ≥ 1, got {context_len!r}")
    if not (isinstance(lineage_len, int) and lineage_len >= 1):
        raise ValueError(f"lineage_len must be an integer ≥ 1, got {lineage_len!r}")
    if not (isinstance(step, int) and 0 <= step <= lineage_len):
        raise ValueError(f"step must be an integer in [0, lineage_len={lineage_len}], got {step!r}")
    if context_len + m * lineage_len > s:
        raise ValueError(f"k: {s} slots hold no context of {context_len} plus {m} beams × {lineage_len} lineage slots")
    if lineage is not None:
        check_tensor("lineage", lineage, dtypes=(torch.int32, torch.int64), ndim=3, device=q.device,
                     shape=(b, m, lineage_len))
        if not lineage.is_contiguous():
            raise ValueError("lineage must be contiguous")
    return h // kvh


def split_count(context_len: int, programs: int, sms: int) -> int:
    """Context splits per (query block, request, KV head) program: up to about two programs
    per SM, at most one per :data:`MIN_SPLIT_KEYS` keys (and :data:`MAX_SPLITS`); 1 when the
    programs alone fill that."""
    want = 2 * sms // max(programs, 1)
    return max(1, min(want, context_len // MIN_SPLIT_KEYS, MAX_SPLITS))


def pipeline_stages(blocks_per_split: int) -> int:
    """Pipeline stages of the key loop: 3 from :data:`DEEP_PIPELINE_BLOCKS` key blocks per split
    on, else 2 (a short loop gains nothing from a deeper prologue); :data:`NUM_STAGES` overrides."""
    if NUM_STAGES is not None:
        return NUM_STAGES
    return 3 if blocks_per_split >= DEEP_PIPELINE_BLOCKS else 2


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda" or interpreting():
        return 2
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def beam_context_attention_triton(q, k, v, lengths, *, context_len: int, lineage_len: int, step: int,
                                  scale: float | None = None, lineage: torch.Tensor | None = None,
                                  splits: int | None = None, block_m: int | None = None, block_n: int | None = None):
    """Triton launcher of :func:`beam_context_attention` (same arguments and output).

    ``splits`` (context splits), ``block_m`` (query rows per program) and ``block_n``
    (keys per iteration) override the launcher's choices, for tests and tuning.
    """
    g = _check(q, k, v, lengths, context_len, lineage_len, step, lineage)
    for name, x in (("block_m", block_m), ("block_n", block_n)):
        if x is not None and (x < 16 or x != next_pow2(x)):
            raise ValueError(f"{name} must be a power of two ≥ 16, got {x!r}")
    if splits is not None and not (isinstance(splits, int) and splits >= 1):
        raise ValueError(f"splits must be a positive integer, got {splits!r}")
    b, m, h, d = q.shape
    kvh = k.shape[2]
    rows = m * g
    out = torch.empty(b, m, h, d, dtype=q.dtype, device=q.device)
    if not (b and m):
        return out
    # the interpreter gets the smallest tiles (fast, and several key blocks per split in tests);
    # tl.dot needs every dimension ≥ 16; masked lanes load zeros
    small = interpreting()
    bm = block_m or (16 if small else min(BLOCK_M, max(16, next_pow2(rows))))
    bn = block_n or (16 if small else BLOCK_N)
    bd = max(16, next_pow2(d))
    row_blocks = cdiv(rows, bm)
    n_splits = splits or split_count(context_len, row_blocks * b * kvh, _sm_count(q.device))
    # each split a whole number of key blocks; trailing splits may be empty, or empty for a
    # request whose length ends before them (the loop then runs no iteration)
    chunk = cdiv(cdiv(context_len, n_splits), bn) * bn
    if n_splits > 1:
        ws_m = torch.empty(b * kvh * n_splits * rows, dtype=torch.float32, device=q.device)
        ws_l = torch.empty_like(ws_m)
        ws_acc = torch.empty(b * kvh * n_splits * rows * d, dtype=torch.float32, device=q.device)
    else:
        ws_m = ws_l = ws_acc = out
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    # float32 products stay IEEE unless PyTorch's own float32 matmuls may use TF32
    tf32 = q.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    _split_kernel[(row_blocks, b * kvh, n_splits)](
        q, k, v, lengths, lengths if lineage is None else lineage, out, ws_m, ws_l, ws_acc, rows, kvh, d,
        context_len, step, chunk, scale * LOG2E,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), G=g, P=lineage_len, SPLITS=n_splits, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_D=bd, CHUNK_BLOCKS=chunk // bn if small else 0, PRECISION="tf32" if tf32 else "ieee",
        # the interpreter's tl.dot garbles bfloat16 operands; their float32 copies give the same products
        UPCAST=small and q.dtype == torch.bfloat16, EVEN_D=bd == d, HAS_ANC=lineage is not None,
        num_warps=4 if small else NUM_WARPS,
        num_stages=1 if small else pipeline_stages(chunk // bn))
    if n_splits > 1:
        mb = 16 if small else min(MERGE_BLOCK_M, next_pow2(rows))
        _merge_kernel[(cdiv(rows, mb), b * kvh)](
            ws_m, ws_l, ws_acc, out, q, k, v, lengths if lineage is None else lineage, rows, kvh, d, context_len, step,
            scale * LOG2E, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), G=g, P=lineage_len, SPLITS=n_splits, BLOCK_M=mb, BLOCK_D=bd,
            HAS_ANC=lineage is not None, CHUNK_D=min(LINEAGE_CHUNK_D, bd), num_warps=4 if small else MERGE_NUM_WARPS)
    return out


def beam_context_bias(lengths, *, beams: int, group: int, slots: int, context_len: int, lineage_len: int,
                      step: int, dtype: torch.dtype, lineage: torch.Tensor | None = None) -> torch.Tensor:
    """The additive mask of :func:`beam_context_attention` as one SDPA bias.

    Returns
    -------
    torch.Tensor, shape (B, 1, beams · group, slots), ``dtype``
        0 where query row ``r`` (beam ``m = r // group``) may look, -inf elsewhere: context
        slots below ``min(lengths[b], context_len)``, and for each SID position ``t < step``
        the lineage slot ``context_len + a · P + t`` with ``a = lineage[b, m, t]`` (``m``
        itself without ``lineage``), any beam whose slots lie below ``slots``.
    """
    dev = lengths.device
    pos = torch.arange(slots, device=dev)
    context = (pos[None, :] < lengths[:, None].clamp(max=context_len))[:, None, :]               # (B, 1, S)
    p = lineage_len
    rel = pos - context_len
    held = max(slots - context_len, p) // p * p        # the lineage slots of every beam k holds, ancestors' included
    inside = (rel >= 0) & (rel < held)
    rel = rel.clamp(0, held - 1)
    t, owner = rel % p, rel // p                                                                 # (S,)
    beam = torch.arange(beams * group, device=dev) // group                                     # (R,)
    if lineage is None:
        want = beam[None, :, None]                                                               # (1, R, 1)
    else:
        anc = lineage.to(device=dev, dtype=torch.int64)[:, beam]                                 # (B, R, P)
        want = anc.gather(2, t[None, None, :].expand(anc.shape[0], anc.shape[1], -1))           # (B, R, S)
    own = (inside & (t < step))[None, None, :] & (owner[None, None, :] == want)                 # (B', R, S)
    allowed = context | own
    zero = torch.zeros((), dtype=dtype, device=dev)
    return torch.where(allowed, zero, float("-inf")).to(dtype)[:, None].contiguous()


def beam_context_attention_reference(q, k, v, lengths, *, context_len: int, lineage_len: int, step: int,
                                     scale: float | None = None, lineage: torch.Tensor | None = None):
    """Pure-PyTorch reference of :func:`beam_context_attention` (same arguments and output):
    the (M · g, D) query matrix per (request, KV head) through SDPA with
    :func:`beam_context_bias`."""
    g = _check(q, k, v, lengths, context_len, lineage_len, step, lineage)
    b, m, h, d = q.shape
    kvh = k.shape[2]
    qg = q.reshape(b, m, kvh, g, d).permute(0, 2, 1, 3, 4).reshape(b, kvh, m * g, d)
    bias = beam_context_bias(lengths, beams=m, group=g, slots=k.shape[1], context_len=context_len,
                             lineage_len=lineage_len, step=step, dtype=q.dtype, lineage=lineage)
    o = torch.nn.functional.scaled_dot_product_attention(qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias,
                                                         scale=scale)
    return o.view(b, kvh, m, g, d).permute(0, 2, 1, 3, 4).reshape(b, m, h, d)


def beam_context_attention(q, k, v, lengths, *, context_len: int, lineage_len: int, step: int,
                           scale: float | None = None, lineage: torch.Tensor | None = None):
    """Attention of every beam of a request over the request's context and the beam's own lineage.

    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation (``lengths`` is read on the device only),
    static shapes: a CUDA graph can hold it.

    Parameters
    ----------
    q : torch.Tensor, shape (B, M, heads, D), float16, bfloat16 or float32
        The queries of each request's ``M`` beams; unit last stride. Query head ``h`` reads
        KV head ``h // g``, ``g = heads / kv_heads``.
    k, v : torch.Tensor, shape (B, S, kv_heads, D), q's dtype, unit last stride
        Per request, its ``S`` key/value slots (e.g. views of one layer of a larger cache):
        the context at slots ``< context_len``, then beam ``m``'s lineage key of SID position
        ``t`` at slot ``context_len + m · lineage_len + t``; ``S ≥ context_len + M ·
        lineage_len`` (slots past them are never read).
    lengths : torch.Tensor, shape (B,), int64 or int32
        Context tokens of each request (1 … context_len); slots past them are padding.
    context_len : int
        Context slots per request (the padded bucket).
    lineage_len : int
        ``P``, lineage slots per beam.
    step : int
        Lineage positions ``t < step`` are visible (``0 ≤ step ≤ lineage_len``).
    scale : float, optional
        Score multiplier; ``1 / sqrt(D)`` by default.
    lineage : torch.Tensor, shape (B, M, lineage_len), int32 or int64, contiguous, optional
        ``lineage[b, m, t]``: the beam whose lineage slot of position ``t`` holds beam ``m``'s
        SID token ``t`` (its ancestor at that position), so that beams reordered at each step
        need no copy of the keys and values. Without it, each beam's own slots. An ancestor may
        be any beam whose slots ``k`` holds (below ``(S - context_len) / lineage_len``), not only
        the first ``M``: a call over some of a request's beams reads the lineage of all of them.

    Returns
    -------
    torch.Tensor, shape (B, M, heads, D), q's dtype, contiguous
        ``softmax(scale · q · k + mask) · v`` per request, beam and head, the context and the
        beam's lineage in one float32 softmax.
    """
    fn = beam_context_attention_triton if use_triton(q) else beam_context_attention_reference
    return fn(q, k, v, lengths, context_len=context_len, lineage_len=lineage_len, step=step, scale=scale,
              lineage=lineage)
