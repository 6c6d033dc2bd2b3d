"""``python -m zerogr_core bench-e2e``: end-to-end recommendation latency with a TIGER-size T5.

Every method decodes the same requests with the same ``T5ForConditionalGeneration``
(random weights) over the same catalog and returns ``beam`` items per request; the time
covers everything from input ids on the device to the returned beams (encoder included).

Methods
-------
hf-constrained
    Hugging Face ``generate(num_beams=M, num_return_sequences=M,
    prefix_allowed_tokens_fn=...)``, as the open TIGER and GENRE ports call it (the prefix
    function answers from the sorted SID table, memoised per prefix).
hf-unconstrained
    The same ``generate`` with no constraint.
zerogr
    Filtering first in ZeroGR's engine, the model as :class:`~zerogr_core.models.t5.T5StepModel`
    (one encoder memory per request, static caches; whole decode in one CUDA graph on a GPU).
zerogr-hf-cache
    Filtering first with the model's own Hugging Face caches (:class:`~zerogr_core.hf.HFStepModel`).
score-first
    STATIC-style masking (full-vocabulary softmax, then the mask) in ZeroGR's reference
    loop with the T5 step model.
unconstrained
    Unconstrained beam search in ZeroGR's reference loop with the T5 step model.

``--model decoder-only`` runs the ZeroGR methods with the deployable decoder-only
recommender (:mod:`zerogr_core.models.decoder_only`: 12 layers, d 1024, 256 history items,
random weights) over the same catalog; Hugging Face has no such model to compare.

Examples::

    python -m zerogr_core bench-e2e --quick --out /tmp/e2e            # CPU smoke run
    python -m zerogr_core bench-e2e --batch 1,8,32 --beam 32,128,256  # the H200 run
    python -m zerogr_core bench-e2e --model decoder-only --dtype bf16
"""
from __future__ import annotations

import argparse
import functools
import shlex
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

METHODS = ("zerogr", "zerogr-hf-cache", "score-first", "unconstrained", "hf-constrained", "hf-unconstrained")
T5_ONLY = ("zerogr-hf-cache", "hf-constrained", "hf-unconstrained")
MODELS = ("t5", "decoder-only")
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
SPECIAL_TOKENS = 3          # pad 0, eos 1, unk 2; SID level l starts at 3 + sum(|V_<l|)


@dataclass(frozen=True)
class E2EConfig:
    """Model and catalog of the end-to-end benchmark.

    Attributes
    ----------
    d_model, d_kv, num_heads, d_ff, layers : int
        T5 shape (``layers`` encoder and ``layers`` decoder layers).
    codebook, levels : int
        Catalog of ``levels`` levels of ``codebook`` tokens.
    n_items : int
        SIDs in the catalog.
    history : int
        Most history items per request (each is ``levels`` encoder tokens); requests
        carry between half of it and all of it (right padding).
    """

    d_model: int = 128
    d_kv: int = 64
    num_heads: int = 6
    d_ff: int = 1024
    layers: int = 4
    codebook: int = 256
    levels: int = 4
    n_items: int = 1_000_000
    history: int = 20

    @classmethod
    def preset(cls, name: str) -> "E2EConfig":
        """``"tiger"`` (TIGER-size T5, 4 × 256 catalog of 10^6 SIDs) or ``"quick"`` (CPU/CI)."""
        presets = {"tiger": cls(),
                   "quick": cls(d_model=32, d_kv=8, num_heads=2, d_ff=64, layers=1, codebook=16, n_items=2000,
                                history=6)}
        if name not in presets:
            from ..errors import ZeroGRError

            raise ZeroGRError(f"unknown bench-e2e preset {name!r} (choose from {', '.join(presets)})")
        return presets[name]

    @property
    def token_offsets(self) -> tuple[int, ...]:
        return tuple(SPECIAL_TOKENS + level * self.codebook for level in range(self.levels))


def build_catalog(cfg: E2EConfig, seed: int):
    """A synthetic ``levels`` × ``codebook`` catalog of ``n_items`` SIDs (TIGER-like fan-outs)."""
    from ..catalog.synth import SynthConfig, generate

    fanouts = tuple(min(float(cfg.codebook), f) for f in (40.0, 40.0, 2.5, 1.5, 1.5)[:cfg.levels - 1])
    synth = SynthConfig(name=f"tiger-{cfg.levels}x{cfg.codebook}", codebook_sizes=(cfg.codebook,) * cfg.levels,
                        fanouts=fanouts, dispersion=(None,) * (cfg.levels - 1))
    return generate(synth, cfg.n_items, seed=seed)


