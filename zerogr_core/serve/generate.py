"""SGLang-compatible ``POST /generate`` for the Qwen3 recommender, and ``/recommend``'s LLM form.

Request (SGLang's native ``/generate``, token ids only)::

    {"input_ids": [ids] or [[ids], ...],
     "sampling_params": {"max_new_tokens": L, "n": 10, "beam_width": M},
     "rid": "optional id" (or, batched, one per input)}

``max_new_tokens`` must equal the SID length L (or be absent); ``beam_width`` (also
``num_beams``) must equal the server's beam M (or be absent): the decode is planned at M.
``n`` is how many ranked items come back (default M). ``sampling_params`` is one object for
every input or a list of one per input. Beam search is deterministic, so ``temperature``
must be 0 when given. Response: per input, ``{"beam_results": [...], "meta_info": {...}}``
(a list of those for a batched request), each beam result
``{"item": id, "score": log-prob, "output_ids": [vocab ids], "sid": [local codes]}``, best
first. Everything wrong with a body is a one-line :class:`RequestError` naming the field.
"""
from __future__ import annotations

from .llm import BeamAnswer, LLMQuery
from .schema import RequestError, parse_json, parse_query

FIELDS = ("input_ids", "sampling_params", "rid", "stream", "text")
SAMPLING_FIELDS = ("max_new_tokens", "n", "beam_width", "num_beams", "temperature")
#: Most inputs one batched ``/generate`` may carry: its inputs decode in the replica's batches, ahead of
#: later requests, so the count bounds one request's decode time and how long it holds other clients back.
MAX_INPUTS = 64
#: Longest ``rid``: it comes back in the ``meta_info`` of every input's answer.
MAX_RID = 256


def _int(value, field: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestError(f"{field}: expected an integer, got {value!r}")
    if not low <= value <= high:
        raise RequestError(f"{field}: {value} is out of range {low}…{high}")
    return value


def _context(value, field: str, *, vocab: int, max_context: int) -> tuple:
    if not isinstance(value, list) or not value:
        raise RequestError(f"{field}: expected a non-empty list of token ids")
    if len(value) > max_context:
        raise RequestError(f"{field}: {len(value)} tokens, at most {max_context}", status=413)
    for j, t in enumerate(value):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
            raise RequestError(f"{field}[{j}]: {t!r} is not a token id in 0…{vocab - 1}")
    return tuple(value)


def _sampling(params, field: str, *, beam: int, levels: int) -> int:
    """``n`` of one ``sampling_params`` object, its other fields checked."""
    if params is None:
        return beam
    if not isinstance(params, dict):
        raise RequestError(f"{field}: expected an object, got {type(params).__name__}")
    unknown = sorted(set(params) - set(SAMPLING_FIELDS))
    if unknown:
        raise RequestError(f"{field}.{unknown[0]}: not supported by beam decoding (fields: {', '.join(SAMPLING_FIELDS)})")
    if params.get("max_new_tokens") is not None and params["max_new_tokens"] != levels:
        raise RequestError(f"{field}.max_new_tokens: must be {levels} (the SID length), got "
                           f"{params['max_new_tokens']!r}")
    for key in ("beam_width", "num_beams"):
        if params.get(key) is not None and params[key] != beam:
            raise RequestError(f"{field}.{key}: this server decodes at beam {beam}, got {params[key]!r}")
    t = params.get("temperature")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t != 0):
        raise RequestError(f"{field}.temperature: beam search is deterministic; give 0 or leave it out, got {t!r}")
    return beam if params.get("n") is None else _int(params["n"], f"{field}.n", 1, beam)


def _rid(value, field: str, expected: str) -> str:
    if not isinstance(value, str):
        raise RequestError(f"{field}: expected {expected}, got {type(value).__name__}")
    if len(value) > MAX_RID:
        raise RequestError(f"{field}: {len(value)} characters, at most {MAX_RID}")
    return value


def _rids(value, batched: bool, count: int) -> list:
    """One ``rid`` per input (``None`` where none was given)."""
    if value is None:
        return [None] * count
    if not (batched and isinstance(value, list)):
        return [_rid(value, "rid", "a string, or a list of one per input" if batched else "a string")] * count
    if len(value) != count:
        raise RequestError(f"rid: {len(value)} ids for {count} inputs")
    return [_rid(r, f"rid[{i}]", "a string") for i, r in enumerate(value)]


