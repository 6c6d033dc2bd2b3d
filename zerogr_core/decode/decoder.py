"""The public decoder: constrained beam search in either order, or unconstrained."""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Sequence

import numpy as np
import torch

from zerogr_kernels._common import interpreting

from ..catalog.catalog import Catalog
from ..errors import ZeroGRError
from ..index.host_trie import HostTrie
from ..index.layout import StepIndex
from .heads import Heads, check_band_offsets
from .loop import is_step_model
from .ops import DISPATCH, REFERENCE, KernelOps, no_timer
from .orders import PROJECTIONS, FilterFirst, ScoreFirst, Unconstrained, resolve_rows
from .reference_plan import default_projection, make_reference_plan, plan_projection, plan_rows
from .registry import ListRegistry
from .search import DecodeModel, DecodeResult, beam_search

ORDERS = ("filter-first", "score-first", "unconstrained")
ENGINES = ("auto", "reference", "graph", "eager")


def _projection_of(option) -> str:
    """The projection ("full"/"selective") of a per-step engine option or projection name."""
    from .options import StepOption

    if isinstance(option, str) and "/" in option:
        option = StepOption.parse(option)
    if isinstance(option, StepOption):
        return option.projection
    return option


class Decoder:
    """Constrained beam search over a step-sliced index.

    Parameters
    ----------
    index : StepIndex
        Built by :func:`zerogr_core.build_index`; its device is where decoding runs.
    heads : list of torch.Tensor (|V_l|, H), or torch.Tensor (rows, H)
        Per-level heads, or one shared head with a band per level (``band_offsets``).
    beam_width : int
        M, beams kept per request.
    order : {"filter-first", "score-first", "unconstrained"}
    band_offsets : sequence of int, optional
        First head row of each level for a shared head (default: cumulative codebooks).
    projection : "full", "selective", or a sequence per step, optional
        Filter-first projection per step (default: planned per step and shape by timing on
        the reference path with ``engine="auto"``, else full on dense steps and selective
        on sparse ones; the GPU engine plans its own). Per step the GPU
        engine also takes a whole option, ``"sparse+selective/small"`` or a
        :class:`~zerogr_core.decode.options.StepOption`; the reference path keeps its
        projection part.
    source : StaticIndex or HostTrie, optional
        For score-first: where valid tokens come from (default: ``index`` itself).
    engine : {"auto", "reference", "graph", "eager"}
        Which implementation decodes: ``auto`` uses the GPU engine (CUDA graph replay) for
        filter-first on a CUDA index and the pure-PyTorch reference elsewhere.
    catalog : Catalog, optional
        The catalog the index was built from; needed to pass item ids to
        :meth:`decode` (``allow_items`` / ``deny_items``) and to :meth:`register_items`.

    Attributes
    ----------
    gpu_engine : GpuEngine or None
        The GPU engine chosen by ``engine`` (its plans, graph error), or None on the
        reference path.
    registry : ListRegistry
        The standing lists registered with :meth:`register_items`.

    Notes
    -----
    Thread safety: one decoder serves concurrent callers. The GPU engine holds static
    buffers (and a CUDA graph) per shape, so its decodes take a lock and run one at a
    time; the reference path keeps all decode state per call and runs concurrently, with
    only its per-shape planning under a lock (every caller of a shape gets the same plan).
    """

    def __init__(self, index: StepIndex, heads, beam_width: int, order: str = "filter-first", *,
                 band_offsets: Sequence[int] | None = None, projection=None, source=None,
                 engine: str = "auto", catalog=None):
        self.catalog = catalog
        self.engine = engine
        self.registry = ListRegistry()
        # where per-call lists are built: "auto" (on the index's device when it is a GPU),
        # "host" or "device" (tests force either)
        self.list_path = "auto"
        # the index first: a Catalog in its place (a plausible slip) would fail on a missing attribute
        if not isinstance(index, StepIndex):
            raise ZeroGRError(f"index: expected a StepIndex (build_index(catalog)), got {type(index).__name__}")
        if catalog is not None and not isinstance(catalog, Catalog):
            raise ZeroGRError(f"catalog: expected the Catalog the index was built from, got {type(catalog).__name__}")
        if catalog is not None and catalog.n_items != index.n_items:
            raise ZeroGRError(f"catalog has {catalog.n_items} items but the index has {index.n_items}")
        if catalog is not None and tuple(catalog.codebook_sizes) != tuple(index.codebook_sizes):
            # as many items, other SIDs (another version): ids would map to another catalog's rows
            raise ZeroGRError(f"catalog has codebooks {'/'.join(map(str, catalog.codebook_sizes))} but the index "
                              f"{'/'.join(map(str, index.codebook_sizes))}: build both from one catalog")
        if order not in ORDERS:
            raise ZeroGRError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        if engine not in ENGINES:
            raise ZeroGRError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        beam_width = _positive_int(beam_width, "beam_width")
        self.index = index
        self.heads = Heads.build(heads, index.codebook_sizes, band_offsets)
        if self.heads.device != index.device:
            raise ZeroGRError(f"heads are on {self.heads.device} but the index is on {index.device}")
        self.beam_width = beam_width
        self.order = order
        if isinstance(projection, str):
            if projection not in PROJECTIONS:
                raise ZeroGRError(f"projection must be one of {PROJECTIONS}, got {projection!r}")
            projection = (projection,) * index.n_levels
        self.projection = tuple(projection) if projection is not None else None
        self.source = source if source is not None else index
        if source is not None:
            _check_source(source, index)
        use_gpu = order == "filter-first" and index.device.type == "cuda" and engine != "reference"
        if engine in ("graph", "eager") and not use_gpu:
            raise ZeroGRError(f"engine {engine!r} needs filter-first decoding on a CUDA index")
        # the reference path plans its projection per step and shape, as the engine does;
        # under the Triton interpreter (tests) timing would measure the interpreter
        self.plan_reference = (order == "filter-first" and not use_gpu and engine == "auto"
                               and self.projection is None and not interpreting())
        self.plans = {}
        self._plan_lock = threading.Lock()
        self.gpu_engine = None
        if use_gpu:
            from .engine import GpuEngine

            self.gpu_engine = GpuEngine(index, self.heads, beam_width, plan_override=self.projection,
                                    use_graph=engine != "eager")

    def plan(self, model: DecodeModel, batch: int):
        """The plan that serves ``batch`` requests of ``model`` (a ``hidden_fn`` or a prefilled
        step model, as :meth:`decode` takes it): the GPU engine's, or on the reference path
        the timed choice of projection per step (:mod:`.reference_plan`); ``None`` when the
        reference path does not plan (a fixed projection, another order, or the interpreter).
        Timed at the first call per shape, then cached."""
        if self.gpu_engine is not None:
            return self.gpu_engine.plan(model, batch)
        if not self.plan_reference:
            return None
        key = self.heads.shape_key(batch, self.beam_width)
        with self._plan_lock:
            if key not in self.plans:
                self.plans[key] = make_reference_plan(self.index, self.heads, self.beam_width, model, batch)
            return self.plans[key]

    def step_fn(self, projection: Sequence[str] | None = None, ops: KernelOps = DISPATCH):
        """The per-step candidate function of this decoder's order (reference path);
        ``projection`` (filter-first) overrides the decoder's, ``ops`` picks the kernels."""
        if self.order == "filter-first":
            return FilterFirst(self.index, self.heads, projection or self._fixed_projection(), ops)
        if self.order == "score-first":
            return ScoreFirst(self.source, self.heads, ops)
        return Unconstrained(self.heads)

    def register_items(self, name: str, items, kind: str = "allow", *, index: bool | None = None):
        """Register a standing list once; requests then name it in ``allow_items`` /
        ``deny_items`` instead of shipping its ids (:mod:`zerogr_core.decode.registry`).

        Parameters
        ----------
        name : str
            What requests call it (registering a name again replaces the list).
        items : sequence of item ids
            Ids as in ``catalog``; ids not in it are skipped.
        kind : {"allow", "deny"}
            Whether requests naming it may return only these items, or none of them.
        index : bool, optional
            Give an allow set an index of its own over its sub-catalog, built now with the
            decoder's index config on its device, so a batch that names only it decodes
            over the sub-catalog (default: for allow sets of at least
            :data:`~zerogr_core.decode.registry.SUB_INDEX_MIN_ROWS` rows).

        Returns
        -------
        RegisteredList
        """
        from .registry import register

        entry = register(self, name, items, kind, index)
        self.registry.add(entry)
        return entry

    def unregister_items(self, name: str) -> None:
        """Forget a registered list (its sub-catalog index and plans with it)."""
        self.registry.remove(name)

    def request_lists(self, batch_size: int, allow_items=None, deny_items=None, global_deny_rows=None,
                      normalise: str = "request", path: str | None = None):
        """Per-request row lists for :meth:`decode`; registered names resolve to their rows.

        Built on the index's device when it is a GPU, the catalog's ids are dense integers
        and the requests list at least :data:`~zerogr_core.decode.device_lists.DEVICE_MIN_IDS`
        ids (:func:`~zerogr_core.decode.device_lists.build_lists_on`, a
        :class:`~zerogr_core.decode.device_lists.DeviceRequestLists`), else on the host
        (:func:`~zerogr_core.decode.constraints.build_lists`, a
        :class:`~zerogr_core.decode.constraints.RequestLists`); both hold the same lists.
        ``path`` ("auto", "host" or "device") overrides :attr:`list_path`. A batch whose every
        request names one registered deny set, and nothing else, gets the same lists object call
        after call (built once per batch size; read it, do not modify it).
        """
        constraints, device_lists, _ = _list_modules()
        if self.catalog is None:
            raise ZeroGRError("allow_items/deny_items need the item ids: pass catalog= to Decoder")
        path = path or self.list_path
        if path not in device_lists.LIST_PATHS:
            raise ZeroGRError(f"list path must be one of {device_lists.LIST_PATHS}, got {path!r}")
        if path == "auto":
            big = device_lists.listed_ids(allow_items, deny_items, batch_size) >= device_lists.DEVICE_MIN_IDS
            path = "device" if big and self.index.device.type == "cuda" else "host"
        if path == "device":
            # GPU work outside a decode: never while this decoder's engine captures a graph
            with self.gpu_engine.lock if self.gpu_engine is not None else contextlib.nullcontext():
                lists = device_lists.build_lists_on(self.index.device, self.catalog, batch_size, allow_items,
                                                    deny_items, global_deny_rows, normalise, registry=self.registry)
            if lists is not None:
                return lists
        return constraints.build_lists(self.catalog, batch_size, allow_items, deny_items, global_deny_rows,
                                       normalise, registry=self.registry)

    def _standing_allow(self, batch_size: int, allow_items, normalise: str):
        """The indexed allow set every request names, if the batch may decode over it
        (under ``normalise="catalog"`` filtering first needs the whole catalog's normaliser)."""
        if not isinstance(allow_items, str) and not (
                isinstance(allow_items, (list, tuple)) and allow_items and isinstance(allow_items[0], str)):
            return None
        from .constraints import _per_request

        entry = self.registry.shared(_per_request(allow_items, batch_size, "allow_items"), "allow")
        if entry is None or not entry.indexed or (normalise == "catalog" and self.order == "filter-first"):
            return None
        return entry

    def _decode_standing(self, entry, model: DecodeModel, batch_size: int, deny_items, normalise: str, *,
                         timer=None, on_step=None) -> DecodeResult:
        """Decode over the sub-catalog of ``entry``, then map its rows back to the catalog's."""
        from .registry import sub_lists

        lists = None
        if deny_items is not None:
            lists = self.request_lists(batch_size, None, deny_items, normalise=normalise, path="host")
            lists = None if lists.empty else sub_lists(entry, lists)
        result = entry.decoder.decode(model, batch_size, lists=lists, timer=timer, on_step=on_step)
        result.item_rows = entry.device_rows[result.item_rows]  # padding (-1) stays -1
        return result

    def plan_table(self, model: DecodeModel, batch: int) -> list[dict]:
        """The plan that serves ``batch`` requests as rows a page or a report can show.

        Plans the shape if it is not planned yet (:meth:`plan`). Every row has ``step``
        (1-based) and ``projection`` ("full" or "selective"); the GPU engine's rows add its
        ``mode``, ``topk`` and µs per option, the reference plan's its ``representation``
        and µs per projection, and a decoder that does not plan says ``"fixed"`` under
        ``planned``.

        Returns
        -------
        list of dict
            One row per step.
        """
        plan = self.plan(model, batch) if self.order == "filter-first" else None
        if plan is None:
            fixed = self._fixed_projection() if self.order == "filter-first" else ("full",) * self.index.n_levels
            return [{"step": level + 1, "representation": self.index.steps[level].kind, "projection": p,
                     "planned": "fixed"} for level, p in enumerate(fixed)]
        if self.gpu_engine is not None:
            return [dict(row, projection=_projection_of(s.option)) for row, s in zip(plan.table(), plan.steps)]
        return [dict(row, planned=plan.source) for row in plan_rows(plan)]

    def graph_error(self, batch: int) -> str | None:
        """Why this shape's CUDA-graph capture failed (it then replays eagerly), or None."""
        if self.gpu_engine is None:
            return None
        plan = self.gpu_engine.plans.get(self.gpu_engine.key(batch))
        return None if plan is None else plan.graph_error

    def _fixed_projection(self) -> tuple[str, ...]:
        return tuple(_projection_of(p) for p in self.projection) if self.projection else default_projection(self.index)

    def decode(self, model: DecodeModel, batch_size: int, *, allow_items=None, deny_items=None,
               lists=None, normalise: str = "request", timer=None, on_step=None) -> DecodeResult:
        """Decode ``batch_size`` requests, optionally under per-request item constraints.

        Parameters
        ----------
        model : callable(step, prefixes) -> torch.Tensor, or StepModel
            A ``hidden_fn``: ``prefixes`` int64 (batch, beams_at_step, step), -1 for unfilled beams;
            ``beams_at_step`` is 1 at step 0 and ``beam_width`` afterwards. Returns the
            hidden states (batch, beams_at_step, H). Or a step model
            (:class:`zerogr_core.models.StepModel`) prefilled with the ``batch_size``
            requests: the loop calls its ``step(l, tokens, parents)``. With a shared head, a
            step model's ``token_offsets`` must be its bands (refused otherwise).
        batch_size : int
        allow_items, deny_items : sequence of ``batch_size`` entries, or str, optional
            Per request, only the allowed items / none of the denied items are returned.
            An entry is an item-id array or 1-D integer tensor (ids as in ``catalog``; ids
            not in it are skipped), the name of a list registered with :meth:`register_items`,
            or ``None``; a single name stands for every request. Enforced during decoding:
            prefixes without an allowed item below them are never scored or kept, and
            filtering first normalises as ``normalise`` says. A request with fewer
            allowed items than ``beam_width`` gets them all, then padding (row -1, score
            -inf). Costs (docs/constraints.md): no list, or only empty ones, takes the
            list-free path; deny-only calls of at most 65,536 integer ids per request cost a
            write of the ids into pinned memory, which the captured graph turns into rows (up to
            2,048 ids per request it reads them there, with no copy; ids in tensors on the
            index's device cross device to device; :mod:`zerogr_core.decode.id_lists`); other ids cost a lookup and a sort of the
            batch's listed rows (on the host, or on the GPU for many ids) and one copy; a registered allow set with its own index, named by
            every request, decodes over its sub-catalog with no list; a registered deny
            set named by every request stays on the device. See
            :mod:`zerogr_core.decode.constraints` and :mod:`zerogr_core.decode.registry`.
        lists : RequestLists, optional
            Ready-made row lists (:meth:`request_lists`), instead of the two id lists
            (they carry their own ``normalise``; passing both, or another ``normalise``, is refused).
        normalise : {"request", "catalog"}
            With the id lists, what filtering first normalises over: each request's
            alive tokens, or the catalog's valid tokens with the listed items dropped
            afterwards (an item then scores the same with or without lists).
        timer : callable(step, stage) -> context manager, optional
            Times each stage of each step (:class:`zerogr_core.timing.StageTimer` keeps
            the rows; stages in :data:`zerogr_core.decode.ops.STAGES`).
        on_step : callable(step, states), optional
            Sees the beam states entering each step, int64 (batch · beams_at_step,), -1
            for a dead beam; it must not modify them.

        Returns
        -------
        DecodeResult

        Notes
        -----
        With ``timer`` or ``on_step`` the decode runs step by step, eagerly: the same
        projection per step as the plan, but the GPU engine's steps as the dispatching
        kernels and no CUDA graph (a graph replay cannot be split into stages), and on a
        CPU the PyTorch references, never the Triton interpreter. Same beams as a plain
        decode up to float rounding on near-ties.
        """
        # without autograd, switched by hand: torch.no_grad() as a decorator costs a microsecond a call
        grad = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        try:
            return self._decode(model, batch_size, allow_items, deny_items, lists, normalise, timer, on_step)
        finally:
            torch.set_grad_enabled(grad)

    def _decode(self, model, batch_size, allow_items, deny_items, lists, normalise, timer, on_step) -> DecodeResult:
        batch_size = _positive_int(batch_size, "batch_size")
        if normalise != "request" and normalise not in _list_modules()[0].NORMALISE:
            raise ZeroGRError(f"normalise must be one of {_list_modules()[0].NORMALISE}, got {normalise!r}")
        if lists is not None:  # ready-made lists replace the id lists and carry their own normalisation
            if allow_items is not None or deny_items is not None:
                raise ZeroGRError("lists: pass either lists= or allow_items/deny_items, not both (the id lists "
                                  "would be ignored)")
            if normalise != "request" and getattr(lists, "normalise", normalise) != normalise:
                raise ZeroGRError(f"normalise: the lists were built with normalise={lists.normalise!r}; pass "
                                  f"normalise= to request_lists instead")
        ids = None  # the common deny-only call first: when its ids qualify, they are one pass
        if lists is None and allow_items is None and deny_items is not None:
            ids = self._deny_ids(batch_size, None, deny_items, normalise, timer, on_step)
            lists = None if ids is None or ids.empty else ids
        if lists is None and ids is None and not _nothing_listed(batch_size, allow_items, deny_items):
            if self.order != "unconstrained":
                standing = self._standing_allow(batch_size, allow_items, normalise)
                if standing is not None:
                    return self._decode_standing(standing, model, batch_size, deny_items, normalise,
                                                 timer=timer, on_step=on_step)
            # deny ids were tried above unless an allow argument (of None entries) came too
            lists = (allow_items is not None and self._deny_ids(batch_size, allow_items, deny_items, normalise,
                                                                 timer, on_step)) or \
                self._allow_ids(batch_size, allow_items, deny_items, normalise, timer, on_step) or \
                self.request_lists(batch_size, allow_items, deny_items, normalise=normalise)
        if lists is not None:
            self._check_constrainable(lists, batch_size)
            if lists.empty:  # nothing listed: the list-free path (and its graph)
                lists = None
        if not callable(model) and not is_step_model(model):
            raise ZeroGRError(f"model: expected a hidden_fn(step, prefixes) or a prefilled step model, "
                              f"got {type(model).__name__}")
        if is_step_model(model):
            if getattr(model, "batch", batch_size) != batch_size:
                raise ZeroGRError(f"step model: prefilled with {getattr(model, 'batch')} requests, "
                                  f"batch_size is {batch_size}")
            if self.heads.shared is not None:  # it feeds tokens back where the shared head scores them
                check_band_offsets(model, self.heads.band_offsets)
        observed = timer is not None or on_step is not None
        if self.gpu_engine is not None and not observed:
            return self.gpu_engine.decode(model, batch_size, lists=lists)
        projection = None
        if self.gpu_engine is not None:
            projection = [_projection_of(s.option) for s in self.gpu_engine.plan(model, batch_size).steps]
        elif self.plan_reference:
            projection = plan_projection(self.plan(model, batch_size))
        # observed decodes run the references on a CPU: the interpreter must not be what is timed
        ops = (DISPATCH if self.index.device.type == "cuda" else REFERENCE) if observed else DISPATCH
        step_fn = self.step_fn(projection, ops)
        if lists is not None:
            from .constraints import SlotConstraint

            step_fn.constraint = SlotConstraint(self.index, lists)
        if on_step is not None:
            step_fn = _Observed(step_fn, on_step)
        result = beam_search(step_fn, model, batch_size=batch_size, beam_width=self.beam_width,
                             n_levels=self.index.n_levels, hidden_size=self.heads.hidden_size,
                             device=self.index.device, ops=ops, timer=timer or no_timer)
        if self.order == "unconstrained":
            flat = result.tokens.reshape(-1, self.index.n_levels)
            rows = resolve_rows(self.index, flat).reshape(result.item_rows.shape)
            result.item_rows = torch.where(result.scores > float("-inf"), rows, -1)
        return result

    def _deny_ids(self, batch_size: int, allow_items, deny_items, normalise: str, timer, on_step):
        """Deny ids the engine resolves inside its graph (:mod:`zerogr_core.decode.id_lists`),
        when the call can use them: the GPU engine decodes it, nothing is allowed, and the
        deny lists are short integer id arrays on a catalog with a dense id table."""
        if self.gpu_engine is None or timer is not None or on_step is not None or self.catalog is None \
                or self.list_path != "auto":
            return None
        if allow_items is not None and (isinstance(allow_items, (str, bytes)) or not hasattr(allow_items, "__len__")
                                        or len(allow_items) != batch_size or any(a is not None for a in allow_items)):
            return None
        return _list_modules()[2].deny_ids(self.catalog, batch_size, deny_items, normalise, self.index.device)

    def _allow_ids(self, batch_size: int, allow_items, deny_items, normalise: str, timer, on_step):
        """Allow ids the engine turns into bitmaps inside its graph (:class:`~zerogr_core.decode.id_lists.AllowIds`),
        when the call can use them: the GPU engine decodes it, nothing is denied, and the allow lists are
        integer ids on a catalog with a dense id table, at least
        :data:`~zerogr_core.decode.device_lists.DEVICE_MIN_IDS` of them on a GPU (``list_path="device"``:
        any number, on any device)."""
        if self.gpu_engine is None or timer is not None or on_step is not None or self.catalog is None \
                or self.list_path == "host" or allow_items is None or isinstance(allow_items, (str, bytes)):
            return None
        _, device_lists, id_lists = _list_modules()
        if not hasattr(allow_items, "__len__") or len(allow_items) != batch_size \
                or not _nothing_listed(batch_size, None, deny_items):
            return None
        if self.list_path == "auto" and (self.index.device.type != "cuda" or device_lists.listed_ids(
                allow_items, None, batch_size) < device_lists.DEVICE_MIN_IDS):
            return None
        return id_lists.allow_ids(self.catalog, self.index, batch_size, allow_items, normalise)

    def _check_constrainable(self, lists, batch_size: int) -> None:
        if lists.batch != batch_size:
            raise ZeroGRError(f"constraint lists cover {lists.batch} requests, batch_size is {batch_size}")
        if self.order == "unconstrained":
            raise ZeroGRError("allow/deny lists need a constrained order (filter-first or score-first)")
        if self.order == "score-first" and not isinstance(self.source, (StepIndex, HostTrie)):
            raise ZeroGRError(f"allow/deny lists need score-first over the step-sliced index or the host "
                              f"trie, not {type(self.source).__name__}")