def build_model(cfg: E2EConfig, device, seed: int):
    """A T5 with random weights; vocabulary = special tokens + every level's band."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.T5Config(vocab_size=SPECIAL_TOKENS + cfg.levels * cfg.codebook, d_model=cfg.d_model,
                                   d_kv=cfg.d_kv, d_ff=cfg.d_ff, num_layers=cfg.layers, num_decoder_layers=cfg.layers,
                                   num_heads=cfg.num_heads, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
                                   dropout_rate=0.0)
    return transformers.T5ForConditionalGeneration(config).to(device).eval()


def requests(catalog, cfg: E2EConfig, batch: int, device, seed: int):
    """Input ids (batch, history · levels) of random catalog items, right-padded, and their mask."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, cfg.history // 2), cfg.history + 1, batch)
    rows = rng.integers(0, catalog.n_items, (batch, cfg.history))
    ids = catalog.sids[rows].astype(np.int64) + np.array(cfg.token_offsets)
    ids = ids.reshape(batch, cfg.history * cfg.levels)
    mask = np.arange(cfg.history * cfg.levels)[None, :] < (lengths * cfg.levels)[:, None]
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


def register(subparsers) -> None:
    """Add the ``bench-e2e`` subcommand."""
    p = subparsers.add_parser(
        "bench-e2e", help="end-to-end latency with a TIGER-size T5: ZeroGR vs Hugging Face generate",
        description="Decode the same requests with one T5 (random weights) over one catalog: ZeroGR filtering first "
                    "(T5 step model, and HF caches), score-first and unconstrained in ZeroGR's loop, and Hugging Face "
                    "generate with prefix_allowed_tokens_fn and unconstrained. Results go to JSON and CSV.")
    p.add_argument("--model", default="t5", choices=MODELS,
                   help="t5: TIGER-size T5ForConditionalGeneration, all methods (default); decoder-only: the "
                        "deployable decoder-only recommender (12 layers, d 1024, 256 history items), ZeroGR methods")
    p.add_argument("--preset", default=None, help="tiger (default) or quick")
    p.add_argument("--dtype", default="fp32", choices=tuple(DTYPES), help="model dtype (default fp32)")
    p.add_argument("--quick", action="store_true", help="CPU/CI mode: the quick preset, batches 1,2, beam 4, 2 repeats")
    p.add_argument("--methods", default=None, help=f"comma list of {', '.join(METHODS)} (default: all)")
    p.add_argument("--batch", default=None, help="batch sizes (default 1,8,32)")
    p.add_argument("--beam", default=None, help="beam widths (default 32,128,256)")
    p.add_argument("--items", default=None, metavar="N", help="catalog SIDs (default: the preset's, 1e6)")
    p.add_argument("--repeats", default=None, help="timed runs per measurement (default 20; quick 2)")
    p.add_argument("--hf-repeats", default=None, help="timed runs of the HF methods (default 3; quick 1)")
    p.add_argument("--warmup", default=None, help="untimed runs first (default 2; quick 1)")
    p.add_argument("--budget-s", default=None, metavar="S", help="start no new measurement after S seconds")
    p.add_argument("--seed", default="0")
    p.add_argument("--device", default=None, help="torch device (default cuda when available, else cpu)")
    p.add_argument("--out", default="bench/results/e2e", metavar="DIR",
                   help="result folder (default bench/results/e2e)")
    p.set_defaults(handler=run_e2e)


def _ints(text, option: str, default):
    from ..catalog.samples import parse_count
    from ..errors import ZeroGRError

    if text is None:
        return default
    values = [parse_count(t, option) for t in text.replace(",", " ").split()]
    if not values or min(values) < 1:
        raise ZeroGRError(f"{option}: give positive integers, got {text!r}")
    return values


