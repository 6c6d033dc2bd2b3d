"""The filtering-first GPU engine: static buffers, a per-step plan, one CUDA graph.

For a serving shape (batch, beam width, dtype, hidden size) the engine

1. loads the shape's plan from the plan store (:mod:`zerogr_core.decode.plan_store`), or
   else runs the decode once eagerly to see real beam states at every step, times the
   options per step that the cost model keeps (:mod:`zerogr_core.decode.planner`), fixes
   the fastest and stores the plan,
2. compiles the plan's Triton variants together (:mod:`zerogr_core.decode.precompile`),
   then captures all L steps — model call included — in one CUDA graph whose replays
   serve later calls of that shape. A step model that computes only the beams the last step
   reads (``partial_last_step``, :mod:`zerogr_core.decode.loop`) gets two: the steps before the
   last, then, once the host has read how many beams are wanted, the last step's graph for that
   many rows (:class:`PartialLastStep`).

The steps run in the one beam loop (:class:`~zerogr_core.decode.loop.BeamLoop`). Its model
is a ``hidden_fn(step, prefixes)`` or a prefilled step model
(:class:`zerogr_core.models.StepModel`): the caller prefills outside the graph (or stages
the requests, and the model's step 0 runs the prefill inside it), and the
model's ``step(l, tokens, parents)`` (KV-cache reorder by parent included) is captured with
the decode, reading the tokens and parents the previous step wrote into its static buffers.

A step is a handful of launches: filter (+ GEMM on full steps), selective projection, and
the top-k kernels, which also normalise (fused log-softmax) and write the next step's
prefixes in their gather. On a CPU the same code runs
eagerly (reference ops, or the Triton interpreter in tests).
"""
from __future__ import annotations

import dataclasses
import threading

import torch

from zerogr_kernels import (TOPK_PATHS, BeamGroups, FilterOut, TopkOut, filter_slots, full_proj, group_beams,
                            log_softmax_slots, selective_proj, shared_selective_proj, topk_gather)
from zerogr_kernels._common import pdl_disabled

from ..errors import ZeroGRError
from ..index.layout import StepIndex, StepMapping
from ..timing import capture, warm_up
from .heads import Heads
from .id_lists import AllowIds
from .list_buffers import attach_lists, capacity_for, listed_from, load_lists
from .options import MODES, PLANNED_TOPK, SHARED_GROUP, StepOption, step_options
from .plan_store import catalog_fingerprint, device_fingerprint, resolve_store, use_project_triton_cache
from .planner import DEFAULT_COST_MODEL, Plan, PlanShape, cost_model_summary, make_plan
from .last_step import PartialLastStep
from .loop import BeamLoop
from .ops import no_timer
from .precompile import precompile
from .search import DecodeModel, DecodeResult

CONSTRAINED_PDL_MAX_BATCH = 4
"""Largest batch whose constrained graphs launch with PDL: on the H200 (batch 8 and 32, deny 100,
``runs/results/constraints/pdl-constrained/``) a constrained call at batch 8 took 308 µs without
it against 374 with it, the same at batch 32; batch 1 gains from it."""

__all__ = ["GpuEngine", "ShapeState", "StepRunner"]


