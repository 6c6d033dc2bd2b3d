"""GPU readings for the app: NVML (memory, utilisation) and torch's allocator.

Everything degrades to ``None`` without a GPU or without NVML, never raises.
"""
from __future__ import annotations

import logging
import threading

import torch

log = logging.getLogger("zerogr.app")
_lock = threading.Lock()
_nvml_ready: bool | None = None


def has_gpu() -> bool:
    return bool(torch.cuda.is_available())


def device_label() -> str:
    """One line: the GPU's name, or that there is none."""
    if has_gpu():
        return f"GPU: {torch.cuda.get_device_name(0)}"
    return "CPU only: no GPU on this machine"


def _nvml():
    global _nvml_ready
    with _lock:
        if _nvml_ready is None:
            try:
                import pynvml
            except ImportError:  # nvidia-ml-py not installed: the GPU page shows torch's figures only
                _nvml_ready = False
            else:
                try:
                    pynvml.nvmlInit()
                    _nvml_ready = True
                except pynvml.NVMLError as exc:  # no driver / no GPU
                    log.info("NVML is not available: %s", exc)
                    _nvml_ready = False
        if not _nvml_ready:
            return None
        import pynvml

        return pynvml


def nvml_snapshot(index: int = 0) -> dict | None:
    """NVML readings of GPU ``index``: name, memory used/total (bytes), utilisation (%).

    Returns ``None`` when NVML or the GPU is not there.
    """
    nv = _nvml()
    if nv is None:
        return None
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
        util = nv.nvmlDeviceGetUtilizationRates(handle)
        name = nv.nvmlDeviceGetName(handle)
        out = dict(name=name.decode() if isinstance(name, bytes) else str(name), used=int(mem.used),
                   total=int(mem.total), gpu_util=int(util.gpu), mem_util=int(util.memory))
        try:
            out["temperature_c"] = int(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))
            out["power_w"] = nv.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except nv.NVMLError:  # sensors some GPUs (and MIG slices) do not expose: left out
            pass
        return out
    except nv.NVMLError as exc:  # e.g. an index past the last GPU
        log.info("NVML reading of GPU %d failed: %s", index, exc)
        return None


def torch_memory(index: int = 0) -> dict | None:
    """torch's allocated / reserved / peak bytes on GPU ``index`` (``None`` without CUDA)."""
    if not has_gpu():
        return None
    try:
        return dict(allocated=int(torch.cuda.memory_allocated(index)),
                    reserved=int(torch.cuda.memory_reserved(index)),
                    peak=int(torch.cuda.max_memory_allocated(index)))
    except (RuntimeError, AssertionError) as exc:  # a bad index or a CUDA context that failed to start
        log.info("torch memory reading of GPU %d failed: %s", index, exc)
        return None


def reset_peak(index: int = 0) -> None:
    """Start a new peak of torch's allocated bytes on GPU ``index`` (no-op without CUDA)."""
    if has_gpu():
        try:
            torch.cuda.reset_peak_memory_stats(index)
        except (RuntimeError, AssertionError) as exc:
            log.info("resetting the memory peak of GPU %d failed: %s", index, exc)


def human_bytes(n: float | None) -> str:
    """1234567 → '1.2 MB' (decimal units); ``None`` → 'n/a'."""
    if n is None:
        return "n/a"
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
