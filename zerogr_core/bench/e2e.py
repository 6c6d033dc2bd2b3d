"""``python -m zerogr_core bench-e2e``: end-to-end recommendation latency, model included.

Every method decodes the same requests with the same model (random weights) over the same
catalog and returns ``beam`` items per request; the time covers everything from input ids
on the device to the returned beams (encoder or history prefill included).

Methods
-------
zerogr
    Filtering first in ZeroGR's engine with the model's KV-cache step model
    (:class:`~zerogr_core.models.t5.T5StepModel`: one encoder memory per request, static
    caches; or the decoder-only recommender's). On a GPU one CUDA graph replay runs the
    constrained decode and every model step, and the prefill too (T5's encoder and
    cross-attention keys/values, :meth:`~zerogr_core.models.t5.T5StepModel.stage`; the
    decoder-only model's history pass,
    :meth:`~zerogr_core.models.decoder_only.DecoderOnlyStepModel.stage`). ``--prefill
    outside`` runs the prefill eagerly before the graph instead, for every loop method alike.
    ``zerogr`` runs the step model as it is built by default: the decoder-only model with its
    partial last step, the T5 without (the record's ``partial_last_step`` says which).
zerogr-partial, zerogr-full
    ``zerogr`` with the step model's partial last step forced on (``partial_last_step=True``:
    the last step's layers run only on the beams whose prefix holds more than one item; the
    same items, two CUDA graphs and a host read between them) or off. By default only the arm
    that differs from ``zerogr`` runs; the derived record compares the two
    (``partial_last_step_ratio``, ``partial_same_items``).
zerogr-hf-cache
    Filtering first with the model's own Hugging Face caches
    (:class:`~zerogr_core.hf.HFStepModel`, eager engine; T5 only): a cross-check of the items.
static
    STATIC-style masking in ZeroGR's beam loop with the same step model: logits over the
    whole vocabulary, log-softmax over all of it, then the STATIC index's dense tables
    and CSR rows keep the valid tokens (:class:`~zerogr_core.bench.methods.StaticStep`, as
    published); the whole decode, model included, in one CUDA graph.
unconstrained
    Unconstrained beam search in the same loop with the same step model (top-M over each
    level's band, no mask), in one CUDA graph.
model-only
    The same loop whose steps select nothing (fixed beams): the model's prefill and its
    L steps alone (prefill handled as ``zerogr`` handles it). ``1 - model-only / zerogr`` is constrained decoding's share of ZeroGR's
    end-to-end time.
hf-constrained
    Hugging Face ``generate(num_beams=M, num_return_sequences=M,
    prefix_allowed_tokens_fn=...)``, as the open TIGER and GENRE ports call it (the prefix
    function answers from the sorted SID table, memoised per prefix). The T5 is a
    ``T5ForConditionalGeneration`` already; the decoder-only model runs as its Hugging
    Face twin, a ``GPT2LMHeadModel`` with the same weights
    (:meth:`~zerogr_core.models.decoder_only.DecoderOnlyRecommender.to_hf`), fed the
    history as item embeddings.
hf-unconstrained
    The same ``generate`` with no constraint.

Models: ``t5`` (a TIGER-size ``T5ForConditionalGeneration``: 4+4 layers, d_model 128,
6 heads, d_ff 1024, 20-item histories) and ``decoder-only``
(:mod:`zerogr_core.models.decoder_only`: 12 layers, d 1024, 256 history items).
Catalogs: ``tiger`` (10^6 SIDs of 4 × 256 tokens) and ``search`` (the search-like
catalog of 2·10^7 SIDs, 5 levels 8192/4096/2048/2048/2048). One result file per model
and catalog; ``--budget-s`` is shared out between them.

Examples::

    python -m zerogr_core bench-e2e --quick --out /tmp/e2e                       # CPU smoke run
    python -m zerogr_core bench-e2e --batch 1,8,32 --beam 32,128,256 --budget-s 500 --out out/e2e
    python -m zerogr_core bench-e2e --model decoder-only --catalog tiger --dtype bf16

The command itself (options, the run, the records) is :mod:`zerogr_core.bench.e2e_command`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

METHODS = ("zerogr", "zerogr-partial", "zerogr-full", "zerogr-hf-cache", "static", "unconstrained", "model-only",
           "hf-constrained", "hf-unconstrained")
T5_ONLY = ("zerogr-hf-cache",)
#: Methods of ZeroGR's beam loop with bench step types (captured with the model on a GPU).
LOOP_METHODS = ("static", "unconstrained", "model-only")
LAST_STEP_ARMS = {"zerogr-partial": True, "zerogr-full": False}
"""The methods that force the step model's ``partial_last_step`` (``zerogr`` keeps its default)."""
MODELS = ("t5", "decoder-only")
CATALOGS = ("tiger", "search")
DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: The ``dtype`` field of the records: the weights' dtype, or ``tf32`` for float32 weights whose
#: matrix products may use TF32 tensor cores (every other run keeps them in strict FP32).
DTYPE_FIELDS = {"fp32": "float32", "tf32": "tf32", "bf16": "bfloat16", "fp16": "float16"}
SPECIAL_TOKENS = 3          # pad 0, eos 1, unk 2; SID level l starts at 3 + sum(|V_<l|)