class StepRunner:
    """One step of one shape, with its static buffers.

    Parameters
    ----------
    mapping : StepMapping
    sparse : tuple of (tokens, offsets)
        Sparse view of the mapping (derived once for dense steps).
    weight : torch.Tensor, shape (rows, H)
        The head that holds this level's band (the shared head, or the level's head).
    band_start : int
    option : StepOption
    batch, beams_in, beam_width : int
    level : int
        The step (what a timer is told).

    Notes
    -----
    A :class:`~zerogr_core.decode.loop.Step` of the beam loop: its selection writes the next
    prefixes, and its ``top`` buffers (tokens, parents) are what a step model reads next.
    """

    def __init__(self, mapping: StepMapping, sparse, weight: torch.Tensor, band_start: int,
                 option: StepOption, batch: int, beams_in: int, beam_width: int, level: int = 0):
        self.mapping, self.option, self.level = mapping, option, level
        self.weight, self.band_start = weight, band_start
        self.batch, self.beam_width = batch, beam_width
        dense = option.mode == "dense+full"
        self.args = {"table": mapping.table} if dense else {"tokens": sparse[0], "offsets": sparse[1]}
        self.K = mapping.codebook if dense else mapping.max_segment
        n = batch * beams_in
        dev = weight.device
        self.filter_out = FilterOut.empty(n, self.K, dev)
        # float32 whatever the head's dtype: every option yields the same logits
        self.logits = (torch.empty(n, mapping.codebook, dtype=torch.float32, device=dev)
                       if option.projection == "full" else None)
        # sparse+shared: the beams sorted by state
        self.groups = (BeamGroups.empty(n, sparse[1].numel() - 1, dev)
                       if option.mode == "sparse+shared" else None)
        #: Set by a constrained ShapeState: the step's lists, which the filter applies as it
        #: fills the slots (:class:`~zerogr_kernels.constraints.SlotLists`); an optional
        #: callable() run before the filter (the first step waits there for the call's lists,
        #: resolved beside it); and whether the lists are catalog-normalised, the selection then dropping
        #: the slots the filter deferred after counting them in the normaliser.
        self.slot_lists = None
        self.prepare_lists = None
        self.deferred = False
        self.top = TopkOut.empty(batch, beam_width, dev)

    def wanted_rows(self, states: torch.Tensor) -> torch.Tensor:
        """The beams whose hidden states this step reads: (n,) bool, those in a state with more than
        one valid token (:mod:`zerogr_core.decode.loop`)."""
        return self.mapping.branches(states)

    def project(self, states: torch.Tensor, hidden: torch.Tensor, timer=no_timer) -> FilterOut:
        """Filter + projection: slot logits of every beam (raw, not normalised)."""
        if self.logits is not None:
            with timer(self.level, "project"):
                full_proj(hidden, self.weight, self.band_start, self.mapping.codebook, out=self.logits)
            with timer(self.level, "filter"):
                return self.filter(states, self.logits)
        with timer(self.level, "filter"):
            slots = self.filter(states)
        with timer(self.level, "project"):
            self.selective(states, hidden, slots)
        return slots

    def filter(self, states: torch.Tensor, logits: torch.Tensor | None = None) -> FilterOut:
        """The step's slots (with ``logits``, copied from the band GEMM's output), under its lists."""
        if self.prepare_lists is not None:
            self.prepare_lists()
        return filter_slots(states, self.K, **self.args, logits=logits, out=self.filter_out,
                            constraint=self.slot_lists)

    def selective(self, states: torch.Tensor, hidden: torch.Tensor, slots: FilterOut) -> torch.Tensor:
        """The selective projection of filtered ``slots`` (per beam, or shared by the beams of a state)."""
        if self.groups is None:
            return selective_proj(hidden, self.weight, slots.slot_tokens, slots.tasks, slots.slot_logits,
                                  band_start=self.band_start)
        group_beams(states, self.groups.ends.numel() - 1, out=self.groups)
        return shared_selective_proj(hidden, self.weight, slots.slot_tokens, slots.slot_logits, self.groups,
                                     band_start=self.band_start, group_size=SHARED_GROUP)

    def select(self, slots: FilterOut, scores: torch.Tensor, prefixes=None) -> TopkOut:
        """Fused log-softmax over valid slots + beam score, top-M and gather (and, with
        ``prefixes = (prev, next)``, the next step's prefixes)."""
        return topk_gather(slots.slot_logits, slots.slot_tokens, slots.slot_succ, self.batch, self.beam_width,
                           beam_scores=scores, path=self.option.topk, out=self.top, prefixes=prefixes,
                           deferred=self.deferred)

    def __call__(self, states: torch.Tensor, hidden: torch.Tensor, scores: torch.Tensor,
                 prefixes=None, timer=no_timer) -> TopkOut:
        slots = self.project(states, hidden, timer)
        with timer(self.level, "select"):
            return self.select(slots, scores, prefixes)

    def stages(self, states: torch.Tensor, hidden: torch.Tensor, scores: torch.Tensor) -> dict:
        """The step cut into separately callable parts, for per-stage timing.

        Runs :meth:`project` once, so that every part finds its inputs in place; the filter parts
        apply the runner's lists, as the decode does. Keys:
        ``filtering`` (slots alone), ``projection`` (the band GEMM on full options, the
        selective projection of the filtered slots otherwise), ``filtering+projection``,
        ``normalisation`` (unfused log-softmax over the valid slots, into a scratch buffer),
        ``selection+gather`` (top-M of the normalised slots, into scratch buffers), ``fused
        step`` (the step as the decode runs it) and, on full options, ``filter copy`` (the
        filter copying the valid logits out of the GEMM's output).

        Returns
        -------
        dict of str to callable
            Each takes no argument and writes the runner's static buffers or the scratch ones.
        """
        slots = self.project(states, hidden)
        norm = torch.empty_like(slots.slot_logits)
        top = tuple(torch.empty_like(t) for t in self.top)
        fo, opt = self.filter_out, self.option
        parts = {
            "filtering+projection": lambda: self.project(states, hidden),
            "normalisation": lambda: log_softmax_slots(slots.slot_logits, scores, out=norm),
            "selection+gather": lambda: topk_gather(norm, slots.slot_tokens, slots.slot_succ, self.batch,
                                                    self.beam_width, path=opt.topk, out=top, deferred=self.deferred),
            "fused step": lambda: self(states, hidden, scores),
            "filtering": lambda: self.filter(states),
        }
        if self.logits is not None:
            parts["projection"] = lambda: full_proj(hidden, self.weight, self.band_start, self.mapping.codebook,
                                                    out=self.logits)
            parts["filter copy"] = lambda: self.filter(states, self.logits)
        else:
            parts["projection"] = lambda: self.selective(states, hidden, fo)
        return parts


