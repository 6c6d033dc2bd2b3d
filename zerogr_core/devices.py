"""Where a call runs: the ``--device`` argument every command takes, checked when the command line
is parsed, and the library's own reading of a ``device=`` argument, one line when it is wrong."""
from __future__ import annotations

import argparse

from .errors import ZeroGRError


def as_device(value, what: str | None = "device", default: str = "auto"):
    """``value`` as the ``torch.device`` a call runs on.

    Parameters
    ----------
    value : str, torch.device or None
        ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (CUDA where it is available, else the CPU);
        ``None`` means ``default``.
    what : str or None
        The argument, as messages name it (``None``: no name, for argparse, which adds its own).
    default : str
        What ``None`` stands for.

    Returns
    -------
    torch.device
        The CPU or a CUDA device of this machine.

    Raises
    ------
    ZeroGRError
        ``device: 'gpu0' is not a device (cpu, cuda, cuda:N or auto)``, ``device: 'meta': choose
        cpu, cuda, cuda:N or auto``, ``device: cuda: no CUDA device here``.
    """
    import torch

    prefix = f"{what}: " if what else ""
    value = default if value is None else value
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = value if isinstance(value, torch.device) else torch.device(value)
    except (RuntimeError, ValueError, TypeError):
        raise ZeroGRError(f"{prefix}{value!r} is not a device (cpu, cuda, cuda:N or auto)") from None
    if device.type not in ("cpu", "cuda"):
        raise ZeroGRError(f"{prefix}{str(value)!r}: choose cpu, cuda, cuda:N or auto")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ZeroGRError(f"{prefix}{value}: no CUDA device here")
    return device


def device_arg(value: str) -> str:
    """The argparse ``type`` of every ``--device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (CUDA
    only where it is available, :func:`as_device`), returned unchanged (commands resolve ``auto``
    with :func:`resolved`, and echo it as given in the commands they print); anything else is a
    one-line usage error. torch is imported to check a value other than ``auto`` and ``cpu``, not when the
    parser is built."""
    # the CPU is always there; asking torch would load it on every parse of quality and
    # compare-orders, whose default "cpu" argparse checks as it checks a value given
    if value in ("auto", "cpu"):
        return value
    try:
        as_device(value, what=None)
    except ZeroGRError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def resolved(value: str | None) -> str | None:
    """A ``--device`` value with ``auto`` resolved: ``cuda`` where CUDA is available, else ``cpu``
    (``None``, a command's own default, stays ``None``)."""
    if value != "auto":
        return value
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
