"""The decoders the benchmark times, all on the same catalog, heads and hidden states.

``zerogr``
    The filtering-first GPU engine (:class:`~zerogr_core.decode.engine.GpuEngine`): warm-up
    plan per shape, then the whole decode captured in one CUDA graph.
``static``
    Scoring first over the STATIC-style index, as published: a GEMM over the whole head
    (the shared head, or the level's head), log-softmax over all of it, then the dense
    V^d validity tables (first d steps) or the CSR rows (later steps) keep the valid
    tokens; top-M per request.
``static-adapted``
    The same mechanics, but the softmax runs over the valid tokens only (the paper's
    adapted variant, whose beams match filtering first).
``unconstrained``
    GEMM over the whole head, log-softmax, top-M over the level's band; no mask.
``cpu-trie``
    Scoring first whose valid tokens come from a host-side trie each step: the beams'
    states go to the host, the lookup runs there, the slots come back (not capturable).
``naive-selective``
    Filtering first whose projection packs the candidates through a prefix sum and a
    temporary weight matrix (:func:`zerogr_kernels.naive_selective_proj`; syncs with the host,
    so it runs eagerly).

Every method decodes through the one beam loop (:class:`~zerogr_core.decode.loop.BeamLoop`):
the engine's steps, or a baseline's step function as a
:class:`~zerogr_core.decode.loop.PrefixStep`; the same selection kernel where the
candidates are slot rows, ``torch.topk`` where they are whole-vocabulary rows. The
baselines extend their beams' token prefixes with separate PyTorch ops
(:func:`zerogr_kernels.extend_prefixes`, a few µs a step); zerogr writes them in its
selection kernel's gather. Hidden states come from a :class:`ReplayModel`: fixed static
tensors per step, refilled from one of several pre-drawn sets between timed runs.
"""
from __future__ import annotations

import torch

from zerogr_kernels import TopkOut, filter_slots, full_proj, log_softmax_slots, naive_selective_proj, topk_gather

from ..decode.engine import GpuEngine
from ..decode.heads import Heads
from ..decode.loop import BeamLoop, PrefixStep
from ..index.host_trie import HostTrie
from ..index.layout import StepIndex
from ..index.static_style import StaticIndex

METHODS = ("zerogr", "static", "static-adapted", "unconstrained", "cpu-trie", "naive-selective")
#: Methods whose decode has no host synchronisation (so it can be captured in a CUDA graph).
CAPTURABLE = {"zerogr": True, "static": True, "static-adapted": True, "unconstrained": True,
              "cpu-trie": False, "naive-selective": False}
#: Methods whose beams must be catalog items (all but unconstrained).
CONSTRAINED = {m: m != "unconstrained" for m in METHODS}
NEG_INF = float("-inf")