class ShapeState:
    """Static buffers, runners and beam loop of one (batch, beam, dtype, H) shape."""

    def __init__(self, engine: "GpuEngine", batch: int, options: list[StepOption], capacity: int = 0,
                 normalise: str = "request", ids=None, skip: int = 0):
        self.batch = batch
        index = engine.index
        self.runners = [engine.step_runner(level, option, batch) for level, option in enumerate(options)]
        self.capacity = capacity
        if capacity:
            self.lists = attach_lists(self.runners, index, batch, capacity, normalise, ids, skip)
        self.loop = BeamLoop(self.runners, batch, engine.beam_width, engine.heads.hidden_size, engine.heads.dtype,
                             index.device)
        self.prefixes = self.loop.prefixes
        self.graph = None
        # what the graph was captured with: the model, and its static key (a step model's
        # prefill of another shape allocates new buffers, which the graph does not read)
        self.graph_fn = None
        self.graph_key = None
        self.outputs = None
        # why the capture failed: the shape then runs eagerly and is never captured again
        self.graph_error = None
        # with a model that computes the last step's wanted beams only: that step's graphs
        self.partial = None

    def run(self, model, record=None, timer=no_timer):
        """All L steps (:meth:`BeamLoop.run`); returns (tokens, scores, rows) views of static buffers.
        A constrained shape first resolves the call's lists beside the first step
        (:meth:`~zerogr_core.decode.list_buffers.ListBuffers.begin`)."""
        if self.capacity:
            self.lists.begin()
        return self.loop.run(model, record, timer)

    def begin(self, model) -> None:
        """Every step but the last (:meth:`BeamLoop.begin`), the call's lists resolved first."""
        if self.capacity:
            self.lists.begin()
        self.loop.begin(model)

    def launched(self) -> None:
        """After a decode of this shape was launched (its list buffers then guard their pinned block)."""
        if self.capacity:
            self.lists.launched()


