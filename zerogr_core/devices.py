"""The ``--device`` argument every command takes, checked when the command line is parsed."""
from __future__ import annotations

import argparse


def device_arg(value: str) -> str:
    """The argparse ``type`` of every ``--device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (CUDA
    only where it is available), returned unchanged (commands resolve ``auto`` with
    :func:`resolved`, and echo it as given in the commands they print); anything else is a one-line
    usage error. torch is imported when a value is checked, not when the parser is built."""
    if value == "auto":
        return value
    import torch

    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{value!r} is not a device (cpu, cuda, cuda:N or auto)") from None
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{value!r}: choose cpu, cuda, cuda:N or auto")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{value}: no CUDA device here")
    return value


def resolved(value: str | None) -> str | None:
    """A ``--device`` value with ``auto`` resolved: ``cuda`` where CUDA is available, else ``cpu``
    (``None``, a command's own default, stays ``None``)."""
    if value != "auto":
        return value
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
