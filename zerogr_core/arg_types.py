"""Numeric command-line arguments, checked when the command line is parsed.

Every count a command takes (``--batch``, ``--beam``, ``--seed``, ``--port`` …) is an argparse
``type`` made here, so the same mistake reads the same in every command: argparse prefixes
the argument's name, the CLI prints one line and exits with status 2::

    error: argument --batch: must be ≥ 1, got 0
    error: argument --batch: 'x' is not a whole number
    error: argument --prefix: 'x' is not an integer

An integer is written plainly (``12``, ``-3``), with ``_`` separators (``1_000``) or in
exponent form when it is whole (``2e7``, ``4.0``); ``1.5`` is not one. Counts are whole
numbers (a lower bound of 0 or more); the word "integer" is kept for values that may be
negative.

Other numbers (a learning rate, a wait in milliseconds, a budget in seconds) are finite
floats checked the same way (:func:`number`, :func:`seconds`)::

    error: argument --lr: must be a positive number, got -1

It imports nothing of the project, so the library (``synth:`` catalog specs) uses it too; the
parser that turns these errors into a one-line usage error is :class:`zerogr_core.errors.Parser`.
"""
from __future__ import annotations

import argparse
import math
import numbers
import operator
from decimal import Decimal, InvalidOperation
from typing import Callable

#: Digits beyond which an integer is refused as too large: no count here comes near, and
#: ``int()`` of ``1e999999999`` would take minutes.
MAX_DIGITS = 30
#: Largest ``--seed`` of every command: numpy's legacy ``np.random.seed`` (the trainings seed it beside
#: torch) takes no more, and refused a larger one with a traceback; the benchmarks, which mix the seed
#: into torch generators' 64-bit seeds, overflowed from about 2**47.
SEED_MAX = 2**32 - 1



def whole_value(value) -> int | None:
    """``value`` as an int when it is a whole number given as a number (an int, a numpy or torch
    integer, or a finite float without a fraction), else ``None``: bools, text and fractions are
    not whole numbers here (``int()`` would truncate 2.5 to 2 and read True as 1).

    Parameters
    ----------
    value : object

    Returns
    -------
    int or None
    """
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        if isinstance(value, numbers.Real) and math.isfinite(float(value)) and float(value).is_integer():
            return int(value)
    return None


def whole_values(values) -> tuple[int, ...] | None:
    """``values`` as a tuple of ints when it is a sequence of whole numbers (:func:`whole_value`),
    else ``None`` (text, a bare number, or any entry that is not a whole number)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        return None
    out = tuple(whole_value(v) for v in values)
    return None if None in out else out


def to_int(text: str, least: int | None = None, most: int | None = None) -> int:
    """Parse one integer and check its bounds.

    Parameters
    ----------
    text : str
        ``12``, ``-3``, ``1_000``, ``2e7`` or ``4.0``: any whole value.
    least, most : int, optional
        Inclusive bounds (``None``: unbounded on that side).

    Returns
    -------
    int

    Raises
    ------
    ValueError
        One line without the argument's name: ``'x' is not a whole number`` (``integer``
        when ``least`` is ``None`` or negative), ``must be ≥ 1, got 0``, ``must be in 1…65535,
        got 0``.
    """
    try:
        number = Decimal(str(text).strip())
    except InvalidOperation:
        number = None
    if number is None or not number.is_finite() or number != number.to_integral_value():
        noun = "a whole number" if least is not None and least >= 0 else "an integer"
        raise ValueError(f"{text!r} is not {noun}")
    if number.adjusted() >= MAX_DIGITS:
        raise ValueError(f"{text!r} is too large")
    value = int(number)
    if (least is not None and value < least) or (most is not None and value > most):
        raise ValueError(f"must be {_range(least, most)}, got {value}")
    return value


def to_number(text: str, least: float | None = None, most: float | None = None, *, positive: bool = False,
              unit: str | None = None) -> float:
    """Parse one finite number and check its bounds.

    Parameters
    ----------
    text : str
        ``0.5``, ``1e-3``, ``-2``.
    least, most : float, optional
        Inclusive bounds (``None``: unbounded on that side).
    positive : bool
        Refuse 0 and below.
    unit : str, optional
        Named in the messages (``seconds``, ``milliseconds``).

    Returns
    -------
    float

    Raises
    ------
    ValueError
        One line without the argument's name: ``'x' is not a number of seconds``, ``must be a
        positive number of seconds, got -5``, ``must be in 0…10000 milliseconds, got nan``.
    """
    noun = f"number of {unit}" if unit else "number"
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a {noun}") from None
    if positive and not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a positive {noun}, got {text}")
    outside = (least is not None and value < least) or (most is not None and value > most)
    if outside or not math.isfinite(value):
        bound = _range(least, most) + (f" {unit}" if unit else "") if least is not None or most is not None \
            else f"a finite {noun}"
        raise ValueError(f"must be {bound}, got {text}")
    return value


def to_seconds(text: str) -> float:
    """Parse a positive, finite number of seconds (:func:`to_number`)."""
    return to_number(text, positive=True, unit="seconds")


def whole(least: int | None = 1, most: int | None = None) -> Callable[[str], int]:
    """The argparse ``type`` of one integer in ``least … most``.

    Parameters
    ----------
    least : int or None
        Smallest value accepted (default 1: a count of something; 0 for seeds; ``None``: any).
    most : int, optional
        Largest value accepted.

    Returns
    -------
    callable
        ``str -> int``, raising ``argparse.ArgumentTypeError`` (see :func:`to_int`).
    """
    def parse(text: str) -> int:
        return _typed(to_int, text, least, most)

    parse.__name__ = "integer"
    return parse


def wholes(least: int | None = 1, most: int | None = None, *, empty: bool = False) -> Callable[[str], list[int]]:
    """The argparse ``type`` of a list of integers, comma or space separated (``1,8,32``).

    Parameters
    ----------
    least, most : int or None
        Bounds of every value, as for :func:`whole`.
    empty : bool
        Accept ``""`` as the empty list (otherwise at least one value is required).

    Returns
    -------
    callable
        ``str -> list[int]``, raising ``argparse.ArgumentTypeError``.
    """
    def parse(text: str) -> list[int]:
        items = str(text).replace(",", " ").split()
        if not items and not empty:
            raise argparse.ArgumentTypeError("give at least one value")
        return [_typed(to_int, item, least, most) for item in items]

    parse.__name__ = "integer list"
    return parse


def number(least: float | None = None, most: float | None = None, *, positive: bool = False,
           unit: str | None = None) -> Callable[[str], float]:
    """The argparse ``type`` of one finite number (see :func:`to_number` for the arguments)."""
    def parse(text: str) -> float:
        return _typed(to_number, text, least, most, positive=positive, unit=unit)

    parse.__name__ = "number"
    return parse


def seconds() -> Callable[[str], float]:
    """The argparse ``type`` of a time budget: a positive, finite number of seconds
    (see :func:`to_seconds`)."""
    return number(positive=True, unit="seconds")


def minutes() -> Callable[[str], float]:
    """The argparse ``type`` of a training budget: a positive, finite number of minutes."""
    return number(positive=True, unit="minutes")


def _typed(convert, text, *args, **kwargs):
    try:
        return convert(text, *args, **kwargs)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _range(least: float | None, most: float | None) -> str:
    def shown(bound):
        return str(bound) if isinstance(bound, int) else f"{bound:g}"

    if least is not None and most is not None:
        return f"in {shown(least)}…{shown(most)}"
    return f"≥ {shown(least)}" if least is not None else f"≤ {shown(most)}"
