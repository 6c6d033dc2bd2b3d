"""The HTTP request of ``POST /recommend``, validated into a :class:`Query`.

Body: ``{"history": [item ids], "k": 10, "exclude": [item ids], "allow": [item ids], "keep_history": false}``.
Everything wrong with a body is a :class:`RequestError` whose message names the field
(and entry) at fault, in one line; the server answers it with its ``status``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import ZeroGRError, shown

FIELDS = ("history", "k", "exclude", "allow", "keep_history")
DEFAULT_K = 10
#: Longest id list a request may carry (the model reads only the newest ``max_history``).
MAX_LIST = 10_000
#: Largest request body either server reads, in bytes (MovieLens and Qwen3 alike): the id-list and context limits
#: bound what a request holds, not its bytes (a string id can be any length), and the whole body is in memory before
#: it is parsed. 8 MiB holds the largest legal requests with room to spare: a ``/recommend`` of three lists of 10,000
#: string ids of up to ~270 characters (or of 64-bit integers: 0.7 MB) beside a context of 8,192 token ids (65 kB),
#: or a ``/generate`` of 64 inputs of 8,192 token ids each (4 MiB at 8 bytes a token, ``"176511, "``); SID-GR's
#: online request, one 5,000-token context, is 40 kB.
MAX_BODY_BYTES = 8 * 1024 * 1024


class RequestError(ZeroGRError):
    """A request the server refuses; ``status`` is its HTTP status (4xx)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Query:
    """One validated request.

    Attributes
    ----------
    history : tuple of int or str
        Item ids, oldest first (non-empty).
    k : int
        Items to return, 1 ≤ k ≤ the server's beam width.
    exclude : tuple of int or str
        Item ids never to return.
    keep_history : bool
        Allow the history's items in the answer (excluded by default).
    allow : tuple of int or str, or None
        The only item ids the answer may hold (in stock, in the user's region); ``None``: every
        item. An empty list allows none. Enforced during decoding, like ``exclude``.
    """

    history: tuple
    k: int = DEFAULT_K
    exclude: tuple = ()
    keep_history: bool = False
    allow: tuple | None = None


def id_list(value, field: str, *, string_ids: bool | None, allow_empty: bool, limit: int | None = MAX_LIST,
            tokens: bool = False) -> tuple:
    """Check a list of item ids (``string_ids`` None: integers or strings, the catalog not yet known),
    or with ``tokens`` of token ids (integers, each checked against the vocabulary by the caller);
    a :class:`RequestError` naming the field and entry, 413 for more than ``limit`` ids."""
    noun = "token id" if tokens else "item id"
    if not isinstance(value, list):
        raise RequestError(f"{field}: expected a list of {noun}s, got {type(value).__name__}")
    if not value and not allow_empty:
        raise RequestError(f"{field}: give at least one {noun}")
    if tokens:
        string_ids = False
    if limit is not None and len(value) > limit:
        raise RequestError(f"{field}: {len(value)} ids, at most {limit}", status=413)
    for i, item in enumerate(value):
        integer = isinstance(item, int) and not isinstance(item, bool)
        if string_ids is None and not (integer or isinstance(item, str)):
            raise RequestError(f"{field}[{i}]: item id {item!r} is not an integer or a string")
        if tokens and not integer:
            raise RequestError(f"{field}[{i}]: token id {item!r} is not an integer")
        if string_ids is not None and not (isinstance(item, str) if string_ids else integer):
            kind = "a string" if string_ids else "an integer"
            raise RequestError(f"{field}[{i}]: item id {item!r} is not {kind} (this catalog has "
                               f"{'string' if string_ids else 'integer'} ids)")
        if integer and not -2**63 <= item < 2**63:
            raise RequestError(f"{field}[{i}]: {noun} {item} is outside the 64-bit range of {noun}s")
    return tuple(value)


def body_too_large(size: str, limit: int = MAX_BODY_BYTES) -> RequestError:
    """The 413 of a body of ``size`` (e.g. ``"9000000 bytes"``) over ``limit`` bytes."""
    return RequestError(f"body: {size}, at most {limit} bytes ({limit / 2**20:g} MiB) a request", status=413)