def default_partial_last_step(kind: str) -> bool:
    """Whether the ``kind`` model's step model runs the partial last step when not told."""
    import inspect

    from ..models.decoder_only import DecoderOnlyStepModel
    from ..models.t5 import T5StepModel

    cls = T5StepModel if kind == "t5" else DecoderOnlyStepModel
    return inspect.signature(cls).parameters["partial_last_step"].default


@dataclass(frozen=True)
class E2EConfig:
    """Model shapes and catalog sizes of the end-to-end benchmark.

    Attributes
    ----------
    d_model, d_kv, num_heads, d_ff, layers : int
        T5 shape (``layers`` encoder and ``layers`` decoder layers).
    history : int
        Most history items per T5 request (each is L encoder tokens); requests carry
        between half of it and all of it (right padding).
    decoder_only : str
        :class:`~zerogr_core.models.decoder_only.DecoderOnlyConfig` preset.
    tiger_codebook, tiger_items : int
        The ``tiger`` catalog: 4 levels of ``tiger_codebook`` tokens, ``tiger_items`` SIDs.
    search_codebook : int or None
        Every level's codebook of the ``search`` catalog (``None``: the search-like
        preset's 8192/4096/2048/2048/2048).
    search_items : int
    """

    d_model: int = 128
    d_kv: int = 64
    num_heads: int = 6
    d_ff: int = 1024
    layers: int = 4
    history: int = 20
    decoder_only: str = "deployable"
    tiger_codebook: int = 256
    tiger_items: int = 1_000_000
    search_codebook: int | None = None
    search_items: int = 20_000_000

    @classmethod
    def preset(cls, name: str) -> "E2EConfig":
        """``"tiger"`` (the sizes above) or ``"quick"`` (CPU/CI)."""
        presets = {"tiger": cls(),
                   "quick": cls(d_model=32, d_kv=8, num_heads=2, d_ff=64, layers=1, history=6, decoder_only="tiny",
                                tiger_codebook=16, tiger_items=2000, search_codebook=32, search_items=3000)}
        if name not in presets:
            from ..errors import ZeroGRError

            raise ZeroGRError(f"unknown bench-e2e preset {name!r} (choose from {', '.join(presets)})")
        return presets[name]


def build_catalog(cfg: E2EConfig, name: str, seed: int, n_items: int | None = None):
    """The ``tiger`` (4 × codebook, TIGER-like fan-outs) or ``search`` (search-like) catalog."""
    from ..catalog.synth import SynthConfig, generate

    if name == "search":
        return generate("search-like", n_items or cfg.search_items, seed=seed, codebook=cfg.search_codebook)
    v = cfg.tiger_codebook
    synth = SynthConfig(name=f"tiger-4x{v}", codebook_sizes=(v,) * 4, fanouts=tuple(min(float(v), f) for f in
                                                                                     (40.0, 40.0, 2.5)),
                        dispersion=(None,) * 3)
    return generate(synth, n_items or cfg.tiger_items, seed=seed)


