"""The model-step protocol: a KV-cache model driven by the beam loop one step at a time.

A :class:`StepModel` serves one batch of requests at a time:

1. ``prefill(history, attention_mask, beam_width=M)`` reads the requests (encoder pass,
   or the history part of a causal sequence) and allocates every per-beam buffer at its
   final, static shape.
2. ``step(0, None, None)`` starts a decode of that batch and returns the hidden states of
   the first level, one beam per request: (batch, H). It may be called again to restart.
3. ``step(l, tokens, parents)`` for l = 1 … L-1: ``tokens`` (batch, M) int are the level
   l-1 tokens just chosen (local ids, -1 for unfilled beams) and ``parents`` (batch, M)
   int64 the flat row, into the previous step's (batch × beams) rows, of each beam's
   parent (-1 for unfilled beams). This is Hugging Face's ``beam_idx`` and what
   :class:`zerogr_kernels.TopkOut` calls ``parents``. The model reorders its caches by parent,
   appends the new tokens and returns the hidden states (batch * M, H).

A model may set ``partial_last_step = True``: at the last step filtering first then passes
``step(L-1, tokens, parents, wanted=(batch, M) bool, rows=r)``, the beams whose hidden states it
reads (those whose prefix holds more than one item; any other beam's only item gets log-probability
0 whatever the model says) and ``r``, at least their number in every request; the model may compute
``r`` beams per request, the wanted ones among them, and return zeros for the rest
(:mod:`zerogr_core.decode.loop`; :func:`partial_step`). Such a step must leave the model's caches as
it found them: the engine may run it again after the same earlier steps (the Qwen3, T5 and
decoder-only step models do this).

A model may also offer ``stage(history, attention_mask, beam_width=M)``: the prefill's
device work moved into ``step(0, …)`` (the inputs copied into static, length-bucketed
buffers; the encoder and the cross-attention keys/values computed there), so one CUDA
graph replay runs prefill and decode together (:func:`load_requests`).

Every step writes into preallocated tensors with in-place ``index_select``/``copy_`` and
slices whose shapes depend on the step number only, so the L steps of a decode, model
included, can be captured in one CUDA graph and replayed for later batches of the same
shape (the prefill writes new requests into the same buffers; :func:`keep_static` records
the shape in ``_static_key``, and the engine captures again when that key changes).

:class:`zerogr_core.Decoder` takes a prefilled step model wherever it takes a
``hidden_fn``: the beam loop (:class:`zerogr_core.decode.loop.BeamLoop`) passes it the
tokens and parents its previous step selected, from that step's static output buffers.
:class:`PrefixTracker` goes the other way, for code that wants a ``hidden_fn``: it recovers
each beam's parent from two consecutive prefix tensors.
"""
from __future__ import annotations

import threading

import torch

from ..decode.heads import check_band_offsets  # noqa: F401 (the adapters import it from here)
from ..decode.search import StepModel  # noqa: F401 (the protocol lives where the loop consumes it)
from ..errors import ZeroGRError


