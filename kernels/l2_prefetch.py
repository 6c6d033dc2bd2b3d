"""Bring a span of a tensor's bytes into the GPU's L2 cache ahead of the kernel that reads it.

A decode step of a Qwen3 recommender runs its weight GEMMs at 256 rows a request: each reads a
weight of 8–48 MiB from HBM once, too little work to hide the loads' latency, so cuBLAS runs them
near 45 % of both the memory and the compute roof. Between the GEMMs come kernels that barely use
HBM (the attention over a short context, the norms, the rotary embedding). :func:`prefetch_l2`
issues Hopper's bulk L2 prefetch (``cp.async.bulk.prefetch.L2``, sm_90+) over the next GEMM's
weight while those kernels run, from a few threads on a side stream: the GEMM then finds its
weight in L2. A prefetch is a hint: it changes no value, only where the bytes wait.

The reference, and every device without the instruction (CPUs, the interpreter, GPUs before
Hopper), prefetches nothing, with the same checks.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, interpreting

CHUNK = 64 * 1024
"""Bytes per bulk prefetch (one per thread)."""
BLOCK = 128
"""Threads, and so chunks, per program."""


@triton.jit
def _prefetch_l2_kernel(ptr, nbytes, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    start = i.to(tl.int64) * CHUNK
    # the last chunk is cut to the span (in 16-byte units, the instruction's granule); threads past it
    # prefetch the span's first 16 bytes again rather than touch memory outside it
    size = tl.minimum(nbytes - start, CHUNK).to(tl.int32) // 16 * 16
    inside = size > 0
    addr = tl.where(inside, (ptr + start).to(tl.int64, bitcast=True), ptr.to(tl.int64, bitcast=True))
    size = tl.where(inside, size, 16)
    tl.inline_asm_elementwise(asm="cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
                              constraints="=r,l,r", args=[addr, size], dtype=tl.int32, is_pure=False, pack=1)


def _span(t: torch.Tensor, start: int, nbytes: int | None) -> tuple[int, int]:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"t: expected a tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"t: expected a contiguous tensor, got strides {tuple(t.stride())}")
    total = t.numel() * t.element_size()
    if nbytes is None:
        nbytes = total - start
    if not (0 <= start <= total) or start % 16:
        raise ValueError(f"start: expected a multiple of 16 in [0, {total}], got {start}")
    if not (0 <= nbytes <= total - start):
        raise ValueError(f"nbytes: expected at most the {total - start} bytes after start, got {nbytes}")
    return start, nbytes


def prefetch_l2_triton(t: torch.Tensor, start: int = 0, nbytes: int | None = None) -> None:
    """Triton launcher of :func:`prefetch_l2` (same signature); Hopper or later only (the interpreter
    has no inline assembly)."""
    start, nbytes = _span(t, start, nbytes)
    # the instruction wants 16-byte aligned addresses: a span that starts off one begins at the next
    skip = -(t.data_ptr() + start) % 16
    start, nbytes = start + skip, nbytes - skip
    if nbytes < 16:
        return
    flat = t.view(-1).view(torch.int8)[start:start + nbytes]
    _prefetch_l2_kernel[(cdiv(cdiv(nbytes, CHUNK), BLOCK),)](flat, nbytes, CHUNK=CHUNK, BLOCK=BLOCK, num_warps=4)


def prefetch_l2_reference(t: torch.Tensor, start: int = 0, nbytes: int | None = None) -> None:
    """Reference of :func:`prefetch_l2`: the same checks, and no prefetch (a cache hint has no value)."""
    _span(t, start, nbytes)


def prefetch_l2(t: torch.Tensor, start: int = 0, nbytes: int | None = None) -> None:
    """Prefetch bytes ``[start, start + nbytes)`` of a contiguous tensor into L2, asynchronously.

    Launched on the current stream; the prefetch itself runs on past the kernel's end, so a side
    stream's launch overlaps the main stream's kernels. Nothing is returned and nothing waits.

    Parameters
    ----------
    t : torch.Tensor, contiguous, any dtype
    start : int
        First byte, a multiple of 16 (bytes before the tensor's next 16-byte aligned address are skipped).
    nbytes : int, optional
        Bytes to prefetch (default: the rest of ``t``).
    """
    fast = isinstance(t, torch.Tensor) and t.is_cuda and not interpreting() \
        and torch.cuda.get_device_capability(t.device)[0] >= 9
    (prefetch_l2_triton if fast else prefetch_l2_reference)(t, start, nbytes)
