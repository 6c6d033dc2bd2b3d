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


class Batcher:
    """Gathers concurrent requests into batches, in one asyncio event loop (what Ray
    Serve's ``@serve.batch`` does for the deployment of :mod:`.app`, without Ray).

    :meth:`submit` queues one item and waits for its result. While no batch is running, a
    batch waits up to ``wait_s`` to fill to ``max_batch``, then ``run(items)`` (a blocking
    function returning one result per item) runs in a single worker thread; requests that
    arrive meanwhile form the next batch.

    Parameters
    ----------
    run : callable(list) -> list
    max_batch : int
    wait_s : float
    on_batch : callable(int), optional
        Told the size of each batch as it starts.
    """

    def __init__(self, run, max_batch: int, wait_s: float, on_batch=None):
        from concurrent.futures import ThreadPoolExecutor

        self._run, self.max_batch, self.wait_s, self._on_batch = run, int(max_batch), float(wait_s), on_batch
        self._pending: list = []
        self._task = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="zerogr-batch")

    async def submit(self, item):
        """The result of ``item`` (an exception of the batch's ``run`` is raised here)."""
        import asyncio

        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((item, future))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        while self._pending:
            if len(self._pending) < self.max_batch and self.wait_s > 0:
                await asyncio.sleep(self.wait_s)
            batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            if self._on_batch is not None:
                self._on_batch(len(batch))
            try:
                results = await loop.run_in_executor(self._pool, self._run, [item for item, _ in batch])
            except Exception as err:  # noqa: BLE001 - every request of the batch gets the error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(err)
                continue
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)