class ReplayModel:
    """A ``hidden_fn`` that returns fixed static hidden tensors, one per step.

    Parameters
    ----------
    sets : list of list of torch.Tensor
        ``sets[i][l]``: hidden states of set i at step l, shape (B_max, beams_l, H), with
        ``beams_0 = 1`` and ``beams_l = M`` afterwards.
    batch : int
        Requests served (the first ``batch`` rows of every set).
    """

    def __init__(self, sets: list[list[torch.Tensor]], batch: int):
        self.sets, self.batch = sets, batch
        self.static = [torch.empty((batch,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device) for t in sets[0]]
        self.load(0)

    def load(self, i: int) -> None:
        """Copy set ``i % n_sets`` into the static tensors (device-side copy, no sync)."""
        for dst, src in zip(self.static, self.sets[i % len(self.sets)]):
            dst.copy_(src[:self.batch])

    def __call__(self, step: int, prefixes: torch.Tensor) -> torch.Tensor:
        return self.static[step]


def _pad_top(scores, parents, tokens, succ, beam_width: int) -> TopkOut:
    """Mask invalid picks (-inf) to padding and pad to ``beam_width`` columns."""
    valid = scores > NEG_INF
    out = (torch.where(valid, scores, NEG_INF), torch.where(valid, parents, -1),
           torch.where(valid, tokens, -1).to(torch.int32), torch.where(valid, succ, -1).to(torch.int64))
    pad = beam_width - scores.shape[1]
    if pad > 0:
        fills = (NEG_INF, -1, -1, -1)
        out = tuple(torch.nn.functional.pad(t, (0, pad), value=f) for t, f in zip(out, fills))
    return TopkOut(*out)


def _topk_rows(cand: torch.Tensor, batch: int, beam_width: int):
    """Top-M over each request's (Mb, W) candidate rows: (values, parent beam, column)."""
    n, width = cand.shape
    mb = n // batch
    k = min(beam_width, mb * width)
    val, idx = torch.topk(cand.view(batch, mb * width), k, dim=1)
    parents = idx // width + torch.arange(batch, device=cand.device)[:, None] * mb
    return val, parents, idx % width


# ---------------------------------------------------------------------------- step functions
class StaticStep:
    """Scoring first over a :class:`StaticIndex` (``normalise="full"``: as published;
    ``"valid"``: softmax over the valid tokens only)."""

    def __init__(self, static: StaticIndex, heads: Heads, batch: int, beam_width: int, normalise: str):
        if tuple(static.band_offsets) != tuple(heads.band_offsets):
            raise ValueError(f"STATIC index band offsets {static.band_offsets} differ from the heads' "
                             f"{heads.band_offsets}")
        self.static, self.heads, self.batch, self.M = static, heads, batch, beam_width
        self.normalise = normalise
        dev = heads.device
        self.cols = [torch.arange(w, device=dev) for w in static.max_row]

    def __call__(self, level, states, hidden, scores) -> TopkOut:
        st = self.static
        weight, _ = self.heads.normaliser(level)
        logits = full_proj(hidden, weight, 0, weight.shape[0], out_dtype=hidden.dtype)
        alive = states >= 0
        if level < st.dense_levels:
            width = min(st.vocab, weight.shape[0])
            if level == 0:
                mask = (st.first_mask if st.dense_levels > 1 else st.dense_mask)[:width][None, :]
                row = None
            else:
                row = states.clamp(min=0)
                mask = st.dense_mask[row, :width] & alive[:, None]
            if self.normalise == "full":
                lp = torch.log_softmax(logits.float(), dim=1)[:, :width]
                cand = torch.where(mask, lp + scores[:, None], NEG_INF)
            else:
                cand = log_softmax_slots(torch.where(mask, logits[:, :width].float(), NEG_INF), scores)
            val, parents, g = _topk_rows(cand, self.batch, self.M)
            if level == 0:
                succ = g if st.dense_levels > 1 else st.dense_states[g].to(torch.int64)
            else:
                succ = st.dense_states[row[parents], g].to(torch.int64)
            return _pad_top(val, parents, g - st.band_offsets[level], succ, self.M)
        j = level - st.dense_levels
        indptr, pairs, cols = st.indptr[j], st.pairs[j], self.cols[j]
        row = states.clamp(min=0)
        start = indptr[row].to(torch.int64)
        length = torch.where(alive, indptr[row + 1].to(torch.int64) - start, 0)
        valid = cols[None, :] < length[:, None]
        got = pairs[torch.where(valid, start[:, None] + cols[None, :], 0)]
        gtok = got[..., 0].to(torch.int64)
        tokens = torch.where(valid, gtok - st.band_offsets[level], -1).to(torch.int32)
        succ = torch.where(valid, got[..., 1].to(torch.int64), -1)
        if self.normalise == "full":
            lp = torch.log_softmax(logits.float(), dim=1)
            slot = torch.where(valid, lp.gather(1, gtok) + scores[:, None], NEG_INF)
            return topk_gather(slot, tokens, succ, self.batch, self.M)
        slot = torch.where(valid, logits.gather(1, gtok).float(), NEG_INF)
        return topk_gather(slot, tokens, succ, self.batch, self.M, beam_scores=scores)


class UnconstrainedStep:
    """GEMM over the whole head, log-softmax, top-M over the level's band; no mask."""

    def __init__(self, heads: Heads, batch: int, beam_width: int):
        self.heads, self.batch, self.M = heads, batch, beam_width

    def __call__(self, level, states, hidden, scores) -> TopkOut:
        weight, band = self.heads.normaliser(level)
        size = self.heads.bands[level].shape[0]
        logits = full_proj(hidden, weight, 0, weight.shape[0], out_dtype=hidden.dtype)
        cand = torch.log_softmax(logits.float(), dim=1).narrow(1, band, size) + scores[:, None]
        val, parents, tok = _topk_rows(cand, self.batch, self.M)
        return _pad_top(val, parents, tok, torch.full_like(tok, -1), self.M)


class CpuTrieStep:
    """Scoring first with the valid slots looked up on the host each step."""

    def __init__(self, trie: HostTrie, heads: Heads, batch: int, beam_width: int):
        self.trie, self.heads, self.batch, self.M = trie, heads, batch, beam_width

    def __call__(self, level, states, hidden, scores) -> TopkOut:
        weight, band = self.heads.normaliser(level)
        lp = torch.log_softmax(full_proj(hidden, weight, 0, weight.shape[0], out_dtype=hidden.dtype).float(), dim=1)
        tokens, succ = self.trie.children(level, states)  # host round trip
        valid = tokens >= 0
        slot = torch.where(valid, lp.gather(1, (tokens.to(torch.int64) + band).clamp(min=0)) + scores[:, None],
                           NEG_INF)
        return topk_gather(slot, tokens.to(torch.int32).contiguous(), succ.contiguous(), self.batch, self.M)


class NaiveSelectiveStep:
    """Filtering first with the packed (prefix-sum) selective projection of the ablation."""

    def __init__(self, engine: GpuEngine, batch: int, beam_width: int):
        self.engine, self.batch, self.M = engine, batch, beam_width
        heads = engine.heads
        self.weights = [heads.band(l) for l in range(engine.index.n_levels)]

    def __call__(self, level, states, hidden, scores) -> TopkOut:
        mapping = self.engine.index.steps[level]
        tokens, offsets = self.engine.sparse_view(level)
        slots = filter_slots(states, mapping.max_segment, tokens=tokens, offsets=offsets)
        weight, band = self.weights[level]
        naive_selective_proj(hidden, weight, slots.slot_tokens, slots.slot_logits, band_start=band)
        return topk_gather(slots.slot_logits, slots.slot_tokens, slots.slot_succ, self.batch, self.M,
                           beam_scores=scores)


# ---------------------------------------------------------------------------- runners
class Runner:
    """One method at one shape: ``eager()`` decodes once; ``graph`` replays it if captured.

    Attributes
    ----------
    name : str
    graph : torch.cuda.CUDAGraph or None
    graph_outputs : tuple or None
        Static (tokens, scores, states) that every replay overwrites.
    graph_error : str or None
        Why the decode was not captured.
    """

    name = ""

    def __init__(self):
        self.graph = None
        self.graph_outputs = None
        self.graph_error = None

    def eager(self):
        raise NotImplementedError

    def capture(self) -> None:
        raise NotImplementedError

    def outputs(self, use_graph: bool):
        """(tokens, scores, states) of one decode, cloned."""
        if use_graph and self.graph is not None:
            self.graph.replay()
            out = self.graph_outputs
        else:
            out = self.eager()
        return tuple(t.clone() for t in out)

    def step_fn(self, level: int):
        """``fn(states, hidden, scores)`` running step ``level`` alone (for per-step timing)."""
        raise NotImplementedError

    def record(self) -> list[tuple]:
        """Real (states, hidden, scores) inputs of every step, from one eager decode."""
        raise NotImplementedError

    def release(self) -> None:
        self.graph = self.graph_outputs = None


class LoopRunner(Runner):
    """A baseline: a step function (``fn(level, states, hidden, scores) -> TopkOut``) in the beam loop."""

    def __init__(self, name: str, step, model: ReplayModel, n_levels: int, batch: int, beam_width: int,
                 heads: Heads, capturable: bool):
        super().__init__()
        self.name, self.step, self.model, self.capturable = name, step, model, capturable
        self.loop = BeamLoop([PrefixStep(step, level) for level in range(n_levels)], batch, beam_width,
                             heads.hidden_size, heads.dtype, heads.device)
        if not capturable:
            self.graph_error = "not capturable: the decode synchronises with the host"

    def eager(self):
        return self.loop.run(self.model)

    def capture(self) -> None:
        from ..timing import capture

        if not self.capturable or self.heads_device().type != "cuda":
            if self.graph_error is None:
                self.graph_error = "CUDA graphs need a CUDA device"
            return
        try:
            self.graph, self.graph_outputs = capture(self.eager)
        except Exception as exc:  # noqa: BLE001 - record and fall back to eager timing
            self.graph, self.graph_outputs = None, None
            self.graph_error = f"capture failed: {type(exc).__name__}: {exc}"
            torch.cuda.synchronize()

    def heads_device(self) -> torch.device:
        return self.loop.states0.device

    def step_fn(self, level: int):
        return lambda states, hidden, scores: self.step(level, states, hidden, scores)

    def record(self) -> list[tuple]:
        rec: list[tuple] = []
        self.loop.run(self.model, record=rec)
        return rec


class ZeroGRRunner(Runner):
    """The GPU engine at one batch size (plan and graph made on :meth:`capture`)."""

    name = "zerogr"

    def __init__(self, engine: GpuEngine, model: ReplayModel, batch: int):
        super().__init__()
        self.engine, self.model, self.batch = engine, model, batch
        self.shape = engine.shape_state(model, batch)  # times the plan at the first call
        self.capturable = True

    @property
    def plan(self):
        return self.engine.plan(self.model, self.batch)

    def eager(self):
        return self.shape.run(self.model)

    def capture(self) -> None:
        if self.engine.index.device.type != "cuda" or not self.engine.use_graph:
            self.graph_error = "CUDA graphs need a CUDA device"
            return
        self.engine.decode(self.model, self.batch)  # warm-up + whole-decode capture
        if self.shape.graph is None:
            self.graph_error = f"capture failed: {self.engine.graph_error}"
        else:
            self.graph, self.graph_outputs = self.shape.graph, self.shape.outputs

    def step_runner(self, level: int):
        """The engine's :class:`~zerogr_core.decode.engine.StepRunner` of step ``level`` (as planned)."""
        return self.shape.runners[level]

    def step_fn(self, level: int):
        runner = self.shape.runners[level]
        return lambda states, hidden, scores: runner(states, hidden, scores)

    def record(self) -> list[tuple]:
        return self.engine.record_inputs(self.model, self.batch, [r.option for r in self.shape.runners])

    def release(self) -> None:
        super().release()
        self.shape = None


def make_runner(name: str, *, engine: GpuEngine, heads: Heads, static: StaticIndex | None,
                trie: HostTrie | None, model: ReplayModel, batch: int, beam_width: int) -> Runner:
    """The runner of method ``name`` for one shape (built but not captured)."""
    n_levels = engine.index.n_levels
    if name == "zerogr":
        return ZeroGRRunner(engine, model, batch)
    if name in ("static", "static-adapted"):
        step = StaticStep(static, heads, batch, beam_width, "full" if name == "static" else "valid")
    elif name == "unconstrained":
        step = UnconstrainedStep(heads, batch, beam_width)
    elif name == "cpu-trie":
        step = CpuTrieStep(trie, heads, batch, beam_width)
    elif name == "naive-selective":
        step = NaiveSelectiveStep(engine, batch, beam_width)
    else:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    return LoopRunner(name, step, model, n_levels, batch, beam_width, heads, CAPTURABLE[name])


def host_trie_from_index(cpu_index: StepIndex) -> HostTrie:
    """A :class:`HostTrie` over an all-sparse CPU index (no second build)."""
    return HostTrie([s.tokens for s in cpu_index.steps], [s.offsets for s in cpu_index.steps],
                    [s.max_segment for s in cpu_index.steps])