class _Observed:
    """A step function that shows each step's input beam states to ``on_step`` first."""

    def __init__(self, step_fn, on_step):
        self.step_fn, self.on_step = step_fn, on_step

    def __call__(self, step, states, hidden, scores, timer=no_timer):
        self.on_step(step, states)
        return self.step_fn(step, states, hidden, scores, timer)


def _check_source(source, index: StepIndex) -> None:
    """Refuse a score-first ``source`` that is not one of the catalog of ``index``: its final states
    are read as that catalog's rows, so another catalog's (a stale version's) would name other items."""
    from ..index.static_style import StaticIndex

    if isinstance(source, StepIndex):
        levels, items = source.n_levels, source.n_items
        if source.codebook_sizes != index.codebook_sizes:
            raise ZeroGRError(f"source: built for codebooks {list(source.codebook_sizes)}, the index has "
                              f"{list(index.codebook_sizes)}")
    elif isinstance(source, HostTrie):
        levels, items = len(source.tokens), int(source.tokens[-1].numel())
    elif isinstance(source, StaticIndex):
        levels = source.n_levels
        items = int(source.pairs[-1].shape[0]) if source.pairs else int((source.dense_states >= 0).sum())
    else:
        raise ZeroGRError(f"source: score-first needs a StepIndex, StaticIndex or HostTrie, "
                          f"got {type(source).__name__}")
    if (levels, items) != (index.n_levels, index.n_items):
        raise ZeroGRError(f"source: {type(source).__name__} of {items} items in {levels} levels, but the index holds "
                          f"{index.n_items} items in {index.n_levels} (build both from one catalog)")