def run_e2e(args: argparse.Namespace) -> int:
    import torch

    from ..errors import ZeroGRError
    from .env import environment
    from .results import ResultWriter

    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ZeroGRError("bench-e2e needs transformers (pip install -r requirements.txt)") from None
    quick = args.quick
    cfg = E2EConfig.preset(args.preset or ("quick" if quick else "tiger"))
    if args.items is not None:
        cfg = replace(cfg, n_items=_ints(args.items, "--items", None)[0])
    allowed = METHODS if args.model == "t5" else tuple(m for m in METHODS if m not in T5_ONLY)
    methods = list(allowed) if args.methods is None else [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in allowed:
            raise ZeroGRError(f"--methods: unknown method {m!r} for --model {args.model}; choose from "
                              f"{', '.join(allowed)}")
    dtype = getattr(torch, DTYPES[args.dtype])
    batches = _ints(args.batch, "--batch", [1, 2] if quick else [1, 8, 32])
    beams = _ints(args.beam, "--beam", [4] if quick else [32, 128, 256])
    repeats = _ints(args.repeats, "--repeats", [2 if quick else 20])[0]
    hf_repeats = _ints(args.hf_repeats, "--hf-repeats", [1 if quick else 3])[0]
    warmup = int(args.warmup) if args.warmup is not None else (1 if quick else 2)
    seed = int(args.seed)
    budget = float(args.budget_s) if args.budget_s is not None else None
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False           # strict FP32, as the other suites
        torch.backends.cudnn.allow_tf32 = False
    elif quick:
        torch.set_num_threads(1)

    env = environment(device)
    parts = ["python", "-m", "zerogr_core", "bench-e2e", "--model", args.model, "--dtype", args.dtype,
             "--preset", args.preset or ("quick" if quick else "tiger"),
             "--methods", ",".join(methods), "--batch", ",".join(map(str, batches)), "--beam",
             ",".join(map(str, beams)), "--items", str(cfg.n_items), "--repeats", str(repeats), "--hf-repeats",
             str(hf_repeats), "--warmup", str(warmup), "--seed", str(seed)]
    parts += ["--quick"] if quick else []
    parts += ["--device", str(device)] if device.type != "cuda" else []
    command = shlex.join(parts)
    env["argv"] = shlex.join(sys.argv)
    out = Path(args.out)
    stem = f"e2e-{args.model}-{args.dtype}-{cfg.levels}x{cfg.codebook}-{cfg.n_items}" + ("__quick" if quick else "")
    writer = ResultWriter(out / f"{stem}.json", out / f"{stem}.csv", env, command)
    print(f"bench-e2e: {command}\nbench-e2e: {env['gpu']} | torch {env['torch']} | writing {out / stem}.json",
          flush=True)
    t0 = time.perf_counter()
    try:
        errors = _run(cfg, args.model, dtype, methods, batches, beams, repeats, hf_repeats, warmup, seed, device,
                      writer, env, command, budget, t0)
    finally:
        writer.close()
    print(f"bench-e2e: {len(writer.records)} records in {time.perf_counter() - t0:.1f} s", flush=True)
    return 1 if errors else 0


class Workbench:
    """Catalog, model, requests and the decoders of every method, for one run."""

    def __init__(self, cfg: E2EConfig, kind: str, dtype, device, seed: int):
        import torch

        from ..index import build_index

        self.cfg, self.kind, self.dtype, self.device, self.seed = cfg, kind, dtype, device, seed
        self.catalog = build_catalog(cfg, seed)
        self.index = build_index(self.catalog, device=device)
        if kind == "t5":
            self.model = build_model(cfg, device, seed).to(dtype)
            self.prefix_fn = CatalogPrefixes(self.catalog, cfg.token_offsets, start=1)
            self.fields = dict(model="T5ForConditionalGeneration", d_model=cfg.d_model, d_kv=cfg.d_kv,
                               heads=cfg.num_heads, d_ff=cfg.d_ff, layers=f"{cfg.layers}+{cfg.layers}")
        else:
            from ..models.decoder_only import DecoderOnlyConfig, DecoderOnlyRecommender

            mcfg = DecoderOnlyConfig.preset("tiny" if cfg.codebook < 64 else "deployable", self.catalog.codebook_sizes)
            torch.manual_seed(seed)
            self.model = DecoderOnlyRecommender(mcfg).to(device, dtype).eval()
            self.fields = dict(model="decoder-only (zerogr_core.models.decoder_only)", d_model=mcfg.d_model,
                               heads=mcfg.n_heads, d_ff=mcfg.ff_mult * mcfg.d_model, layers=str(mcfg.n_layers))
        self.parameters = sum(p.numel() for p in self.model.parameters())

    @property
    def history(self) -> int:
        """History items per request (at most)."""
        return self.cfg.history if self.kind == "t5" else self.model.config.max_history

    def inputs(self, batch: int):
        """(input, mask) of ``batch`` requests: T5 input ids (right padding) or SID histories (left padding)."""
        import numpy as np
        import torch

        if self.kind == "t5":
            return requests(self.catalog, self.cfg, batch, self.device, self.seed + batch)
        rng = np.random.default_rng(self.seed + batch)
        t = self.history
        lengths = rng.integers(max(1, t // 2), t + 1, batch)
        rows = rng.integers(0, self.catalog.n_items, (batch, t))
        mask = np.arange(t)[None, :] >= (t - lengths)[:, None]
        history = np.where(mask[..., None], self.catalog.sids[rows].astype(np.int64), 0)
        return torch.from_numpy(history).to(self.device), torch.from_numpy(mask).to(self.device)

    def serving(self, method: str, beam: int):
        """What ``method`` calls per batch: ``fn(inputs, mask) -> (result, valid_fraction, loop)``."""
        import torch

        from ..hf import HFGenerator
        from ..models.protocol import StepDecoder
        from ..models.t5 import T5StepModel

        order = {"score-first": "score-first", "unconstrained": "unconstrained"}.get(method, "filter-first")
        L = self.cfg.levels
        if method.startswith("hf-"):
            constrained = method == "hf-constrained"

            def hf(ids, mask):
                kwargs = dict(input_ids=ids, attention_mask=mask, num_beams=beam, num_return_sequences=beam,
                              do_sample=False, max_new_tokens=L, min_new_tokens=L, length_penalty=0.0,
                              early_stopping=True)
                if constrained:
                    kwargs["prefix_allowed_tokens_fn"] = self.prefix_fn
                with torch.no_grad():
                    out = self.model.generate(**kwargs)
                return out, lambda: self.prefix_fn.valid(out[:, 1:1 + L]), "huggingface generate"
            return hf
        if self.kind == "t5":
            step_model = None if method == "zerogr-hf-cache" else T5StepModel(self.model, self.cfg.token_offsets)
            run = HFGenerator(self.model, self.index, beam_width=beam, token_offsets=self.cfg.token_offsets,
                              order=order, step_model=step_model).serving
        else:
            run = StepDecoder(self.model.step_model(), self.index, self.model.head_weight(), beam_width=beam,
                              order=order, band_offsets=self.model.band_offsets)

        def ours(ids, mask):
            result = run.decode(ids, mask)
            engine = run.decoder.gpu_engine
            loop = "reference (eager)" if engine is None else \
                ("engine, CUDA graph" if engine.use_graph and engine.graph_error is None else "engine, eager")

            def valid():
                finite = result.scores > float("-inf")
                return float(((result.item_rows >= 0) & finite).sum() / finite.sum().clamp(min=1))
            return result, valid, loop
        return ours


def _run(cfg, kind, dtype, methods, batches, beams, repeats, hf_repeats, warmup, seed, device, writer, env, command,
         budget, t0):
    import torch

    from ..timing import summarize, time_runs

    t = time.perf_counter()
    wb = Workbench(cfg, kind, dtype, device, seed)
    print(f"bench-e2e: catalog {wb.catalog.n_items:,} SIDs {cfg.levels}x{cfg.codebook}, {kind} model "
          f"{wb.parameters:,} parameters, set up in {time.perf_counter() - t:.1f} s", flush=True)
    base = dict(suite="e2e", env=env, run_command=command, seed=seed, catalog=f"tiger-{cfg.levels}x{cfg.codebook}",
                n_items=wb.catalog.n_items, codebooks="/".join(map(str, wb.catalog.codebook_sizes)),
                parameters=wb.parameters, history_items=wb.history, dtype=str(dtype).replace("torch.", ""),
                device=str(device), **wb.fields)
    errors = 0
    for beam in beams:
        runners = {}
        for batch in batches:
            if budget is not None and time.perf_counter() - t0 > budget:
                print("bench-e2e: time budget spent; stopping", flush=True)
                return errors
            ids, mask = wb.inputs(batch)
            shape = dict(batch=batch, beam=beam)
            medians, rows = {}, {}
            for method in methods:
                try:
                    if method not in runners:
                        runners[method] = wb.serving(method, beam)
                    run = runners[method]
                    result, valid, loop = run(ids, mask)
                    if not method.startswith("hf-"):
                        rows[method] = result.item_rows.clone()
                    stats = summarize(time_runs(lambda: run(ids, mask), device, warmup=warmup,
                                                repeats=hf_repeats if method.startswith("hf-") else repeats))
                except torch.cuda.OutOfMemoryError as exc:
                    torch.cuda.empty_cache()
                    writer.add(dict(base, method=method, **shape, error=f"out of memory: {exc}"[:300]))
                    print(f"bench-e2e: {method} batch {batch} beam {beam}: out of memory", flush=True)
                    continue
                medians[method] = stats["median_ms"]
                valid = valid()
                writer.add(dict(base, method=method, loop=loop, **shape, valid_fraction=valid, **stats))
                print(f"bench-e2e: beam {beam:4d} batch {batch:3d} {method:17s} {stats['median_ms']:10.3f} ms "
                      f"valid {valid:.3f} ({loop})", flush=True)
            derived = dict(base, method="derived", **shape)
            if "zerogr" in medians:
                for other in ("hf-constrained", "hf-unconstrained", "zerogr-hf-cache", "score-first"):
                    if other in medians:
                        derived[f"speedup_vs_{other}"] = medians[other] / medians["zerogr"]
                if "unconstrained" in medians:
                    derived["constrained_overhead_vs_unconstrained"] = medians["zerogr"] / medians["unconstrained"] - 1
                if "zerogr-hf-cache" in rows:
                    same = bool(torch.equal(rows["zerogr"], rows["zerogr-hf-cache"]))
                    derived["check_same_items_as_hf_cache"] = same
                    errors += 0 if same else 1
            writer.add(derived)
    return errors
