"""The ``--device`` argument every command takes, checked when the command line is parsed."""
from __future__ import annotations

import argparse


def device_arg(value: str) -> str:
    """The argparse ``type`` of every ``--device``: ``cpu``, ``cuda`` or ``cuda:N`` (CUDA only where
    it is available), returned unchanged, or ``auto``, returned as ``cuda`` where CUDA is available
    and ``cpu`` elsewhere; anything else is a one-line usage error. torch is imported when a value
    is checked, not when the command line's parser is built."""
    import torch

    if value == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{value!r} is not a device (cpu, cuda, cuda:N or auto)") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{value!r}: choose cpu, cuda, cuda:N or auto")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{value}: no CUDA device here")
    return value
