"""One-line, user-facing errors.

Every error the CLI or the app shows to a user is a :class:`ZeroGRError`. Its message is a
single line that names the file, row, column or argument at fault, so the CLI can print it
without a traceback and the app can put it in an error box.
"""
from __future__ import annotations

import argparse
import contextvars
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

#: While set, messages built with :func:`shown` withhold the file's values (see :func:`redacted_values`).
_REDACT = contextvars.ContextVar("zerogr_redact_values", default=False)
#: What a withheld value reads as.
WITHHELD = "(value withheld)"


@contextmanager
def redacted_values(active: bool = True) -> Iterator[None]:
    """Within this block, error messages name row and column but not the file's values.

    For files read on behalf of someone who may not read them directly (the app's server
    files): otherwise a validation error would echo one cell of any readable file.
    """
    token = _REDACT.set(bool(active) or _REDACT.get())
    try:
        yield
    finally:
        _REDACT.reset(token)


def values_redacted() -> bool:
    """Whether messages must withhold file content now."""
    return _REDACT.get()


#: Characters of a quoted value beyond which a message cuts it (with "…"): a 5,000-character
#: cell would bury the file, row and column the message is for.
SHOWN_MAX = 100


def shown(value, quote: bool = True) -> str:
    """A value from a file, as an error message quotes it: ``repr`` (or ``str`` with
    ``quote=False``, its line breaks escaped), cut at :data:`SHOWN_MAX` characters, or
    :data:`WITHHELD` inside :func:`redacted_values`."""
    if _REDACT.get():
        return WITHHELD
    if getattr(value, "shape", None) == () and hasattr(value, "item"):  # a numpy scalar quotes as its value
        value = value.item()
    text = repr(value) if quote else str(value).replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= SHOWN_MAX else text[:SHOWN_MAX - 1] + "…"


class ZeroGRError(ValueError):
    """Base class of all user-facing errors (a ``ValueError``)."""


class UsageError(ZeroGRError):
    """Bad command-line usage (the CLI exits with status 2)."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are raised as :class:`UsageError`, so the caller prints
    them on one line (argparse itself prints the usage text too)."""

    def error(self, message: str):
        raise UsageError(message)


class CatalogError(ZeroGRError):
    """A catalog is malformed.

    Parameters
    ----------
    message : str
        What is wrong, in one line.
    row : int, optional
        0-based row of the offending record in the input order (data rows, header excluded).
    column : str, optional
        Name of the offending column or level (``"s3"``, ``"sid"``, ``"item_id"``).
    source : str, optional
        File the catalog came from.
    """

    def __init__(self, message: str, *, row: int | None = None, column: str | None = None,
                 source: str | None = None):
        self.reason = message
        self.row = row
        self.column = column
        self.source = source
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.source:
            where.append(str(self.source))
        if self.row is not None:
            where.append(f"row {self.row + 1}")
        if self.column is not None:
            where.append(f"column '{self.column}'")
        return (", ".join(where) + ": " if where else "") + self.reason

    def with_source(self, source: str) -> "CatalogError":
        """Return the same error, attributed to ``source`` (a file name)."""
        return CatalogError(self.reason, row=self.row, column=self.column, source=source)


def first_line(err: BaseException, default: str = "", limit: int | None = None) -> str:
    """The first line of an exception's message (``default`` when it has none), cut to
    ``limit`` characters: third-party errors often span many lines, a user-facing one
    may not."""
    line = (str(err).strip().splitlines() or [default])[0]
    return line if limit is None else line[:limit]


#: How torch's host allocator words a failed allocation ("DefaultCPUAllocator: can't allocate memory: you
#: tried to allocate 34359738368 bytes"): a RuntimeError that never says "out of memory".
HOST_ALLOCATOR_FAILURE = "can't allocate memory"


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says memory ran out: a ``MemoryError``, or a ``RuntimeError`` of torch's CUDA or
    host allocator (``torch.OutOfMemoryError`` is one), told by its message so torch need not be imported."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or HOST_ALLOCATOR_FAILURE in text)


def check_output_file(path, what: str, *, folder_must_exist: bool = False) -> None:
    """Refuse, before any work, an output ``path`` that cannot be written as a file.

    A directory, a path under an existing file or in a folder this process cannot write, otherwise
    failed only when the result was written: after the training, study or generation it was meant
    to keep (a ``torch.save`` traceback, or ``[Errno 17] File exists`` naming no argument).

    Parameters
    ----------
    path : str or Path
    what : str
        The argument that named it (e.g. ``"--out"``), shown in the error.
    folder_must_exist : bool
        Refuse a path whose folder does not exist (for a writer that does not create it).

    Raises
    ------
    ZeroGRError
        One line naming ``what`` and the path.
    """
    path = Path(path)
    if path.is_dir():
        raise ZeroGRError(f"{what} {path}: is a directory; give a file name")
    if folder_must_exist and not path.absolute().parent.is_dir():
        raise ZeroGRError(f"{what} {path}: the folder {path.absolute().parent} does not exist")
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ZeroGRError(f"{what} {path}: {parent} is a file, not a directory")
            if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
                raise ZeroGRError(f"{what} {path}: cannot be written")
            break
