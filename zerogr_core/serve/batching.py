"""Padding a gathered batch to a planned batch size.

The engine plans (and on a GPU captures a CUDA graph for) each batch size once. A server
that decoded every gathered batch at its own size would plan a new shape whenever traffic
produced a new count; padding to the nearest planned size keeps the set of shapes fixed.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import ZeroGRError


def padded_size(n: int, sizes: Sequence[int]) -> int:
    """The smallest of the ascending ``sizes`` that holds ``n`` requests.

    Raises
    ------
    ZeroGRError
        ``n`` < 1 or more than the largest planned size.
    """
    if n < 1:
        raise ZeroGRError(f"a batch needs at least one request, got {n}")
    for size in sizes:
        if size >= n:
            return int(size)
    raise ZeroGRError(f"{n} requests exceed the largest planned batch size {sizes[-1]}")


def pad(items: list, size: int) -> list:
    """``items`` followed by copies of its first entry up to ``size`` (padding rows are decoded
    and dropped: a real request keeps the padded rows' work well-formed)."""
    return list(items) + [items[0]] * (size - len(items))


def chunks(n: int, largest: int) -> list[range]:
    """Split ``n`` requests into consecutive runs of at most ``largest``."""
    return [range(start, min(start + largest, n)) for start in range(0, n, largest)]
