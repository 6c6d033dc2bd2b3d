"""One live heavy object per slot (index, decoder, model), released when replaced.

The app keeps a single :class:`ResourceSlots` per server process (through
``st.cache_resource``). Asking a slot for a different key releases the object it held —
``release()`` on engines and decoders, then garbage collection and
``torch.cuda.empty_cache()`` — before the new one is built, so switching catalogs or
shapes never keeps two generations of GPU buffers alive.
"""
from __future__ import annotations

import gc
import threading
from typing import Any, Callable, Hashable

import torch


def free_gpu_memory() -> None:
    """Collect garbage and return cached CUDA blocks to the driver (no-op without CUDA)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_object(obj: Any) -> None:
    """Release what ``obj`` holds on the GPU: engines, plans, captured graphs.

    Handles :class:`zerogr_core.decode.engine.GpuEngine` (``release()``), decoders (their
    ``engine``), and containers (dict, list, tuple) of those.
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
    engine = getattr(obj, "engine", None)
    if engine is not None and hasattr(engine, "release"):
        engine.release()
    if hasattr(obj, "release") and callable(obj.release):
        obj.release()


class ResourceSlots:
    """Named slots, each holding the object built for one key.

    Thread-safe: Streamlit runs each session's script in its own thread.
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
            self._items[slot] = (key, obj, release)
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
            _, obj, release = current
            if release is not None:
                try:
                    release(obj)
                except Exception:  # releasing must never take the app down
                    pass
            del obj, current
            self.releases += 1
            free_gpu_memory()
            return True

    def drop_all(self) -> int:
        """Release every slot (after a CUDA out-of-memory error, say); returns how many."""
        with self._lock:
            return sum(self.drop(slot) for slot in list(self._items))

    def slots(self) -> list[str]:
        with self._lock:
            return list(self._items)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA (or host allocator) out-of-memory error."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    text = str(exc)
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "out of memory" in text.lower() or isinstance(exc, MemoryError))