def parse_generate(body, *, beam: int, levels: int, vocab: int, max_context: int) -> tuple[list, bool, list]:
    """Validate a ``/generate`` body.

    Parameters
    ----------
    body : bytes or str
    beam : int
        The server's beam width M.
    levels : int
        The SID length L (``max_new_tokens``).
    vocab : int
        The model's vocabulary size (token ids are ``0 … vocab - 1``).
    max_context : int

    Returns
    -------
    (list of LLMQuery, bool, list)
        The queries, whether the request was batched (``input_ids`` a list of lists), and each
        input's ``rid`` (a string, or ``None``).

    Raises
    ------
    RequestError
        400 for a malformed body (the message names the field; ``rid`` must be a string of at most
        :data:`MAX_RID` characters or, batched, a list of one per input), 413 for a context over
        ``max_context`` tokens or more inputs than :data:`MAX_INPUTS`.
    """
    doc = parse_json(body)
    if not isinstance(doc, dict):
        raise RequestError(f"body must be a JSON object with input_ids, got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(FIELDS))
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r} (fields: input_ids, sampling_params, rid, stream)")
    if doc.get("text") is not None:
        raise RequestError("text: this server takes input_ids (token ids), not text")
    if doc.get("stream") not in (None, False):
        raise RequestError("stream: streaming is not supported (the items come back together)")
    ids = doc.get("input_ids")
    if ids is None:
        raise RequestError("input_ids: required (a list of token ids, or a list of such lists)")
    batched = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
    inputs = ids if batched else [ids]
    if len(inputs) > MAX_INPUTS:
        raise RequestError(f"input_ids: {len(inputs)} inputs, at most {MAX_INPUTS}", status=413)
    rids = _rids(doc.get("rid"), batched, len(inputs))
    params = doc.get("sampling_params")
    if isinstance(params, list):
        if len(params) != len(inputs):
            raise RequestError(f"sampling_params: {len(params)} objects for {len(inputs)} inputs")
        per = params
    else:
        per = [params] * len(inputs)
    queries = []
    for i, (context, p) in enumerate(zip(inputs, per)):
        where = f"input_ids[{i}]" if batched else "input_ids"
        pwhere = f"sampling_params[{i}]" if isinstance(params, list) else "sampling_params"
        queries.append(LLMQuery(_context(context, where, vocab=vocab, max_context=max_context),
                                _sampling(p, pwhere, beam=beam, levels=levels)))
    return queries, batched, rids


def parse_recommend(body, *, beam: int, vocab: int, max_context: int, string_ids: bool = False) -> LLMQuery:
    """``POST /recommend`` on the LLM server: ``history`` is the context's token ids,
    ``exclude`` item ids never to return, ``allow`` the only ones to return, ``k`` the items returned (the fields of
    :func:`~.schema.parse_query`; ``keep_history`` has no meaning here and is refused when true). ``string_ids``:
    the catalog's item ids are strings (``exclude`` and ``allow`` then hold strings)."""
    query = parse_query(body, max_k=beam, string_ids=string_ids, token_history=True)
    if query.keep_history:
        raise RequestError("keep_history: the history is token ids here, not items")
    context = _context(list(query.history), "history", vocab=vocab, max_context=max_context)
    return LLMQuery(context, query.k, query.exclude, query.allow)


def beam_results(answer: BeamAnswer, query: LLMQuery, levels: int, rid=None) -> dict:
    """The SGLang-style response object of one input."""
    results = [dict(item=item, score=score, output_ids=ids.tolist(), sid=codes.tolist())
               for item, score, ids, codes in zip(answer.items, answer.scores, answer.token_ids, answer.codes)]
    meta = dict(prompt_tokens=len(query.input_ids), completion_tokens=levels,
                finish_reason=dict(type="length", length=levels), beams=len(results))
    if rid is not None:
        meta["id"] = rid
    return dict(beam_results=results, meta_info=meta)