def check_body_size(size: int, limit: int = MAX_BODY_BYTES) -> None:
    """:func:`body_too_large` when a body of ``size`` bytes is over ``limit``."""
    if size > limit:
        raise body_too_large(f"{size} bytes", limit)


async def read_limited(content_length: str | None, chunks, limit: int = MAX_BODY_BYTES) -> bytes:
    """A request body of at most ``limit`` bytes, read from the async iterator ``chunks``.

    Parameters
    ----------
    content_length : str or None
        The request's ``Content-Length`` header: a body it declares over ``limit`` is refused before a byte of it
        is read. ``None`` (or not a number: the web server has checked it) leaves the check to the stream.
    chunks : async iterable of bytes
    limit : int

    Raises
    ------
    RequestError
        413 (:func:`body_too_large`) as soon as the body is known to be over ``limit``: the rest is never read.
    """
    if content_length is not None and content_length.strip().isdigit():
        check_body_size(int(content_length), limit)
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:  # a chunked body, or one longer than it declared: stop reading here
            raise body_too_large(f"{size} bytes so far", limit)
        parts.append(chunk)
    return b"".join(parts)


def _not_json(name: str):
    # Python's reader takes NaN and Infinity, which JSON (RFC 8259) does not have
    raise RequestError(f"body holds {name}, which is not JSON (a number must be finite)")


def _fields_once(pairs: list) -> dict:
    # a field given twice would silently keep its last value: the client meant one of them
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise RequestError(f"body gives the field {shown(key)} twice")
        seen.add(key)
    return dict(pairs)


def parse_json(body: bytes | str) -> object:
    """The JSON document of a request body; :class:`RequestError` (400) when it is not UTF-8, not
    JSON (NaN and Infinity included), gives a field twice, is nested too deeply to read, or holds a
    number too long to read."""
    try:
        return json.loads(body.decode("utf-8") if isinstance(body, bytes) else body, parse_constant=_not_json,
                          object_pairs_hook=_fields_once)
    except RequestError:
        raise
    except UnicodeDecodeError:
        raise RequestError("body is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise RequestError(f"body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except RecursionError:
        raise RequestError("body is nested too deeply to read") from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise RequestError(f"body holds a value that cannot be read: {' '.join(str(err).split())}") from None


def parse_query(body: bytes | str, *, max_k: int, string_ids: bool = False, token_history: bool = False) -> Query:
    """Validate a request body.

    Parameters
    ----------
    body : bytes or str
        The JSON text.
    max_k : int
        Largest ``k`` served (the beam width).
    string_ids : bool
        Whether the catalog's item ids are strings (else integers).
    token_history : bool
        The history is the model's token ids (integers, the Qwen3 server), not item ids.

    Raises
    ------
    RequestError
        Not JSON, not an object, an unknown field, a field of the wrong type, ``k`` out of
        range (all 400), or a list longer than :data:`MAX_LIST` (413). Whether the ids are
        in the catalog is checked against the version that decodes (422).
    """
    doc = parse_json(body)
    if not isinstance(doc, dict):
        raise RequestError(f"body must be a JSON object with fields {', '.join(FIELDS)}, got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(FIELDS))
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    if "history" not in doc:
        raise RequestError(f"history: required (a list of {'token' if token_history else 'item'} ids, oldest first)")
    history = id_list(doc["history"], "history", string_ids=string_ids, allow_empty=False, tokens=token_history)
    exclude = id_list(doc.get("exclude", []), "exclude", string_ids=string_ids, allow_empty=True)
    allow = doc.get("allow")
    if allow is not None:
        allow = id_list(allow, "allow", string_ids=string_ids, allow_empty=True)
    k = doc.get("k", min(DEFAULT_K, max_k))  # a server of fewer beams returns them all by default
    if not isinstance(k, int) or isinstance(k, bool):
        raise RequestError(f"k: expected an integer, got {k!r}")
    if not 1 <= k <= max_k:
        raise RequestError(f"k: {k} is out of range 1…{max_k} (the server's beam width)")
    keep = doc.get("keep_history", False)
    if not isinstance(keep, bool):
        raise RequestError(f"keep_history: expected true or false, got {keep!r}")
    return Query(history, k, exclude, keep, allow)