class GpuEngine:
    """Filtering-first decoding with a warm-up plan and whole-decode CUDA graph replay.

    Parameters
    ----------
    index : StepIndex
    heads : Heads
    beam_width : int
    plan_override : sequence, optional
        Per step: a :class:`StepOption`, its text form (``"sparse+selective/small"``), or
        a projection name (``"full"`` / ``"selective"``; the engine picks the rest).
    use_graph : bool
        Capture and replay a CUDA graph (CUDA only); ``False`` runs eagerly.
    topk_paths : sequence of str
        Top-k paths the planner times (default :data:`PLANNED_TOPK`; any of
        ``zerogr_kernels.TOPK_PATHS``).
    plan_store : "default", PlanStore, path, or False
        Where plans persist (:mod:`zerogr_core.decode.plan_store`): a known shape loads its
        plan and times nothing. ``False`` plans in memory only.
    cost_model : CostModel or None
        Skips options predicted far slower than the best before timing
        (:class:`~zerogr_core.decode.planner.CostModel`); ``None`` times every option.
    progress : callable(fraction, text), optional
        Told what the warm-up is doing while it plans and compiles (settable later).
    """

    def __init__(self, index: StepIndex, heads: Heads, beam_width: int, plan_override=None,
                 use_graph: bool = True, topk_paths=PLANNED_TOPK, plan_store="default",
                 cost_model=DEFAULT_COST_MODEL, progress=None):
        self.topk_paths = tuple(topk_paths)
        if not self.topk_paths or any(p not in TOPK_PATHS for p in self.topk_paths):
            raise ZeroGRError(f"topk paths must be a non-empty subset of {TOPK_PATHS}, got {list(topk_paths)}")
        self.index, self.heads, self.beam_width = index, heads, beam_width
        self.use_graph = use_graph and index.device.type == "cuda"
        self.plan_override = None if plan_override is None else list(plan_override)
        if self.plan_override is not None and len(self.plan_override) != index.n_levels:
            raise ZeroGRError(f"plan override lists {len(self.plan_override)} steps, the index has {index.n_levels}")
        self._sparse = {}
        self.plan_store = resolve_store(plan_store)
        self.cost_model = cost_model
        self.progress = progress
        if index.device.type == "cuda":
            use_project_triton_cache()
        self.plans = {}
        self._shapes = {}
        self._keys = {}
        self.graph_error = None
        # the static buffers of a shape serve one decode at a time: concurrent callers queue here
        self._lock = threading.RLock()

    @property
    def lock(self) -> threading.RLock:
        """The lock a decode holds (re-entrant): GPU work issued from another thread, such
        as building per-call lists on the device, holds it too, so it never runs while
        this engine captures a graph."""
        return self._lock

    def sparse_view(self, level: int):
        if level not in self._sparse:
            self._sparse[level] = self.index.steps[level].sparse_view()
        return self._sparse[level]

    def step_runner(self, level: int, option: StepOption, batch: int) -> StepRunner:
        """A runner of step ``level`` with ``option`` for ``batch`` requests (its own buffers)."""
        weight, band_start = self.heads.band(level)
        return StepRunner(self.index.steps[level], self.sparse_view(level), weight, band_start,
                          option, batch, 1 if level == 0 else self.beam_width, self.beam_width, level)

    def record_inputs(self, model: DecodeModel, batch: int, options, compile_also=()) -> list[tuple]:
        """Real (states, hidden, scores) of every step, from one eager decode with ``options``.

        Its kernels compile together with those of the calls ``compile_also`` first
        (:func:`~zerogr_core.decode.precompile.precompile`).
        """
        record: list[tuple] = []
        probe = ShapeState(self, batch, options)
        precompile(self._shape_calls(probe) + list(compile_also), self.index.device)
        probe.run(model, record=record)
        return record

    def key(self, batch: int) -> tuple:
        key = self._keys.get(batch)
        if key is None:  # built once per batch size: this is host time every call waits for
            key = self._keys[batch] = self.heads.shape_key(batch, self.beam_width)
        return key

    def options_for(self, batch: int) -> list[list[StepOption]]:
        """Candidate options per step for ``batch`` (the override narrows them)."""
        out = []
        for level, mapping in enumerate(self.index.steps):
            beams_in = 1 if level == 0 else self.beam_width
            opts = step_options(mapping, beams_in, self.beam_width, self.topk_paths, batch)
            if self.plan_override is not None:
                want = self.plan_override[level]
                if want == "selective":  # either selective kernel; the planner picks
                    opts = [o for o in opts if o.projection == "selective"]
                elif want == "full":
                    mode = "dense+full" if mapping.kind == "dense" else "sparse+full"
                    opts = [o for o in opts if o.mode == mode]
                else:
                    want = want if isinstance(want, StepOption) else StepOption.parse(want)
                    every = step_options(mapping, beams_in, self.beam_width, TOPK_PATHS, batch, planned=False)
                    if want not in every:
                        raise ZeroGRError(f"step {level + 1}: option {want.label} is not available "
                                          f"(choose from {', '.join(o.label for o in every)})")
                    opts = [want]
            out.append(opts)
        return out

    def plan_key(self, batch: int) -> dict:
        """What a stored plan of ``batch`` must match: machine, catalog statistics, shape, planner
        (its modes too, so a plan stored before a mode existed is timed again)."""
        batch_, beam, dtype, hidden = self.key(batch)
        override = None if self.plan_override is None else [
            o.label if isinstance(o, StepOption) else str(o) for o in self.plan_override]
        return dict(machine=device_fingerprint(self.index.device), catalog=catalog_fingerprint(self.index, self.heads),
                    shape=dict(batch=batch_, beam=beam, dtype=dtype, hidden=hidden),
                    planner=dict(modes=list(MODES), topk_paths=list(self.topk_paths), override=override,
                                 cost_model=cost_model_summary(self.cost_model)))

    def plan(self, model: DecodeModel, batch: int):
        """The plan for ``batch``: from memory, else from the plan store, else timed (and stored)."""
        key = self.key(batch)
        if key not in self.plans:
            self.plans[key] = self._stored_plan(batch) or self._timed_plan(model, batch)
        return self.plans[key]

    def _stored_plan(self, batch: int):
        if self.plan_store is None:
            return None
        data = self.plan_store.load(self.plan_key(batch))
        if data is None:
            return None
        try:
            plan = Plan.from_dict(data, source="store")
            allowed = self.options_for(batch)
            if len(plan.steps) != len(allowed) or any(c.option not in a for c, a in zip(plan.steps, allowed)):
                raise ValueError("its options are not available for this shape")
        except (ZeroGRError, ValueError, KeyError, TypeError) as exc:
            import warnings

            warnings.warn(f"plan store: ignoring {self.plan_store.path(self.plan_key(batch))}: {exc}", stacklevel=3)
            return None
        return Plan(self.key(batch), plan.steps, str(self.index.device), "store")

    def plan_shape(self, model: DecodeModel, batch: int) -> PlanShape:
        """What the planner needs to plan ``batch`` requests of ``model`` (and nothing else of the engine)."""
        beams = [batch * (1 if level == 0 else self.beam_width) for level in range(len(self.index.steps))]
        return PlanShape(
            key=self.key(batch), device=self.index.device, options=self.options_for(batch),
            work=list(zip(self.index.steps, beams)), hidden_size=self.heads.hidden_size,
            dtype=str(self.heads.dtype).replace("torch.", ""),
            step_runner=lambda level, option: self.step_runner(level, option, batch),
            zero_inputs=lambda level: (*self.zero_inputs(level, batch), self.zero_prefixes(level, batch)),
            record_inputs=lambda options, compile_also=(): self.record_inputs(model, batch, options, compile_also))

    def _timed_plan(self, model: DecodeModel, batch: int):
        plan = make_plan(self.plan_shape(model, batch), cost_model=self.cost_model, progress=self.progress)
        if self.plan_store is not None and plan.source == "timed":
            self.plan_store.save(self.plan_key(batch), plan.to_dict())
        return plan

    def zero_inputs(self, level: int, batch: int) -> tuple:
        """Zero (states, hidden, scores) of step ``level``'s shapes (for compiling ahead of real inputs)."""
        n, dev = batch * (1 if level == 0 else self.beam_width), self.index.device
        return (torch.zeros(n, dtype=torch.int64, device=dev),
                torch.zeros(n, self.heads.hidden_size, dtype=self.heads.dtype, device=dev),
                torch.zeros(n, dtype=torch.float32, device=dev))

    def zero_prefixes(self, level: int, batch: int) -> tuple:
        """Zero (previous, next) prefix buffers of step ``level``, as a decode passes them to its runner."""
        m, dev = self.beam_width, self.index.device
        return (torch.zeros(batch, 1 if level == 0 else m, level, dtype=torch.int64, device=dev),
                torch.zeros(batch, m, level + 1, dtype=torch.int64, device=dev))

    def _shape_calls(self, shape: "ShapeState") -> list:
        """Calls of every runner of ``shape`` on zero inputs, prefixes included (as its decode calls them)."""
        return [lambda r=r, level=level: r(*self.zero_inputs(level, shape.batch),
                                          (shape.prefixes[level], shape.prefixes[level + 1]))
                for level, r in enumerate(shape.runners)]

    def shape_state(self, model: DecodeModel, batch: int) -> ShapeState:
        key = self.key(batch)
        if key not in self._shapes:
            plan = self.plan(model, batch)
            shape = ShapeState(self, batch, [s.option for s in plan.steps])
            if self.progress is not None:
                self.progress(1.0, "compiling the plan's kernels")
            precompile(self._shape_calls(shape), self.index.device)
            self._shapes[key] = shape
        return self._shapes[key]

    def release(self) -> None:
        """Drop plans, static buffers and graphs (frees their GPU memory)."""
        self._shapes.clear()
        self.plans.clear()
        self._sparse.clear()

    def constrained_shape(self, model: DecodeModel, batch: int, lists) -> ShapeState:
        """The shape with static list buffers that hold ``lists`` (grown and re-captured
        when a call lists more rows than its capacity), with ``lists`` copied in. Each
        normalisation has its own shape, so request-normalised lists never run the
        catalog-normalised pass. Deny ids (:class:`~zerogr_core.decode.id_lists.DenyIds`),
        which the shape resolves on the device, have up to four shapes per normalisation: ids the
        first kernel reads in place from pinned memory, or ids copied first (ids already on the
        device, or lists past ``IN_PLACE_WIDTH``, which is ``MAX_IDS`` now:
        :attr:`~zerogr_core.decode.id_lists.DenyIds.copied`), each at
        widths sorted in one program's registers or wider ones sorted by torch
        (:attr:`~zerogr_core.decode.id_lists.DenyIds.wide`); each is grown to the widest call so
        far and serves every narrower one of its class, so GPU memory stays bounded whatever the
        list sizes. Allow ids (:class:`~zerogr_core.decode.id_lists.AllowIds`)
        have one shape per normalisation, its id buffer grown by powers of two, whose first kernel
        turns them into bitmaps of alive successors. A global deny segment alone (a registered deny
        set every request names, a catalog version's deletions) that cannot empty any prefix of the
        first steps (:func:`~zerogr_core.decode.list_buffers.listed_from`) takes a shape whose
        filters there run without lists. A catalog version's deletions take the general shape of the
        normalisation instead when no such shape holds them yet but the general one does (a warmed-up
        server never captures while serving); a registered deny set (``lists.standing``: the same rows
        call after call) always takes its own."""
        width = getattr(lists, "width", 0)
        bitmaps = isinstance(lists, AllowIds)
        kind = (("ids", lists.copied, lists.wide),) if width else (("allow-ids",) if bitmaps else ())
        key = self.key(batch) + ("lists", lists.normalise) + kind
        by_ids = bool(width) or bitmaps
        skip = 0 if by_ids else listed_from(self.index, lists)
        if skip:
            held = self._shapes.get(key + (("skip", skip),))
            general = self._shapes.get(key)
            if lists.standing or (held is not None and held.capacity >= lists.total_rows) or general is None \
                    or general.capacity < lists.total_rows:
                key += (("skip", skip),)
            else:
                skip = 0
        shape = self._shapes.get(key)
        if shape is None or shape.capacity < lists.total_rows or (by_ids and shape.lists.lookup is not lists.lookup):
            plan = self.plan(model, batch)
            capacity = lists.total_rows if width else capacity_for(lists.total_rows)
            shape = ShapeState(self, batch, [s.option for s in plan.steps], capacity, lists.normalise,
                               lists if by_ids else None, skip)
            self._shapes[key] = shape
        load_lists(shape.lists, lists)
        return shape

    def decode(self, model: DecodeModel, batch_size: int, lists=None) -> DecodeResult:
        """Decode ``batch_size`` requests; thread-safe: one decode at a time per engine (its
        static buffers and graphs serve one call), concurrent callers wait on a lock.

        Parameters
        ----------
        model : callable(step, prefixes) -> (batch, beams, H), or StepModel
            A step model must already hold the batch (``prefill``); its steps run inside
            the captured graph, which replays as long as its static buffers stay the same.
        batch_size : int
        lists : RequestLists, optional

        Returns
        -------
        DecodeResult
        """
        with self._lock:
            return self._decode(model, batch_size, lists)

    def _decode(self, model: DecodeModel, batch_size: int, lists=None) -> DecodeResult:
        if batch_size < 1:
            raise ZeroGRError(f"batch_size must be ≥ 1, got {batch_size}")
        # a constrained call never builds (or holds the memory of) the list-free shape
        shape = self.shape_state(model, batch_size) if lists is None else \
            self.constrained_shape(model, batch_size, lists)
        if self.use_graph and shape.graph_error is None:
            key = getattr(model, "_static_key", None)
            if shape.graph is None or shape.graph_fn is not model or shape.graph_key != key:
                self._capture(shape, model, batch_size)
            if shape.graph is not None:
                if shape.partial is not None:
                    tokens, scores, rows = shape.partial.replay()
                else:
                    shape.graph.replay()
                    tokens, scores, rows = shape.outputs
                shape.launched()
                return DecodeResult(tokens.clone(), scores.clone(), rows.clone())
        tokens, scores, rows = shape.run(model)
        shape.launched()
        return DecodeResult(tokens.clone(), scores.clone(), rows.clone())

    def _warm_up(self, shape: ShapeState, model: DecodeModel) -> None:
        """Two eager decodes on a side stream: compiles every Triton variant before capture."""
        warm_up(lambda: shape.run(model), 2)

    def _record_graph(self, shape: ShapeState, model: DecodeModel):
        """Capture all steps in one CUDA graph; returns ``(graph, outputs)``. With a model that
        computes the last step's wanted beams only, ``(first graph, PartialLastStep)``."""
        if shape.loop.skips_rows(model):
            partial = PartialLastStep(shape, model, _no_pdl(shape))
            return partial.first, partial
        return capture(lambda: shape.run(model), warmup=0)

    def _capture(self, shape: ShapeState, model: DecodeModel, batch: int) -> None:
        """Warm up and capture; on failure record why in the shape's plan and fall back to
        eager decoding for this shape for good (no warm-up or capture is tried again)."""
        try:
            with pdl_disabled(_no_pdl(shape)):
                self._warm_up(shape, model)
                graph, outputs = self._record_graph(shape, model)
        except ZeroGRError:
            # the caller's mistake (a hidden_fn of the wrong shape or device), not a model that cannot
            # be captured: the shape stays capturable, and the next call with a sound model captures it
            shape.graph, shape.graph_fn, shape.partial = None, None, None
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            raise
        except Exception as exc:  # a model that syncs with the host cannot be captured
            reason = f"{type(exc).__name__}: {' '.join(str(exc).split())}".rstrip(": ")
            self.graph_error = shape.graph_error = reason
            key = self.key(batch)
            if key in self.plans:
                self.plans[key] = dataclasses.replace(self.plans[key], graph_error=reason)
            shape.graph, shape.graph_fn, shape.partial = None, None, None
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            return
        shape.partial = outputs if isinstance(outputs, PartialLastStep) else None
        shape.graph, shape.graph_fn, shape.outputs = graph, model, None if shape.partial else outputs
        shape.graph_key = getattr(model, "_static_key", None)


def _no_pdl(shape: ShapeState) -> bool:
    """Whether the shape's graphs launch without PDL (:data:`CONSTRAINED_PDL_MAX_BATCH`)."""
    return shape.capacity > 0 and shape.batch > CONSTRAINED_PDL_MAX_BATCH
