"""Compile the Triton kernels of many calls at once, before any of them runs for real.

A step runner's first call compiles each kernel specialisation it launches, one after the
other, and the planner calls dozens of runners. :func:`precompile` instead makes every
call once in *compile-only* mode: a Triton launch then compiles and returns without
running (Triton's ``warmup``), and under Triton's ``AsyncCompileMode`` each compilation
goes to a thread pool. Leaving the mode waits for all of them; the real calls that follow
find every kernel compiled (in memory, and in Triton's on-disk cache for the next process).
Compilation overlaps in threads because most of it runs outside the GIL (the MLIR passes
and ptxas, a subprocess).

Compile-only mode changes nothing else: the launchers' PyTorch work (allocations, the
cuBLAS GEMM, ``torch.topk``) still runs, on inputs of the right shapes whose values do not
matter, because no launcher reads device values on the host. A compilation that fails is
left for the real call to raise, where the planner reports it per option.

Under the Triton interpreter (``TRITON_INTERPRET=1``, the CPU tests) a compile-only launch
is a no-op, so the same path runs without compiling anything; on CPU tensors without the
interpreter (the PyTorch references) :func:`precompile` does nothing.
"""
from __future__ import annotations

import contextvars
import os
import threading
from typing import Callable, Iterable

import torch

_COMPILE_ONLY = contextvars.ContextVar("zerogr_compile_only", default=False)
_install_lock = threading.Lock()
_installed = False


def default_workers() -> int:
    """Compile threads: ``ZEROGR_COMPILE_WORKERS`` if set (0 turns precompiling off), else up
    to 8, one per CPU core."""
    env = os.environ.get("ZEROGR_COMPILE_WORKERS")
    if env is not None and env.strip():
        try:
            return max(0, int(env))
        except ValueError:
            raise ValueError(f"ZEROGR_COMPILE_WORKERS must be an integer, got {env!r}") from None
    return max(1, min(8, os.cpu_count() or 1))


def active(device) -> bool:
    """Whether calls on ``device`` launch Triton kernels (CUDA, or the interpreter)."""
    return torch.device(device).type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _install() -> None:
    """Make Triton launches honour the compile-only flag (once per process; a no-op outside it)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        for cls in (JITFunction, InterpretedFunction):
            original = cls.run

            def run(self, *args, grid, warmup, _original=original, **kwargs):
                return _original(self, *args, grid=grid, warmup=warmup or _COMPILE_ONLY.get(), **kwargs)

            cls.run = run
        _installed = True


def compile_only() -> bool:
    """Whether the current context is inside :func:`precompile`'s compile-only pass."""
    return _COMPILE_ONLY.get()


def precompile(calls: Iterable[Callable[[], object]], device, workers: int | None = None) -> int:
    """Make each call in compile-only mode, compiling its kernels concurrently.

    Parameters
    ----------
    calls : iterable of callables
        Each launches kernels with the argument shapes, dtypes and constants of a later real
        call (e.g. a step runner on zero inputs).
    device : torch.device
    workers : int, optional
        Compile threads (default :func:`default_workers`; 0 does nothing).

    Returns
    -------
    int
        How many calls ran without raising (a call that raises is skipped: its real call
        raises again and is reported there).
    """
    calls = list(calls)
    workers = default_workers() if workers is None else workers
    if not calls or workers < 1 or not active(device):
        return 0
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:  # a Triton without asynchronous compilation: the real calls compile
        return 0
    from concurrent.futures import ThreadPoolExecutor

    _install()
    ran = 0
    token = _COMPILE_ONLY.set(True)
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zerogr-compile") as pool:
            with AsyncCompileMode(pool, ignore_errors=True):
                for call in calls:
                    try:
                        call()
                        ran += 1
                    except Exception:  # noqa: BLE001 - reported by the real call
                        pass
    finally:
        _COMPILE_ONLY.reset(token)
    return ran
