"""Serving the Qwen3 recommender: context token ids in, ranked catalog items out.

:class:`LLMServeConfig` names the model (a :data:`~zerogr_core.models.qwen3.QWEN3_PRESETS`
shape with random weights, or a ``transformers`` Qwen3 checkpoint folder with the SID
bands' token offsets), the catalog, the beam width and the planned batch sizes.
:class:`LLMRecommender` holds one :class:`~zerogr_core.models.protocol.StepDecoder` per
planned batch size (its own static buffers, so on a GPU each size keeps the CUDA graph it
captured at warm-up) over one model and one catalog index, and decodes a list of
:class:`LLMQuery` at once: split into runs of at most the largest planned size and each run
padded to a planned size (:mod:`.batching`), filtering first, item-constrained.

Imports neither Ray nor Polars: the GPU image serves and load-tests through it.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from ..arg_types import SEED_MAX, whole_value, whole_values
from ..errors import ZeroGRError
from .batching import batching_fields, chunks, pad, padded_size
from .schema import RequestError


@dataclass(frozen=True)
class LLMServeConfig:
    """A Qwen3 recommender replica.

    Attributes
    ----------
    model : str
        A :data:`~zerogr_core.models.qwen3.QWEN3_PRESETS` key; random weights (labelled
        ``weights="random"``) unless ``checkpoint`` is given.
    checkpoint : str or None
        A ``transformers`` ``Qwen3ForCausalLM`` folder whose vocabulary holds the SID tokens.
    token_offsets : tuple of int or None
        Vocabulary id of token 0 of each SID level (required with ``checkpoint``; the
        preset's bands otherwise).
    catalog : str
        ``open_catalog`` spec: ``synth:KIND:N[:SEED[:V]]``, a sample name or a file.
    beam : int
        Beam width M (every request decodes at M; ``n`` of a request is at most M).
    batch_sizes : tuple of int
        Planned batch sizes, ascending (one step model and, on a GPU, one graph each).
    batch_wait_s : float
        How long a gathered batch waits to fill.
    context_bucket : int
        Contexts are padded to a multiple of it (nearby lengths share buffers and graphs).
    max_context : int
        Longest context a request may send (tokens).
    warmup_context : int
        Context length of the warm-up decode of every planned size (0: no warm-up).
    device : str
        ``auto`` (CUDA when present), ``cuda`` or ``cpu``.
    dtype : str
        ``bfloat16``, ``float16`` or ``float32``.
    seed : int
        Seed of the random weights.
    projections : str
        How the layers' weight GEMMs run: ``model`` (the model's dtype) or ``fp8`` (float8 weights and
        activations with row scales, a bfloat16 model on a GPU of compute capability 8.9 or later;
        :class:`~zerogr_core.models.qwen3.Qwen3StepModel`'s ``projections``).
    partial_last_step : bool
        The last step's layers on the beams whose prefix holds more than one item only (the
        step model's ``partial_last_step``; on a GPU one host read mid-decode).
    """

    model: str = "tiny"
    checkpoint: str | None = None
    token_offsets: tuple | None = None
    catalog: str = "synth:watch-like:2000:0:64"
    beam: int = 16
    batch_sizes: tuple = (1, 2, 4)
    batch_wait_s: float = 0.002
    context_bucket: int = 16
    max_context: int = 1024
    warmup_context: int = 16
    device: str = "auto"
    dtype: str = "float32"
    seed: int = 0
    projections: str = "model"
    partial_last_step: bool = True

    def __post_init__(self):
        from ..models.protocol import partial_flag
        from ..models.qwen3 import QWEN3_PRESETS, projections_problem

        if self.checkpoint is None and self.model not in QWEN3_PRESETS:
            raise ZeroGRError(f"model: unknown Qwen3 preset {self.model!r}; choose one of {', '.join(QWEN3_PRESETS)}")
        if self.checkpoint is not None and not self.token_offsets:
            raise ZeroGRError("token_offsets: required with a checkpoint (vocabulary id of each SID level's token 0)")
        # whole numbers as given (a JSON 8.0 or a numpy integer is one; int() would read 64.7 as 64)
        if self.token_offsets is not None:
            offsets = whole_values(self.token_offsets)
            if offsets is None or min(offsets, default=0) < 0:
                raise ZeroGRError(f"token_offsets: expected non-negative whole numbers, got {self.token_offsets!r}")
            object.__setattr__(self, "token_offsets", offsets)
        beam, sizes, wait = batching_fields(self.beam, self.batch_sizes, self.batch_wait_s)
        object.__setattr__(self, "beam", beam)
        object.__setattr__(self, "batch_sizes", sizes)
        object.__setattr__(self, "batch_wait_s", wait)
        for name in ("context_bucket", "max_context"):
            value = whole_value(getattr(self, name))
            if value is None or value < 1:
                raise ZeroGRError(f"{name}: expected a positive integer, got {getattr(self, name)!r}")
            object.__setattr__(self, name, value)
        warm = whole_value(self.warmup_context)
        if warm is None or not 0 <= warm <= self.max_context:
            raise ZeroGRError(f"warmup_context: must be a whole number within 0…{self.max_context}, got "
                              f"{self.warmup_context!r}")
        object.__setattr__(self, "warmup_context", warm)
        seed = whole_value(self.seed)
        if seed is None or not 0 <= seed <= SEED_MAX:
            raise ZeroGRError(f"seed: must be a whole number within 0…{SEED_MAX}, got {self.seed!r}")
        object.__setattr__(self, "seed", seed)
        if self.device not in ("auto", "cuda", "cpu"):
            raise ZeroGRError(f"device: expected auto, cuda or cpu, got {self.device!r}")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise ZeroGRError(f"dtype: expected bfloat16, float16 or float32, got {self.dtype!r}")
        why = projections_problem(self.projections, self.dtype)
        if why:
            raise ZeroGRError(why)
        partial_flag(self.partial_last_step)

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    @property
    def weights(self) -> str:
        """``random`` for a preset shape, else the checkpoint folder."""
        return "random" if self.checkpoint is None else self.checkpoint

    @classmethod
    def preset(cls, name: str, **changes) -> "LLMServeConfig":
        """A :data:`LLM_SERVE_PRESETS` entry with ``changes`` applied."""
        if name not in LLM_SERVE_PRESETS:
            raise ZeroGRError(f"unknown LLM serve preset {name!r} (choose from {', '.join(LLM_SERVE_PRESETS)})")
        return replace(LLM_SERVE_PRESETS[name], **changes)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["batch_sizes"] = list(self.batch_sizes)
        d["token_offsets"] = None if self.token_offsets is None else list(self.token_offsets)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LLMServeConfig":
        offsets = d.get("token_offsets")
        return cls(**dict(d, batch_sizes=tuple(d["batch_sizes"]), token_offsets=None if offsets is None
                          else tuple(offsets)))


#: ``tiny``: the tiny Qwen3 shape on the CPU over 2,000 items of 3 × 64 codes (tests, the
#: CPU load test); ``qwen3-1.7b``: the 1.7B shape in bf16 on a GPU over the 10^7-item
#: ``watch-like`` catalog of 3 × 8,192 codes, beam 256, sized for contexts up to 8,192.
LLM_SERVE_PRESETS: dict[str, LLMServeConfig] = {
    "tiny": LLMServeConfig(),
    "qwen3-1.7b": LLMServeConfig(model="qwen3-1.7b", catalog="synth:watch-like:10000000", beam=256,
                                 batch_sizes=(1, 2, 4), batch_wait_s=0.002, context_bucket=256, max_context=8192,
                                 warmup_context=5000, device="cuda", dtype="bfloat16"),
}


@dataclass(frozen=True)
class LLMQuery:
    """One validated request.

    Attributes
    ----------
    input_ids : tuple of int
        Context token ids (1 … ``max_context``, each in the model's vocabulary).
    n : int
        Beam results to return, 1 … M.
    exclude : tuple of int or str
        Item ids never to return.
    allow : tuple of int or str, or None
        The only item ids to return (``None``: every item).
    """

    input_ids: tuple
    n: int
    exclude: tuple = ()
    allow: tuple | None = None


@dataclass(frozen=True)
class BeamAnswer:
    """The ranked items of one request.

    Attributes
    ----------
    items : list of int or str
        Item ids, best first.
    scores : list of float
        Their log-probabilities (sum over the L SID tokens).
    codes : np.ndarray, shape (len(items), L), int64
        Local SID codes per level.
    token_ids : np.ndarray, shape (len(items), L), int64
        The same tokens as vocabulary ids (``codes + token_offsets``).
    rows : np.ndarray, shape (len(items),), int64
        Catalog rows.
    """

    items: list
    scores: list
    codes: np.ndarray
    token_ids: np.ndarray
    rows: np.ndarray


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ZeroGRError("device: cuda was asked for but no GPU is visible (use the tiny preset on a CPU)")
    return torch.device(name)


def load_qwen3(config: LLMServeConfig, device: torch.device):
    """``(Qwen3ForCausalLM, token_offsets)`` of ``config``: the preset's shape with random
    weights, or the checkpoint folder.

    Raises
    ------
    ZeroGRError
        A missing folder or one that is not a Qwen3 causal LM.
    """
    from pathlib import Path

    from ..models.qwen3 import build_random

    dtype = getattr(torch, config.dtype)
    if config.checkpoint is None:
        model, preset = build_random(config.model, device=device, dtype=dtype, seed=config.seed)
        return model, tuple(config.token_offsets or preset.token_offsets)
    if not Path(config.checkpoint).is_dir():
        raise ZeroGRError(f"checkpoint: {config.checkpoint}: no such folder")
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(config.checkpoint, dtype=dtype)
    except Exception as err:  # noqa: BLE001 - transformers raises many types for a foreign folder
        raise ZeroGRError(f"checkpoint: {config.checkpoint}: not a transformers causal LM "
                          f"({type(err).__name__})") from None
    return model.to(device).eval(), tuple(config.token_offsets)


class LLMRecommender:
    """The Qwen3 model, the catalog, its index and one decoder per planned batch size.

    Parameters
    ----------
    config : LLMServeConfig

    Notes
    -----
    :meth:`decode` may be called from several threads; decodes run one at a time (each
    planned size's step model holds one batch, and the engine's static buffers one decode).
    """

    def __init__(self, config: LLMServeConfig):
        from .. import build_index
        from ..catalog.samples import open_catalog
        from ..models.protocol import StepDecoder
        from ..models.qwen3 import Qwen3StepModel

        self.config = config
        self.device = _resolve_device(config.device)
        self.model, self.offsets = load_qwen3(config, self.device)
        self.catalog = open_catalog(config.catalog)
        sizes = tuple(int(s) for s in self.catalog.codebook_sizes)
        vocab = int(self.model.get_input_embeddings().weight.shape[0])
        if len(sizes) != len(self.offsets) or any(o + s > vocab for o, s in zip(self.offsets, sizes)):
            raise ZeroGRError(f"catalog {config.catalog}: codebooks {'/'.join(map(str, sizes))} do not fit the "
                              f"model's SID bands at {list(self.offsets)} in a vocabulary of {vocab}")
        self.vocab = vocab
        self.levels = len(sizes)
        self.index = build_index(self.catalog, device=self.device)
        self._offsets = torch.tensor(self.offsets, dtype=torch.int64)
        self.servings = {}
        for size in config.batch_sizes:
            sm = Qwen3StepModel(self.model, self.offsets, context_bucket=config.context_bucket,
                                projections=config.projections, partial_last_step=config.partial_last_step)
            self.servings[size] = StepDecoder(sm, self.index, sm.head, beam_width=config.beam,
                                              order="filter-first", band_offsets=self.offsets)
        self._lock = threading.Lock()
        #: (batch size, ms) of the latest padded decodes (prefill, L steps, copy back): what a
        #: request waits for besides the server's own work.
        self.decode_ms: deque = deque(maxlen=4096)

    def loop(self) -> dict:
        """How each planned size decodes: ``engine graph, prefill inside``, the engine eagerly
        (with the capture error, if any), or the reference loop."""
        out = {}
        for size, serving in self.servings.items():
            gpu = serving.decoder.gpu_engine
            out[str(size)] = "reference (eager)" if gpu is None else ("engine graph, prefill inside"
                                                                     if serving.prefill_in_graph else
                                                                     f"engine ({gpu.graph_error or 'eager'})")
        return out

    def describe(self) -> dict:
        """What ``/health`` reports: model, weights, catalog, device."""
        return dict(model=self.config.model, weights=self.config.weights, catalog=self.config.catalog,
                    items=int(self.catalog.n_items), levels=self.levels, token_offsets=list(self.offsets),
                    beam=self.config.beam, batch_sizes=list(self.config.batch_sizes), device=str(self.device),
                    dtype=self.config.dtype, projections=self.config.projections,
                    partial_last_step=self.config.partial_last_step, loop=self.loop())

    @torch.no_grad()
    def warmup(self) -> None:
        """Decode every planned size once at ``warmup_context`` (plans, compiles and, on a
        GPU, captures each size's graph before the first request)."""
        t = self.config.warmup_context
        if t == 0:
            return
        gen = torch.Generator().manual_seed(0)
        for size in self.config.batch_sizes:
            ids = torch.randint(0, self.offsets[0], (t,), generator=gen).tolist()
            self.decode([LLMQuery(tuple(ids), 1)] * size)

    @torch.no_grad()
    def decode(self, queries: list[LLMQuery]) -> list:
        """Answer ``queries`` together.

        Returns
        -------
        list of BeamAnswer or RequestError
            One per query, in order; a :class:`RequestError` (422) for excluded ids not in
            the catalog.
        """
        out: list = [None] * len(queries)
        ready = []
        for i, q in enumerate(queries):
            try:
                deny = self.catalog.rows_of(list(q.exclude), what="exclude") if q.exclude else None
                allow = self.catalog.rows_of(list(q.allow), what="allow") if q.allow is not None else None
            except ZeroGRError as err:
                out[i] = RequestError(str(err), status=422)
                continue
            if allow is not None:  # one list per request: the allowed rows less the excluded ones
                ready.append((i, q, None, allow if deny is None else np.setdiff1d(allow, deny)))
            else:
                ready.append((i, q, deny, None))
        for run in chunks(len(ready), self.config.max_batch):
            part = [ready[j] for j in run]
            size = padded_size(len(part), self.config.batch_sizes)
            rows = pad(part, size)
            result = self._decode_rows(size, [r[1].input_ids for r in rows], [r[2] for r in rows],
                                       [r[3] for r in rows])
            for b, (i, q, *_) in enumerate(part):
                out[i] = self._answer(result, b, q.n)
        return out

    def _decode_rows(self, size: int, contexts: list, denies: list, allows: list):
        from ..decode.constraints import RequestLists

        longest = max(len(c) for c in contexts)
        ids = torch.zeros(size, longest, dtype=torch.int64)
        mask = torch.zeros(size, longest, dtype=torch.int64)
        for b, c in enumerate(contexts):
            ids[b, :len(c)] = torch.as_tensor(c, dtype=torch.int64)
            mask[b, :len(c)] = 1
        lists = None
        allows = allows if any(a is not None for a in allows) else None
        if allows is not None or any(d is not None for d in denies):
            lists = RequestLists.from_rows(deny=[np.zeros(0, np.int64) if d is None else d for d in denies],
                                           allow=allows, normalise="catalog")
        from ..timing import Stopwatch

        with self._lock, Stopwatch(self.device) as sw:
            result = self.servings[size].decode(ids.to(self.device), mask.to(self.device), lists=lists)
            out = result.scores.float().cpu(), result.item_rows.cpu(), result.tokens.cpu()
        self.decode_ms.append((size, sw.ms))
        return out

    def _answer(self, result, b: int, n: int) -> BeamAnswer:
        scores, item_rows, tokens = result
        order = torch.argsort(scores[b], descending=True, stable=True)
        order = order[torch.isfinite(scores[b][order]) & (item_rows[b][order] >= 0)][:n]
        rows = item_rows[b][order].numpy()
        codes = tokens[b][order].to(torch.int64)
        return BeamAnswer(self.catalog.ids_of_rows(rows).tolist(), scores[b][order].tolist(), codes.numpy(),
                          (codes + self._offsets).numpy(), rows)
