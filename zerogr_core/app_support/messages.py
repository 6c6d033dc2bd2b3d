"""The text of the app's error boxes: one line, of a readable length, shown as written.

A :class:`~zerogr_core.errors.ZeroGRError` is one line by contract, but it may quote what a
user gave (a column name, a cell, a file name), and an upload can hold anything: a header
with a line break in quotes, a cell of thousands of characters, ``$…$`` that the box's
Markdown would typeset as a formula. The pages pass every message through :func:`one_line`.
"""
from __future__ import annotations

import re

#: Longest message a box shows; longer ones keep their head and tail (where the file, row and
#: column, and the reason, are) around an ellipsis.
MAX_CHARS = 400
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(text: str, limit: int = MAX_CHARS) -> str:
    """``text`` as one line of at most about ``limit`` characters, safe for ``st.error``.

    Parameters
    ----------
    text : str
        A user-facing message (often ``str(err)`` of a ``ZeroGRError``).
    limit : int
        Characters kept; the middle of a longer message is replaced by `` … ``.

    Returns
    -------
    str
        Control characters written as escapes (``\\n``, ``\\x00``), ``$`` escaped so that
        Markdown shows it rather than starting a formula.
    """
    flat = _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text).strip())
    if len(flat) > limit:
        head = (2 * limit) // 3
        flat = f"{flat[:head]} … {flat[len(flat) - (limit - head):]}"
    return flat.replace("$", "\\$")