def catalog_label(catalog) -> str:
    """``4x256`` for equal codebooks, else the sizes joined by ``-``."""
    sizes = [int(s) for s in catalog.codebook_sizes]
    return f"{len(sizes)}x{sizes[0]}" if len(set(sizes)) == 1 else "-".join(map(str, sizes))


def token_offsets(codebook_sizes) -> tuple[int, ...]:
    """Vocabulary id of token 0 of every level: the special tokens, then one band per level."""
    out, start = [], SPECIAL_TOKENS
    for size in codebook_sizes:
        out.append(start)
        start += int(size)
    return tuple(out)


def build_model(cfg: E2EConfig, vocab: int, device, seed: int):
    """A T5 with random weights; vocabulary = special tokens + every level's band."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.T5Config(vocab_size=vocab, d_model=cfg.d_model, d_kv=cfg.d_kv, d_ff=cfg.d_ff,
                                   num_layers=cfg.layers, num_decoder_layers=cfg.layers, num_heads=cfg.num_heads,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, dropout_rate=0.0)
    return transformers.T5ForConditionalGeneration(config).to(device).eval()


def requests(catalog, history: int, offsets, batch: int, device, seed: int):
    """Input ids (batch, history · L) of random catalog items, right-padded, and their mask."""
    import numpy as np
    import torch

    levels = len(offsets)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, history // 2), history + 1, batch)
    rows = rng.integers(0, catalog.n_items, (batch, history))
    ids = catalog.sids[rows].astype(np.int64) + np.array(offsets)
    ids = ids.reshape(batch, history * levels)
    mask = np.arange(history * levels)[None, :] < (lengths * levels)[:, None]
    ids = np.where(mask, ids, 0)
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask.astype(np.int64)).to(device)


class CatalogPrefixes:
    """``prefix_allowed_tokens_fn`` of a catalog and catalog membership of HF sequences.

    Answers from the sorted SID table: the rows sharing a prefix are one contiguous range
    (binary search on the prefix codes), their next-level tokens its sorted column slice.
    Answers are memoised per prefix, as a trie would hold them.
    """

    def __init__(self, catalog, offsets, start: int):
        import numpy as np

        self.sids = catalog.sids.astype(np.int64)
        self.offsets = np.array(offsets, dtype=np.int64)
        self.start = start
        sizes = [int(s) for s in catalog.codebook_sizes]
        self.codes = [np.zeros(len(self.sids), dtype=np.int64)]
        for level, size in enumerate(sizes):
            self.codes.append(self.codes[-1] * size + self.sids[:, level])
        self.sizes = sizes

    @functools.lru_cache(maxsize=None)
    def allowed_for(self, prefix: tuple) -> list:
        import numpy as np

        level = len(prefix)
        if level >= len(self.sizes):
            return []
        code = 0
        for l, tok in enumerate(prefix):
            local = tok - int(self.offsets[l])
            if not 0 <= local < self.sizes[l]:
                return []
            code = code * self.sizes[l] + local
        lo, hi = np.searchsorted(self.codes[level], [code, code + 1])
        return (np.unique(self.sids[lo:hi, level]) + self.offsets[level]).tolist()

    def __call__(self, batch_id: int, sent) -> list:
        return self.allowed_for(tuple(sent[self.start:].tolist()))

    def valid(self, sequences) -> float:
        """Fraction of (n, L) vocabulary-id sequences that are catalog items."""
        import numpy as np

        local = sequences.cpu().numpy() - self.offsets
        ok = ((local >= 0) & (local < np.array(self.sizes))).all(axis=1)
        code = np.zeros(len(local), dtype=np.int64)
        for l, size in enumerate(self.sizes):
            code = code * size + np.clip(local[:, l], 0, size - 1)
        pos = np.searchsorted(self.codes[-1], code).clip(max=len(self.sids) - 1)
        return float((ok & (self.codes[-1][pos] == code)).mean())


class LoopServing:
    """A step model decoding in ZeroGR's beam loop with bench step types.

    Per batch size, one :class:`~zerogr_core.decode.loop.BeamLoop` whose steps are
    ``make_step(batch)`` (``fn(level, states, hidden, scores) -> TopkOut``); on a GPU its
    whole decode, model steps included (and the prefill, for a model that stages it), is
    captured in one CUDA graph and captured again when the model's static buffers change
    (a new input shape).

    Parameters
    ----------
    step_model : StepModel
    make_step : callable(batch) -> step function
    n_levels, beam_width, hidden_size : int
    dtype : torch.dtype
        The heads' dtype (what the steps read).
    device : torch.device
    stage : bool
        Stage the requests (:func:`~zerogr_core.models.protocol.load_requests`): a model
        with ``stage`` runs its prefill at step 0, inside the graph, as ``zerogr`` does.
    """

    def __init__(self, step_model, make_step, n_levels: int, beam_width: int, hidden_size: int, dtype, device,
                 stage: bool = True):
        self.step_model, self.make_step = step_model, make_step
        self.stage = stage
        self.n_levels, self.beam_width, self.hidden_size = n_levels, beam_width, hidden_size
        self.dtype, self.device = dtype, device
        self.loops: dict = {}
        self.graph_error = None
        self.loop_name = "ZeroGR beam loop, CUDA graph" if device.type == "cuda" else "ZeroGR beam loop, eager"
        if device.type == "cuda" and stage and callable(getattr(step_model, "stage", None)):
            self.loop_name += ", prefill inside"

    def decode(self, ids, mask):
        """Prefill (inside the graph when staged) and decode; returns (tokens, scores, states), cloned."""
        from ..decode.loop import BeamLoop, PrefixStep
        from ..models.protocol import check_staged, load_requests
        from ..timing import capture

        batch = int(ids.shape[0])
        load_requests(self.step_model, ids, mask, beam_width=self.beam_width, stage=self.stage)
        entry = self.loops.get(batch)
        if entry is None:
            step = self.make_step(batch)
            loop = BeamLoop([PrefixStep(step, level) for level in range(self.n_levels)], batch, self.beam_width,
                            self.hidden_size, self.dtype, self.device)
            entry = self.loops[batch] = {"loop": loop, "graph": None, "key": None}
        loop = entry["loop"]
        key = getattr(self.step_model, "_static_key", None)
        if self.device.type == "cuda" and self.graph_error is None and (entry["graph"] is None or entry["key"] != key):
            entry["graph"] = None
            try:
                entry["graph"], entry["outputs"] = capture(lambda: loop.run(self.step_model))
                entry["key"] = key
            except Exception as exc:  # noqa: BLE001 - recorded in the loop's name; the decode runs eagerly
                import torch

                torch.cuda.synchronize()
                self.graph_error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:200]
                self.loop_name = f"ZeroGR beam loop, eager (capture failed: {self.graph_error})"
        if entry["graph"] is not None:
            entry["graph"].replay()
            out = entry["outputs"]
        else:
            out = loop.run(self.step_model)
        check_staged(self.step_model)
        return tuple(t.clone() for t in out)


class FixedBeams:
    """A step function that selects nothing: every beam continues its own row with token 0.

    What the ``model-only`` method runs, so that the loop times the model's steps alone.
    """

    def __init__(self, batch: int, beam_width: int, device):
        import torch

        from zerogr_kernels import TopkOut

        shape = (batch, beam_width)
        rows = torch.arange(batch, device=device)[:, None].expand(shape)
        local = torch.arange(beam_width, device=device)[None, :].expand(shape)
        scores = torch.zeros(shape, device=device)
        tokens = torch.zeros(shape, dtype=torch.int32, device=device)
        states = torch.zeros(shape, dtype=torch.int64, device=device)
        # step 0 has one beam per request: every beam's parent is its request's row
        self.tops = [TopkOut(scores, rows.contiguous(), tokens, states),
                     TopkOut(scores, (rows * beam_width + local).contiguous(), tokens, states)]

    def __call__(self, level, states, hidden, scores):
        return self.tops[0 if level == 0 else 1]


class Workbench:
    """Model, index, requests and the decoders of every method, for one model and catalog."""

    def __init__(self, cfg: E2EConfig, kind: str, catalog, dtype, device, seed: int, prefill: str = "inside"):
        import torch

        from ..decode.heads import Heads
        from ..index import build_index

        self.cfg, self.kind, self.dtype, self.device, self.seed = cfg, kind, dtype, device, seed
        # every loop method stages its requests alike (on a GPU), so shares compare like with like
        self.stage = prefill == "inside" and device.type == "cuda"
        self.prefill_where = "inside the graph" if self.stage else "outside the graph"
        self.catalog = catalog
        self.index = build_index(catalog, device=device)
        sizes = [int(s) for s in catalog.codebook_sizes]
        if kind == "t5":
            self.offsets = token_offsets(sizes)
            self.model = build_model(cfg, SPECIAL_TOKENS + sum(sizes), device, seed).to(dtype)
            self.prefix_fn = CatalogPrefixes(catalog, self.offsets, start=1)
            self.head = self.model.lm_head.weight.detach()
            self.fields = dict(model="T5ForConditionalGeneration", d_model=cfg.d_model, d_kv=cfg.d_kv,
                               heads=cfg.num_heads, d_ff=cfg.d_ff, layers=f"{cfg.layers}+{cfg.layers}")
        else:
            from ..models.decoder_only import DecoderOnlyConfig, DecoderOnlyRecommender

            mcfg = DecoderOnlyConfig.preset(cfg.decoder_only, sizes)
            torch.manual_seed(seed)
            self.model = DecoderOnlyRecommender(mcfg).to(device, dtype).eval()
            self.offsets = tuple(self.model.band_offsets)
            self.prefix_fn = CatalogPrefixes(catalog, self.offsets, start=0)
            self.head = self.model.head_weight()
            self.fields = dict(model="decoder-only (zerogr_core.models.decoder_only)", d_model=mcfg.d_model,
                               heads=mcfg.n_heads, d_ff=mcfg.ff_mult * mcfg.d_model, layers=str(mcfg.n_layers))
        self.heads = Heads.build(self.head, catalog.codebook_sizes, self.offsets)
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self._static = None
        self._hf_twin = None

    @property
    def hf_model(self):
        """What Hugging Face ``generate`` runs: the T5 itself, or the decoder-only model's
        ``GPT2LMHeadModel`` twin (same weights; built on first use)."""
        if self.kind == "t5":
            return self.model
        if self._hf_twin is None:
            self._hf_twin = self.model.to_hf()
        return self._hf_twin

    def hf_inputs(self, inputs, mask) -> dict:
        """``generate`` keyword arguments of a batch: T5 input ids, or the decoder-only
        history as item embeddings (its SID tokens are then the only ids generated)."""
        if self.kind == "t5":
            return dict(input_ids=inputs, attention_mask=mask)
        return dict(inputs_embeds=self.model.item_embedding(inputs), attention_mask=mask.long())

    @property
    def history(self) -> int:
        """History items per request (at most)."""
        return self.cfg.history if self.kind == "t5" else self.model.config.max_history

    @property
    def static_index(self):
        """The STATIC-style index, its bands where the model's head has them (built on first use)."""
        if self._static is None:
            from ..index.static_style import build_static_index

            self._static = build_static_index(self.catalog, self.device, band_offsets=self.offsets)
        return self._static

    def inputs(self, batch: int):
        """(input, mask) of ``batch`` requests: T5 input ids (right padding) or SID histories (left padding)."""
        import numpy as np
        import torch

        if self.kind == "t5":
            return requests(self.catalog, self.cfg.history, self.offsets, batch, self.device, self.seed + batch)
        rng = np.random.default_rng(self.seed + batch)
        t = self.history
        lengths = rng.integers(max(1, t // 2), t + 1, batch)
        rows = rng.integers(0, self.catalog.n_items, (batch, t))
        mask = np.arange(t)[None, :] >= (t - lengths)[:, None]
        history = np.where(mask[..., None], self.catalog.sids[rows].astype(np.int64), 0)
        return torch.from_numpy(history).to(self.device), torch.from_numpy(mask).to(self.device)

    def step_model(self, partial_last_step: bool | None = None):
        """A fresh KV-cache step model of the model (its own static buffers); ``None``: the
        model's default last step (:func:`default_partial_last_step`)."""
        from ..models.t5 import T5StepModel

        if partial_last_step is None:
            partial_last_step = default_partial_last_step(self.kind)
        if self.kind == "t5":
            return T5StepModel(self.model, self.offsets, partial_last_step=partial_last_step)
        return self.model.step_model(partial_last_step=partial_last_step)

    def serving(self, method: str, beam: int):
        """What ``method`` calls per batch: ``fn(inputs, mask) -> (result, valid_fraction, loop)``."""
        import torch

        from ..decode.orders import resolve_rows
        from ..hf import HFGenerator
        from ..models.protocol import StepDecoder
        from .methods import StaticStep, UnconstrainedStep

        L = self.index.n_levels
        if method.startswith("hf-"):
            constrained = method == "hf-constrained"

            start = self.prefix_fn.start          # T5 output begins with the decoder start token
            model = self.hf_model

            def hf(inputs, mask):
                kwargs = dict(num_beams=beam, num_return_sequences=beam, do_sample=False, max_new_tokens=L,
                              min_new_tokens=L, length_penalty=0.0, early_stopping=True)
                if constrained:
                    kwargs["prefix_allowed_tokens_fn"] = self.prefix_fn
                with torch.no_grad():
                    out = model.generate(**self.hf_inputs(inputs, mask), **kwargs)
                return out, lambda: self.prefix_fn.valid(out[:, start:start + L]), "huggingface generate"
            return hf
        if method in LOOP_METHODS:
            makers = {"static": lambda b: StaticStep(self.static_index, self.heads, b, beam, "full"),
                      "unconstrained": lambda b: UnconstrainedStep(self.heads, b, beam),
                      "model-only": lambda b: FixedBeams(b, beam, self.device)}
            serving = LoopServing(self.step_model(False), makers[method], L, beam, self.heads.hidden_size,
                                  self.heads.dtype, self.device, stage=self.stage)

            def loop(ids, mask):
                with torch.no_grad():
                    tokens, scores, _ = serving.decode(ids, mask)

                def valid():
                    if method == "model-only":
                        return None
                    rows = resolve_rows(self.index, tokens.reshape(-1, L)).view(scores.shape)
                    finite = scores > float("-inf")
                    return float(((rows >= 0) & finite).sum() / finite.sum().clamp(min=1))
                return tokens, valid, serving.loop_name
            return loop
        partial = LAST_STEP_ARMS.get(method)
        if self.kind == "t5":
            step_model = None if method == "zerogr-hf-cache" else self.step_model(partial)
            run = HFGenerator(self.model, self.index, beam_width=beam, token_offsets=self.offsets,
                              step_model=step_model, prefill="auto" if self.stage else "outside").serving
        else:
            run = StepDecoder(self.step_model(partial), self.index, self.head, beam_width=beam,
                              band_offsets=self.offsets, prefill="auto" if self.stage else "outside")

        def ours(ids, mask):
            result = run.decode(ids, mask)
            engine = run.decoder.gpu_engine
            loop = "reference (eager)" if engine is None else \
                ("engine, CUDA graph, model inside" + (", prefill inside" if run.prefill_in_graph else "")
                 if engine.use_graph and engine.graph_error is None
                 else "engine, eager" + (f" (capture failed: {engine.graph_error})" if engine.graph_error else ""))

            def valid():
                finite = result.scores > float("-inf")
                return float(((result.item_rows >= 0) & finite).sum() / finite.sum().clamp(min=1))
            return result, valid, loop
        return ours
