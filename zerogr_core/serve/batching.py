"""Gathering concurrent requests into batches, and padding a batch to a planned batch size.

The engine plans (and on a GPU captures a CUDA graph for) each batch size once. A server
that decoded every gathered batch at its own size would plan a new shape whenever traffic
produced a new count; padding to the nearest planned size keeps the set of shapes fixed. :class:`Batcher` gathers
the requests of the Qwen3 recommender's replica, in the Ray deployment and in the
in-process load test alike.
"""
from __future__ import annotations

import numbers
import threading
import time
from concurrent.futures import Future
from typing import Sequence

from ..arg_types import whole_value, whole_values
from ..errors import ZeroGRError

MAX_BATCH_WAIT_S = 10.0
"""Longest a batch may wait to fill (every server's ``batch_wait_s``, and ``serve --batch-wait-ms``)."""


def batching_fields(beam, batch_sizes, batch_wait_s) -> tuple[int, tuple[int, ...], float]:
    """A serving configuration's beam width, planned batch sizes and batch wait, checked.

    Whole numbers are taken as given (a JSON ``8.0``, a numpy integer); bools, fractions and text
    are refused, as is a wait outside ``0 … MAX_BATCH_WAIT_S``.

    Returns
    -------
    (beam, batch_sizes, batch_wait_s) : tuple
        ``int``, the sizes as sorted distinct ``int``s, ``float``.

    Raises
    ------
    ZeroGRError
        One line naming the field.
    """
    width = whole_value(beam)
    if width is None or width < 1:
        raise ZeroGRError(f"beam: expected a positive integer, got {beam!r}")
    sizes = whole_values(batch_sizes)
    if not sizes or min(sizes) < 1:
        raise ZeroGRError(f"batch_sizes: expected positive integers, got {batch_sizes!r}")
    if isinstance(batch_wait_s, bool) or not isinstance(batch_wait_s, numbers.Real) \
            or not 0 <= batch_wait_s <= MAX_BATCH_WAIT_S:
        raise ZeroGRError(f"batch_wait_s: must be within 0…{MAX_BATCH_WAIT_S:g} s, got {batch_wait_s!r}")
    return width, tuple(sorted(set(sizes))), float(batch_wait_s)


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


class Batcher:
    """Gathers concurrent requests into batches (what Ray Serve's ``@serve.batch`` does for
    the deployment of :mod:`.app`, without Ray).

    :meth:`submit` (asyncio) or :meth:`submit_future` (any thread) queues one item. One
    worker thread takes the queued items: when fewer than ``max_batch`` wait, it waits up
    to ``wait_s`` for more, then runs ``run(items)`` (blocking, one result per item) on at
    most ``max_batch`` of them; requests that arrive meanwhile form the next batch. Callers
    from any thread or event loop may share one batcher. A request cancelled while it waits
    (its client went away) is dropped from its batch and never decoded.

    Parameters
    ----------
    run : callable(list) -> list
    max_batch : int
    wait_s : float
    on_batch : callable(int), optional
        Told the size of each batch as it starts.
    on_cancel : callable(int), optional
        Told how many cancelled requests were taken off the queue without being decoded.
    """

    def __init__(self, run, max_batch: int, wait_s: float, on_batch=None, on_cancel=None):
        self._run, self.max_batch, self.wait_s = run, int(max_batch), float(wait_s)
        self._on_batch, self._on_cancel = on_batch, on_cancel
        self._pending: list = []
        self._cv = threading.Condition()
        self._worker = None

    def submit_future(self, item) -> Future:
        """A future of ``item``'s result (an exception of the batch's ``run`` is set on it)."""
        future: Future = Future()
        with self._cv:
            self._pending.append((item, future))
            if self._worker is None:
                self._worker = threading.Thread(target=self._loop, name="zerogr-batch", daemon=True)
                self._worker.start()
            self._cv.notify()
        return future

    async def submit(self, item):
        """The result of ``item``, awaited in the caller's event loop."""
        import asyncio

        return await asyncio.wrap_future(self.submit_future(item))

    def _take(self) -> list:
        with self._cv:
            while not self._pending:
                self._cv.wait()
            deadline = time.monotonic() + self.wait_s
            while len(self._pending) < self.max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            return batch

    def _loop(self) -> None:
        while True:
            taken = self._take()
            # a running future can no longer be cancelled, so setting its result cannot raise (a
            # cancelled one would raise InvalidStateError and end this thread: every later request would hang)
            batch = [(item, future) for item, future in taken if future.set_running_or_notify_cancel()]
            if len(batch) < len(taken) and self._on_cancel is not None:
                self._on_cancel(len(taken) - len(batch))
            if not batch:
                continue
            try:
                if self._on_batch is not None:
                    self._on_batch(len(batch))
                results = self._run([item for item, _ in batch])
                if len(results) != len(batch):
                    raise ZeroGRError(f"a batch of {len(batch)} requests got {len(results)} results")
            except Exception as err:  # noqa: BLE001 - every request of the batch gets the error
                for _, future in batch:
                    future.set_exception(err)
                continue
            for (_, future), result in zip(batch, results):
                future.set_result(result)
