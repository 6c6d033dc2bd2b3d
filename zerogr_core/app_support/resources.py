"""One live heavy object per slot (index, decoder, model), released when replaced.

The app keeps one :class:`ResourceSlots` per browser session (in its session state), so
two sessions on different catalogs never evict or release each other's index and engines.
Asking a slot for a different key releases the object it held — ``release()`` on engines
and decoders, then garbage collection and ``torch.cuda.empty_cache()`` — before the new
one is built, so switching catalogs or shapes never keeps two generations of GPU buffers
alive within a session.
"""
from __future__ import annotations

import gc
import logging
import threading
from typing import Any, Callable, Hashable

import torch

from ..errors import is_out_of_memory

log = logging.getLogger("zerogr.app")

def free_gpu_memory() -> None:
    """Collect garbage and return cached CUDA blocks to the driver (no-op without CUDA)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_object(obj: Any) -> None:
    """Release what ``obj`` holds on the GPU: engines, plans, captured graphs.

    Handles :class:`zerogr_core.decode.engine.GpuEngine` (``release()``), decoders (their
    ``gpu_engine``), and containers (dict, list, tuple) of those.
    """
    if obj is None:
        return
    if isinstance(obj, dict):
        for value in obj.values():
            release_object(value)
        return
    if isinstance(obj, (list, tuple)):
        for value in obj:
            release_object(value)
        return
    engine = getattr(obj, "gpu_engine", None)
    if engine is not None and hasattr(engine, "release"):
        engine.release()
    if hasattr(obj, "release") and callable(obj.release):
        obj.release()


class ResourceSlots:
    """Named slots, each holding the object built for one key.

    Thread-safe: a session's script reruns in a new thread, which may overlap the end of
    the previous run. The lock guards the bookkeeping only: the factory runs outside it,
    so a slow build (with its progress widgets) blocks nobody else.
    """

    def __init__(self):
        self._lock = threading.RLock()
        self._items: dict[str, tuple[Hashable, Any, Callable[[Any], None] | None]] = {}
        self.releases = 0

    def get(self, slot: str, key: Hashable, factory: Callable[[], Any],
            release: Callable[[Any], None] | None = release_object) -> Any:
        """The object of ``slot`` built for ``key``; built by ``factory()`` on a miss.

        On a miss the slot's previous object is released first (``release(old)``, then
        :func:`free_gpu_memory`), so peak memory holds one generation only.
        """
        with self._lock:
            current = self._items.get(slot)
            if current is not None and current[0] == key:
                return current[1]
            if current is not None:
                self.drop(slot)
        obj = factory()
        with self._lock:
            stale = self._items.get(slot)
            self._items[slot] = (key, obj, release)
        if stale is not None and stale[1] is not obj:  # an overlapping run filled the slot meanwhile
            self._release(stale)
        return obj

    def peek(self, slot: str) -> Any:
        """The object held in ``slot`` or ``None`` (builds nothing)."""
        with self._lock:
            current = self._items.get(slot)
            return None if current is None else current[1]

    def key(self, slot: str) -> Hashable | None:
        with self._lock:
            current = self._items.get(slot)
            return None if current is None else current[0]

    def drop(self, slot: str) -> bool:
        """Release and forget ``slot``'s object; returns whether there was one."""
        with self._lock:
            current = self._items.pop(slot, None)
            if current is None:
                return False
        self._release(current)
        return True

    def _release(self, item: tuple) -> None:
        _, obj, release = item
        if release is not None:
            try:
                release(obj)
            except Exception as exc:  # noqa: BLE001 - releasing must never take the app down
                log.warning("releasing %s failed: %s: %s", type(obj).__name__, type(exc).__name__, exc)
        del obj, item
        with self._lock:
            self.releases += 1
        free_gpu_memory()

    def drop_all(self) -> int:
        """Release every slot (after a CUDA out-of-memory error, say); returns how many."""
        with self._lock:
            return sum(self.drop(slot) for slot in list(self._items))

    def slots(self) -> list[str]:
        with self._lock:
            return list(self._items)


def is_host_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error of the host's memory rather than a GPU's."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if (oom is not None and isinstance(exc, oom)) or "cuda" in str(exc).lower():
        return False
    return is_out_of_memory(exc)