def _positive_int(value, name: str) -> int:
    """``value`` as an int when it is a positive integer (numpy's and 0-d integer tensors too, not a
    bool), else a one-line :class:`ZeroGRError` naming the argument."""
    if isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_floating_point() \
            and value.dtype != torch.bool:
        value = int(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ZeroGRError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _nothing_listed(batch_size: int, allow_items, deny_items) -> bool:
    """No allow list and nothing denied (``None`` or empty per request), checked without
    converting anything: such a call takes the list-free path at no host cost. Arguments
    of the wrong kind or length are left to :func:`~zerogr_core.decode.constraints.build_lists`
    to refuse."""
    is_empty_request = _list_modules()[0].is_empty_request

    def batch_of(x) -> bool:
        return not isinstance(x, (str, bytes)) and hasattr(x, "__len__") and len(x) == batch_size

    if allow_items is not None and (not batch_of(allow_items) or any(a is not None for a in allow_items)):
        return False
    if deny_items is None:
        return True
    return batch_of(deny_items) and all(is_empty_request(d) for d in deny_items)


@functools.cache
def _list_modules():
    """``(constraints, device_lists, id_lists)``, imported on the first call that has lists (they
    load the list kernels) and then kept: an import statement costs microseconds on every call."""
    from . import constraints, device_lists, id_lists

    return constraints, device_lists, id_lists