def token_inputs(history, attention_mask, vocab: int | None, device: torch.device, *,
                 check_range: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """A token-id model's requests, checked and on ``device``: ``(input_ids, attention_mask)``.

    Refused in one line naming the argument: not a tensor, not (batch ≥ 1, T ≥ 1), ids that are
    not integers (a float tensor would fail in the embedding, or be truncated when staged into
    the model's int64 buffers), ids outside ``[0, vocab)`` (an IndexError deep in the embedding
    on a CPU, a device-side assert that ends the process's CUDA context on a GPU) and a mask
    that is not a tensor of the ids' shape, or holds values other than 0 and 1. The mask's values
    are read where the mask is given when that is the host; the ids' range wherever they are (one
    reduction read back for ids on a GPU), unless the caller checks it after the launch.

    Parameters
    ----------
    history : torch.Tensor, shape (B, T), integer
    attention_mask : torch.Tensor, shape (B, T), or None
        1 on tokens, 0 on padding (default: all ones); other values are refused where the
        mask is on the host.
    vocab : int or None
        The model's input vocabulary size (``None``: not known, the ids' range is not checked).
    device : torch.device
    check_range : bool
        ``False`` leaves the ids' range to the caller (:class:`StagedRange`, for ids already on
        a GPU, read once the prefill is launched).
    """
    if not isinstance(history, torch.Tensor) or history.dim() != 2 or history.shape[0] < 1 or history.shape[1] < 1:
        shape = tuple(history.shape) if isinstance(history, torch.Tensor) else type(history).__name__
        raise ZeroGRError(f"input_ids: expected a tensor of shape (batch ≥ 1, T ≥ 1), got {shape}")
    if history.is_floating_point() or history.is_complex() or history.dtype == torch.bool:
        raise ZeroGRError(f"input_ids: token ids must be integers, got {str(history.dtype).replace('torch.', '')}")
    # a bad id on a GPU would end the process's CUDA context in the embedding's device-side assert;
    # a meta tensor (shapes only) has no values to read
    if vocab is not None and check_range and history.device.type != "meta":
        lo, hi = torch.stack(torch.aminmax(history)).tolist()
        if lo < 0 or hi >= vocab:
            raise vocab_error(vocab, int(((history < 0) | (history >= vocab)).any(dim=1).nonzero()[0, 0]))
    if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
        raise ZeroGRError(f"attention_mask: expected a torch.Tensor, got {type(attention_mask).__name__}")
    if attention_mask is not None and attention_mask.device.type == "cpu" and attention_mask.dtype != torch.bool:
        # a causal LM counts positions by summing the mask: a 2 would move every later position
        other = (attention_mask != 0) & (attention_mask != 1)
        if bool(other.any()):
            raise ZeroGRError(f"attention_mask: values must be 0 (padding) or 1 (token), got "
                              f"{attention_mask[other][0].item()!r}")
    history = history.to(device, torch.int64)
    mask = torch.ones_like(history) if attention_mask is None else attention_mask.to(device)
    if mask.shape != history.shape:
        raise ZeroGRError(f"attention_mask: shape {tuple(mask.shape)} differs from input_ids {tuple(history.shape)}")
    return history, mask


def right_padded(history, attention_mask, vocab: int, device: torch.device, *, check_range: bool = True):
    """A causal LM's requests moved to right padding, validated.

    Parameters
    ----------
    history : torch.Tensor, shape (B, T), integer
        Token ids.
    attention_mask : torch.Tensor, shape (B, T), or None
        Ones on tokens, one contiguous run per row (left or right padding); any other layout,
        an empty row or ids outside ``[0, vocab)`` on a token are refused in one line.
    vocab : int
    device : torch.device
    check_range : bool
        ``False`` leaves the range of the ids of a call without a mask to the caller
        (:class:`StagedRange`, read once the prefill is launched).

    Returns
    -------
    ids : torch.Tensor, shape (B, T), int64, on ``device``
        Each row's tokens first, then 0.
    lengths : torch.Tensor, shape (B,), int64, or None
        Tokens per row; ``None`` without a mask (every row is T tokens).
    """
    if not isinstance(history, torch.Tensor) or history.dim() != 2 or history.shape[1] < 1:
        shape = tuple(history.shape) if isinstance(history, torch.Tensor) else type(history).__name__
        raise ZeroGRError(f"input_ids: expected a (batch, T ≥ 1) integer tensor, got {shape}")
    if history.dtype.is_floating_point or history.dtype == torch.bool:
        raise ZeroGRError(f"input_ids: expected integer token ids, got {history.dtype}")
    b, t = history.shape
    if attention_mask is None and not check_range:
        return history.to(device, torch.int64), None
    if attention_mask is None:
        # the common call: one reduction where the ids are (a synchronisation only if that is a GPU)
        lo, hi = torch.stack(torch.aminmax(history)).tolist()
        if lo < 0 or hi >= vocab:
            raise vocab_error(vocab, int(((history < 0) | (history >= vocab)).any(dim=1).nonzero()[0, 0]))
        return history.to(device, torch.int64), None
    ids = history.to(device, torch.int64)
    out_of_vocab = (ids < 0) | (ids >= vocab)
    if tuple(attention_mask.shape) != (b, t):
        raise ZeroGRError(f"attention_mask: shape {tuple(attention_mask.shape)} differs from input_ids "
                          f"{(b, t)}")
    mask = attention_mask.to(device).bool()
    lengths = mask.sum(dim=1)
    start = mask.to(torch.int8).argmax(dim=1)
    pos = torch.arange(t, device=device)
    rel = pos[None, :] - start[:, None]
    scattered = (mask != ((rel >= 0) & (rel < lengths[:, None]))).any()
    bad_ids = (mask & out_of_vocab).any(dim=1)
    empty, scattered, bad = torch.stack([(lengths < 1).any(), scattered, bad_ids.any()]).tolist()
    if empty:
        raise ZeroGRError(f"attention_mask: row {int(torch.argmin(lengths))} has no token")
    if scattered:
        raise ZeroGRError("attention_mask: each row's tokens must be one contiguous run (left or right padding)")
    if bad:
        raise vocab_error(vocab, int(bad_ids.nonzero()[0, 0]))
    src = (start[:, None] + pos[None, :]).clamp(max=t - 1)
    ids = torch.where(pos[None, :] < lengths[:, None], ids.gather(1, src), 0)
    return ids, lengths


def defers_range(history: torch.Tensor, device: torch.device) -> bool:
    """Whether a step model's ``stage`` leaves the range check of ``history`` to :class:`StagedRange`:
    ids already on the model's GPU (a check of host ids costs no wait)."""
    return history.is_cuda and torch.device(device).type == "cuda"


def vocab_error(vocab: int, row: int) -> ZeroGRError:
    """The one-line error of a request whose token ids leave ``[0, vocab)``."""
    return ZeroGRError(f"input_ids: row {row} has ids outside the model's vocabulary [0, {vocab})")


class StagedRange:
    """The range check of token ids staged from a GPU tensor, read once the prefill is launched.

    Checking a CUDA tensor's ids before the prefill means the host waits for a device reduction
    with the GPU idle: on a lent H100, up to 0.16 ms of a 1,000-token, batch-1 Qwen3 call
    (``runs/probe_llm_host_gaps.py``) and 6 % of a TIGER-size T5 call (``runs/probe_t5_range.py``),
    where checking this way costs the T5 call 1.1–1.4 %. Instead the prefill writes the staged ids' minimum and
    maximum to pinned memory (a copy and an event node inside its CUDA graph) and embeds the ids
    clamped into range, so a bad id never reaches a gather; :meth:`verify`, called after the
    decode's launch, waits for that early event and raises the same one-line error as the check
    before, and the caller drops the decode's results.

    Parameters
    ----------
    device : torch.device
        The model's device.
    """

    def __init__(self, device):
        cuda = torch.device(device).type == "cuda"
        self.host = torch.zeros(2, dtype=torch.int64)
        if cuda:
            self.host = self.host.pin_memory()
        self.ready = torch.cuda.Event(external=True) if cuda else None
        #: the staged ids wait for :meth:`verify` (set by the model's ``stage``)
        self.pending = False

    def record(self, ids: torch.Tensor) -> None:
        """Device work beside the prefill (capturable): copy the min and max of ``ids`` to the host.
        On a GPU it always runs, since a captured graph runs it for every later call."""
        if self.ready is None and not self.pending:
            return
        self.host.copy_(torch.stack(torch.aminmax(ids)), non_blocking=self.ready is not None)
        if self.ready is not None:
            self.ready.record()

    def verify(self, ids: torch.Tensor, vocab: int) -> None:
        """Raise :class:`~zerogr_core.ZeroGRError` naming the first row of ``ids`` (the staged
        buffer, shape (B, T)) with an id outside ``[0, vocab)``, if the staged ids wait for it."""
        if not self.pending:
            return
        self.pending = False
        if self.ready is not None:
            self.ready.synchronize()
        lo, hi = self.host.tolist()
        if lo < 0 or hi >= vocab:
            raise vocab_error(vocab, int(((ids < 0) | (ids >= vocab)).any(dim=1).nonzero()[0, 0]))


def safe_parents(parents: torch.Tensor, beams_prev: int) -> torch.Tensor:
    """Flat parent rows with every unfilled beam (-1) pointed at its request's first row.

    Parameters
    ----------
    parents : torch.Tensor, shape (batch, M), int64
        Flat rows into the previous step's (batch × ``beams_prev``) rows, -1 for unfilled beams.
    beams_prev : int

    Returns
    -------
    torch.Tensor, shape (batch * M,), int64
        Rows that are always valid and stay within the beam's own request, so an unfilled
        beam reads its request's memory (its outputs are never used).
    """
    batch, beams = parents.shape
    first = torch.arange(batch, device=parents.device)[:, None] * beams_prev
    return torch.where(parents >= 0, parents, first).reshape(batch * beams)


def partial_flag(value) -> bool:
    """A step model's ``partial_last_step`` argument, refused in one line unless a bool (a string
    such as ``"no"`` would read as true)."""
    if not isinstance(value, bool):
        raise ZeroGRError(f"partial_last_step: expected True or False, got {value!r}")
    return value


def partial_step(wanted: torch.Tensor, rows: int, hidden_size: int, dtype: torch.dtype, compute) -> torch.Tensor:
    """A partial last step's hidden states: ``compute`` on ``rows`` beams per request, each request's
    wanted beams first (in beam order), zeros for the beams left out.

    Parameters
    ----------
    wanted : torch.Tensor, shape (batch, M), bool
        The beams the step's selection reads (:mod:`zerogr_core.decode.loop`).
    rows : int
        Beams per request to compute, at least the wanted ones of every request (at most M is used).
    hidden_size : int
    dtype : torch.dtype
        Of the returned states.
    compute : callable
        ``compute(order)`` with ``order`` (batch, r) int64, the beams (positions within their request)
        to compute, returns their hidden states (batch * r, hidden_size), request by request.

    Returns
    -------
    torch.Tensor, shape (batch * M, hidden_size)
    """
    batch, beams = wanted.shape
    r = min(int(rows), beams)
    out = torch.zeros(batch, beams, hidden_size, dtype=dtype, device=wanted.device)
    if r > 0:
        order = torch.argsort(wanted.to(torch.int8), dim=1, descending=True, stable=True)[:, :r]
        h = compute(order).view(batch, r, hidden_size)
        out.scatter_(1, order[:, :, None].expand(batch, r, hidden_size), h.to(dtype))
    return out.view(batch * beams, hidden_size)


def reorder_rows(buffers, rows: torch.Tensor, n_prev: int, positions: int | None = None) -> None:
    """Gather per-beam buffers from their parents' rows, in place (static shapes).

    Parameters
    ----------
    buffers : iterable of torch.Tensor, each (rows_max, ...)
        Row ``i`` belongs to beam ``i``; after the call rows ``0 … n-1`` hold the rows
        ``rows`` of the previous step's first ``n_prev`` rows.
    rows : torch.Tensor, shape (n,), int64
        From :func:`safe_parents`.
    n_prev : int
        Rows the previous step used.
    positions : int, optional
        For caches shaped (rows_max, heads, positions_max, d): only the first
        ``positions`` positions are gathered (the ones written so far).
    """
    n = rows.numel()
    for buf in buffers:
        src, dst = buf[:n_prev], buf[:n]
        if positions is not None:
            src, dst = src[:, :, :positions], dst[:, :, :positions]
        dst.copy_(src.index_select(0, rows))


def _copy_into(dst, src) -> None:
    if isinstance(dst, torch.Tensor):
        dst.copy_(src)
    else:
        for d, s in zip(dst, src):
            _copy_into(d, s)


def keep_static(owner, key: tuple, **values) -> bool:
    """Store a prefill's per-request tensors on ``owner``, in the same tensors when the shape repeats.

    Parameters
    ----------
    owner : object
        The step model.
    key : tuple
        The shape the tensors depend on (batch, history length, beam width).
    **values : torch.Tensor or nested lists/tuples of them
        Set as attributes of ``owner``. When ``key`` equals the previous call's, they are
        copied into the tensors already there, so a decode captured in a CUDA graph
        replays on the new requests.

    Returns
    -------
    bool
        Whether the previous tensors were reused (the per-beam caches may be kept too).
    """
    same = getattr(owner, "_static_key", None) == key
    for name, value in values.items():
        if same:
            _copy_into(getattr(owner, name), value)
        else:
            setattr(owner, name, value)
    owner._static_key = key
    return same


def parents_from_prefixes(prev: torch.Tensor, nxt: torch.Tensor) -> torch.Tensor:
    """Each beam's parent, found by matching prefixes of two consecutive steps.

    Parameters
    ----------
    prev : torch.Tensor, shape (batch, Mp, l), int64
        Prefixes at step l (-1 for unfilled beams).
    nxt : torch.Tensor, shape (batch, M, l + 1), int64
        Prefixes at step l + 1.

    Returns
    -------
    torch.Tensor, shape (batch, M), int64
        Flat row ``r * Mp + i`` of the beam of ``prev`` whose prefix ``nxt[r, m, :l]``
        extends; -1 for unfilled beams. Beams of one step are distinct sequences, so the
        match is unique. Device-side only (no host synchronisation).
    """
    batch, mp, level = prev.shape
    filled = nxt[..., level] >= 0
    if level == 0:
        local = torch.zeros(nxt.shape[:2], dtype=torch.int64, device=nxt.device)
        found = filled
    else:
        hit = (nxt[:, :, None, :level] == prev[:, None, :, :]).all(dim=-1) & (prev[:, None, :, 0] >= 0)
        found = hit.any(dim=-1) & filled
        local = hit.to(torch.int8).argmax(dim=-1)
    rows = torch.arange(batch, device=nxt.device)[:, None] * mp + local
    return torch.where(found, rows, -1)


class PrefixTracker:
    """A :class:`StepModel` seen as ``hidden_fn(step, prefixes)`` for :class:`~zerogr_core.Decoder`.

    Parameters
    ----------
    model : StepModel
        Already prefilled (its batch is the decode's batch).
    dtype : torch.dtype, optional
        Dtype of the returned hidden states (default: the model's).

    Notes
    -----
    At step l ≥ 1 the tracker derives ``tokens = prefixes[..., -1]`` and the parents from
    the prefixes of step l-1 (:func:`parents_from_prefixes`), then calls
    ``model.step(l, tokens, parents)``. Step 0 restarts the decode, so the same tracker
    serves repeated decodes (the engine's planner runs several).
    """

    def __init__(self, model: StepModel, dtype: torch.dtype | None = None):
        self.model, self.dtype = model, dtype
        self._prev = None

    @torch.no_grad()
    def __call__(self, step: int, prefixes: torch.Tensor) -> torch.Tensor:
        batch, beams = prefixes.shape[:2]
        if step == 0:
            hidden = self.model.step(0, None, None)
        else:
            if self._prev is None or self._prev.shape[2] != step - 1 or self._prev.shape[0] != batch:
                raise ZeroGRError(f"step model: step {step} was called without step {step - 1} before it")
            parents = parents_from_prefixes(self._prev, prefixes)
            hidden = self.model.step(step, prefixes[..., -1], parents)
        self._prev = prefixes.clone()
        hidden = hidden.reshape(batch, beams, -1)
        return hidden if self.dtype is None else hidden.to(self.dtype)


class StepDecoder:
    """A step model and :class:`~zerogr_core.Decoder` kept together across batches.

    Parameters
    ----------
    step_model : StepModel
    index : StepIndex
        The catalog's index, on the model's device.
    heads : list of torch.Tensor (|V_l|, H), or torch.Tensor (rows, H)
        The model's output projection, as :class:`~zerogr_core.Decoder` takes it.
    beam_width : int
    order : {"filter-first", "score-first", "unconstrained"}
    band_offsets : sequence of int, optional
        First head row of each level for a shared head.

    prefill : {"auto", "inside", "outside"}
        Where the model's prefill runs (:data:`PREFILLS`); ``inside`` needs a model with
        ``stage`` (:class:`~zerogr_core.models.t5.T5StepModel`).

    Raises
    ------
    ZeroGRError
        Bad arguments (:class:`~zerogr_core.Decoder`'s, ``prefill``), or a step model whose
        ``token_offsets`` differ from the shared head's bands (:func:`check_band_offsets`).

    Notes
    -----
    On a CUDA index, filtering first runs in the GPU engine: the model's steps are
    captured with the decode in one CUDA graph when the step model declares
    ``graph_safe`` (static buffers only), and run eagerly otherwise. The graph replays for
    later batches of the same input shape; a new shape is captured again.

    Thread-safe: the step model holds one batch, so concurrent :meth:`decode` calls run one at a
    time (each prefill with the decode that reads it).
    """

    def __init__(self, step_model: StepModel, index, heads, *, beam_width: int, order: str = "filter-first",
                 band_offsets=None, prefill: str = "auto"):
        from ..decode.decoder import Decoder

        if prefill not in PREFILLS:
            raise ZeroGRError(f"prefill must be one of {', '.join(PREFILLS)}, got {prefill!r}")
        self.step_model = step_model
        self._lock = threading.RLock()
        engine = "reference"
        if order == "filter-first" and index.device.type == "cuda":
            engine = "auto" if getattr(step_model, "graph_safe", False) else "eager"
        self.decoder = Decoder(index, heads, beam_width, order=order, band_offsets=band_offsets, engine=engine)
        if self.decoder.heads.shared is not None:
            # the bands resolved (cumulative codebook sizes when left out): what the heads score
            check_band_offsets(step_model, self.decoder.heads.band_offsets, "band_offsets" if band_offsets is not None
                               else "band_offsets (left out: cumulative codebook sizes)")
        gpu = self.decoder.gpu_engine
        self.stage = prefill == "inside" or (prefill == "auto" and gpu is not None and gpu.use_graph)
        if self.stage and not can_stage(step_model):
            if prefill == "inside":
                raise ZeroGRError(f"prefill='inside': {type(step_model).__name__} has no stage() (capturable "
                                  "prefill); use prefill='outside'")
            self.stage = False

    @property
    def prefill_in_graph(self) -> bool:
        """Whether the last decode ran the prefill inside the engine's CUDA graph."""
        gpu = self.decoder.gpu_engine
        return self.stage and gpu is not None and gpu.use_graph and gpu.graph_error is None

    @torch.no_grad()
    def decode(self, history: torch.Tensor, attention_mask: torch.Tensor | None = None, *, lists=None):
        """Prefill ``history`` and decode; returns a :class:`~zerogr_core.DecodeResult`.

        ``lists`` (a :class:`~zerogr_core.decode.constraints.RequestLists`, e.g. from
        ``self.decoder.request_lists``) restricts each request to its allowed items and
        away from its denied ones.

        With ``stage`` the inputs go to the model's static buffers and its encoder runs at
        step 0, inside the engine's graph (a failed capture is recorded in the engine's
        ``graph_error`` and the same decode runs eagerly); otherwise the prefill runs
        eagerly before the decode.
        """
        if not isinstance(history, torch.Tensor):
            raise ZeroGRError(f"history: expected a torch.Tensor, got {type(history).__name__}")
        # the step model holds one batch: another thread's prefill must wait for this decode to read it
        with self._lock:
            load_requests(self.step_model, history, attention_mask, beam_width=self.decoder.beam_width,
                          stage=self.stage)
            result = self.decoder.decode(self.step_model, int(history.shape[0]), lists=lists)
            check_staged(self.step_model)
            return result


#: Where a :class:`StepDecoder` runs the prefill: ``inside`` the decode (captured with it),
#: ``outside`` before it, or ``auto`` (inside when the engine captures graphs and the model can stage).
PREFILLS = ("auto", "inside", "outside")


def can_stage(step_model) -> bool:
    """Whether ``step_model`` offers a capturable prefill (``stage``, run by its step 0)."""
    return callable(getattr(step_model, "stage", None))


def check_staged(step_model) -> None:
    """After a decode's launch: raise the one-line error of staged ids outside the model's vocabulary,
    where the model deferred that check past the launch (``check_staged``, :class:`StagedRange`); the
    caller's results of that decode are then dropped."""
    check = getattr(step_model, "check_staged", None)
    if check is not None:
        check()


def load_requests(step_model, history: torch.Tensor, attention_mask: torch.Tensor | None, *, beam_width: int,
                  stage: bool) -> bool:
    """Give a step model its requests: ``stage`` them (device work at step 0) or ``prefill`` now.

    Returns
    -------
    bool
        Whether they were staged (``stage`` asked for and the model offers it).
    """
    if stage and can_stage(step_model):
        step_model.stage(history, attention_mask, beam_width=beam_width)
        return True
    step_model.prefill(history, attention_mask, beam_width=beam_width)
    return False
