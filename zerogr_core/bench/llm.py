"""LLM-scale generative recommendation: a Qwen3-1.7B-shaped recommender, SID-GR's matrix.

``python -m zerogr_core.bench.llm --out DIR`` builds the ``qwen3-1.7b`` shape
(:mod:`zerogr_core.models.qwen3`) with random weights in bf16 on the GPU, a synthetic
catalog of 10^7 items with 3-level SIDs of 8,192 codes (``watch-like``), its index on the
GPU, and measures through the public path (context token ids in, item ids out):

* ``zerogr`` filtering first end to end: the staged prefill and the 3 decode steps in
  one CUDA graph of the engine;
* ``prefill`` alone (its own CUDA graph per length bucket) and ``decode`` alone (the
  engine's graph of the 3 steps after an eager prefill), CUDA events, median over
  rotated inputs after warm-up;
* ``zerogr-score-first`` and ``zerogr-unconstrained`` (reference decode, eager);
* Hugging Face ``generate`` constrained (``prefix_allowed_tokens_fn``) and unconstrained,
  at the shapes listed in ``hf_shapes`` only (one call takes seconds);
* peak memory, prefill and decode MFU against the measured bf16 peak, the decode's share
  of the measured HBM copy bandwidth, kernel tables (end to end, prefill, decode) at the
  first context and the largest batch;
* a bf16 agreement check: scoring first, one request at a time, against
  :class:`~zerogr_core.hf.HFStepModel` (Hugging Face's own cached forward) on the same weights.

``--quick`` runs the ``tiny`` shape on the CPU in seconds (what the test suite runs).
Writes ``llm.json`` (+ ``.jsonl``, ``.csv``) and ``llm.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ..arg_types import seconds, to_int, whole
from ..errors import Parser, UsageError, ZeroGRError
from .llm_agreement import agreement

#: Ceilings measured on the lent H200 (device notes): bf16 GEMM and device copy bandwidth.
H200_BF16_TFLOPS = 790.0
H200_COPY_TBPS = 4.3

#: SID-GR's published figures (H100, Qwen3-1.7B, beam 256, 3 tokens, unconstrained), ms:
#: (context, batch) -> (total, prefill, decode).
SID_GR = {(1000, 1): (17.6, 7.0, 10.0), (1000, 8): (93.2, 46.5, 43.7), (5000, 1): (42.3, 31.0, 10.7),
          (5000, 8): (307.9, 253.3, 51.4)}
#: The issue's targets (filtering first, item-constrained, end to end), ms.
TARGETS = {(1000, 1): 10.0, (1000, 8): 55.0, (5000, 8): 270.0}


@dataclass(frozen=True)
class LLMBenchConfig:
    """One run of the benchmark.

    Attributes
    ----------
    model : str
        A :data:`~zerogr_core.models.qwen3.QWEN3_PRESETS` key.
    catalog : str
        Synthetic preset (:data:`~zerogr_core.catalog.synth.SYNTH_PRESETS`).
    n_items : int
    codebook : int or None
        Codebook of every level (None: the preset's).
    contexts, batches : tuple of int
        The matrix, at ``beam``.
    beam : int
    extra_beams : tuple of int
        Also measured at the first context, batch 1.
    hf_shapes : tuple of (context, batch)
        Where Hugging Face ``generate`` runs.
    agreement_requests : int
        Requests of the agreement check (one at a time, first context).
    agreement_float32 : bool
        Also compare both bf16 paths with the float32 computation over the same weights
        (:mod:`zerogr_core.bench.llm_agreement`).
    repeats, warmup, rotations : int
        Timed calls, untimed calls, distinct input sets cycled through.
    context_bucket : int
    device, dtype : str
    budget_s : float
        Shapes not started within this many seconds are recorded as skipped.
    cpu_threads : int or None
        Torch's CPU threads (the quick run's tiny matrices only lose to thread wake-ups).
    shapes : tuple of (context, batch) or None
        Only these shapes, at ``beam`` (no ``extra_beams``), instead of the matrix.
    profile_all : bool
        Kernel tables at every shape (default: the first context at the largest batch).
    partial_last_step : bool
        Filtering first's last step runs the layers on the beams that branch only
        (``Qwen3StepModel(partial_last_step=...)``, on by default).
    """

    model: str = "qwen3-1.7b"
    catalog: str = "watch-like"
    n_items: int = 10_000_000
    codebook: int | None = None
    contexts: tuple = (1000, 5000)
    batches: tuple = (1, 2, 4, 8)
    beam: int = 256
    extra_beams: tuple = (128, 512)
    hf_shapes: tuple = ((1000, 1),)
    agreement_requests: int = 40
    agreement_float32: bool = True
    repeats: int = 10
    warmup: int = 3
    rotations: int = 3
    # 64: a 1,000- or 5,000-token context pads to 1,024 / 5,056 (256 padded 5,000 to 5,120:
    # 2.4 % more prefill work)
    context_bucket: int = 64
    device: str = "cuda"
    dtype: str = "bfloat16"
    budget_s: float = 380.0
    cpu_threads: int | None = None
    shapes: tuple | None = None
    profile_all: bool = False
    partial_last_step: bool = True


LLM_PRESETS = {
    "h200": LLMBenchConfig(),
    "quick": LLMBenchConfig(model="tiny", n_items=20_000, codebook=64, contexts=(16, 40), batches=(1, 2), beam=8,
                            extra_beams=(4, 16), hf_shapes=((16, 1),), agreement_requests=3, repeats=2, warmup=1,
                            rotations=2, context_bucket=16, device="cpu", dtype="float32", budget_s=600.0,
                            cpu_threads=1),
}


def prefill_flops(preset, batch: int, context: int) -> float:
    """FLOPs of a prefill's real tokens: 2 per layer parameter and token, plus causal attention."""
    attn = 2.0 * batch * context * context * preset.heads * preset.head_dim * preset.layers
    return 2.0 * preset.non_embedding_params() * batch * context + attn


def decode_flops(preset, batch: int, beam: int, context: int, steps: int) -> float:
    """FLOPs of the decode's model steps: every beam's token through the layers, attending to its context."""
    rows = batch * beam
    attn = 4.0 * rows * context * preset.heads * preset.head_dim * preset.layers
    return steps * (2.0 * preset.non_embedding_params() * rows + attn)


def decode_bytes(preset, batch: int, context: int, elem: int, steps: int) -> float:
    """Bytes the decode's model steps must read: the layer weights and the context KV, once per step."""
    kv = 2.0 * preset.layers * batch * preset.kv_heads * context * preset.head_dim * elem
    return steps * (preset.non_embedding_params() * elem + kv)


class Workload:
    """Model, catalog and index of a run, and the servings measured on them."""

    def __init__(self, cfg: LLMBenchConfig, log):
        from .. import build_index
        from ..catalog.synth import generate
        from ..models.qwen3 import build_random
        from ..timing import Stopwatch

        self.cfg, self.log = cfg, log
        # how the step models run their weight GEMMs (Qwen3StepModel's ``projections``; an A/B may switch it)
        self.projections = "model"
        # whether the last step runs on the beams that branch only (an A/B may switch it)
        self.partial_last_step = cfg.partial_last_step
        self.device = torch.device(cfg.device)
        self.dtype = getattr(torch, cfg.dtype)
        with Stopwatch(self.device) as sw:
            self.model, self.preset = build_random(cfg.model, device=self.device, dtype=self.dtype)
        self.model_s = sw.seconds
        with Stopwatch() as sw:
            self.catalog = generate(cfg.catalog, cfg.n_items, seed=0, codebook=cfg.codebook)
        self.catalog_s = sw.seconds
        with Stopwatch(self.device) as sw:
            self.index = build_index(self.catalog, device=self.device)
        self.index_s = sw.seconds
        sizes = tuple(int(s) for s in self.catalog.codebook_sizes)
        self.offsets = self.preset.token_offsets
        if len(sizes) != len(self.offsets) or any(a > b for a, b in zip(sizes, self.preset.codebook_sizes)):
            raise ZeroGRError(f"catalog: codebooks {sizes} do not fit the model's SID bands "
                              f"{self.preset.codebook_sizes}")
        log(f"model {cfg.model} {self.model_s:.1f} s, catalog {self.catalog.n_items:,} items {self.catalog_s:.1f} s, "
            f"index on {self.device} {self.index_s:.1f} s")

    def step_model(self, model=None):
        from ..models.qwen3 import Qwen3StepModel

        return Qwen3StepModel(self.model if model is None else model, self.offsets,
                              context_bucket=self.cfg.context_bucket, projections=self.projections,
                              partial_last_step=self.partial_last_step)

    def serving(self, order: str, prefill: str, beam: int, model=None):
        """A :class:`~zerogr_core.models.protocol.StepDecoder` of a fresh step model (its own buffers)
        over the run's model, or over ``model`` (the same weights in another dtype)."""
        from ..models.protocol import StepDecoder

        sm = self.step_model(model)
        return StepDecoder(sm, self.index, sm.head, beam_width=beam, order=order, band_offsets=self.offsets,
                           prefill=prefill)

    def inputs(self, batch: int, context: int, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(1, self.preset.base_vocab, (batch, context), generator=gen).to(self.device)


def _median(samples) -> float:
    return float(statistics.median(samples))


def _timed(fn, device, cfg, before) -> float:
    from ..timing import time_runs

    return _median(time_runs(fn, device, repeats=cfg.repeats, warmup=cfg.warmup, before=before))


def _peak_reset(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gb(device):
    return round(torch.cuda.max_memory_allocated(device) / 1e9, 2) if device.type == "cuda" else None


def _release(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_shape(w: Workload, context: int, batch: int, beam: int) -> list[dict]:
    """Records of every ZeroGR method at one shape (ms, medians)."""
    from ..timing import capture, time_runs

    cfg, dev, preset = w.cfg, w.device, w.preset
    sets = [w.inputs(batch, context, 1000 * batch + context + r) for r in range(cfg.rotations)]
    base = dict(context=context, batch=batch, beam=beam, levels=len(w.offsets))
    records = []
    cur = {"i": 0}

    def pick(i):
        cur["i"] = i % len(sets)

    def items(result):
        return result.item_ids(w.catalog)

    # filtering first, end to end: stage + one graph (prefill inside) + item ids
    _peak_reset(dev)
    run = w.serving("filter-first", "auto", beam)
    out = {}

    def e2e():
        out["r"] = run.decode(sets[cur["i"]])
        out["ids"] = items(out["r"])

    e2e_ms = _timed(e2e, dev, cfg, pick)
    ids = out["ids"]
    valid = float((ids >= 0).mean())
    in_catalog = bool(np.isin(ids[ids >= 0], w.catalog.item_ids).all())
    engine = run.decoder.gpu_engine
    loop = "reference (eager)" if engine is None else \
        ("engine graph, prefill inside" if run.prefill_in_graph else f"engine ({engine.graph_error or 'eager'})")
    e2e_peak = _peak_gb(dev)
    profiled = dev.type == "cuda" and beam == cfg.beam and (
        cfg.profile_all or (context, batch) == (cfg.contexts[0], max(cfg.batches)))
    profiles = {"kernel_profile": profile_call(e2e, dev)} if profiled else {}
    del run
    _release(dev)

    # prefill alone: its own graph per bucket
    sm = w.step_model()
    sm.stage(sets[0], beam_width=beam)
    if dev.type == "cuda":
        graph, _ = capture(sm.run_prefill)
        fn = graph.replay
    else:
        graph, fn = None, sm.run_prefill
    prefill_ms = _median(time_runs(fn, dev, repeats=cfg.repeats, warmup=cfg.warmup,
                                   before=lambda i: sm.stage(sets[i % len(sets)], beam_width=beam)))
    if profiled:
        profiles["prefill_profile"] = profile_call(fn, dev)
    del graph, sm
    _release(dev)

    # decode alone: eager prefill outside, the engine's graph of the L steps
    run = w.serving("filter-first", "outside", beam)
    smd = run.step_model

    def decode_only():
        out["ids"] = items(run.decoder.decode(smd, batch))

    decode_ms = _timed(decode_only, dev, cfg, lambda i: smd.prefill(sets[i % len(sets)], beam_width=beam))
    if profiled:
        profiles["decode_profile"] = profile_call(decode_only, dev)
    del run, smd
    _release(dev)

    flops = prefill_flops(preset, batch, context)
    elem = torch.finfo(w.dtype).bits // 8
    dbytes = decode_bytes(preset, batch, context, elem, len(w.offsets) - 1)
    dflops = decode_flops(preset, batch, beam, context, len(w.offsets) - 1)
    key = (context, batch)
    rec = dict(base, method="zerogr", order="filter-first", total_ms=e2e_ms, prefill_ms=prefill_ms,
               decode_ms=decode_ms, peak_gb=e2e_peak, valid_fraction=valid, items_in_catalog=in_catalog, loop=loop,
               prefill_tflop=flops / 1e12, prefill_mfu=(flops / (prefill_ms * 1e-3)) / (H200_BF16_TFLOPS * 1e12),
               decode_gb=dbytes / 1e9, decode_hbm_share=(dbytes / (decode_ms * 1e-3)) / (H200_COPY_TBPS * 1e12),
               decode_tflop=dflops / 1e12, decode_mfu=(dflops / (decode_ms * 1e-3)) / (H200_BF16_TFLOPS * 1e12),
               target_ms=TARGETS.get(key) if beam == 256 else None,
               sid_gr_ms=SID_GR.get(key, (None,))[0] if beam == 256 else None)
    if rec["target_ms"] is not None:
        rec["met"] = e2e_ms <= rec["target_ms"]
    rec.update(profiles)
    records.append(rec)
    w.log(f"[{context}x{batch} M{beam}] zerogr {e2e_ms:.2f} ms (prefill {prefill_ms:.2f}, decode {decode_ms:.2f}), "
          f"peak {e2e_peak} GB, MFU {rec['prefill_mfu']:.2f}, HBM {rec['decode_hbm_share']:.2f}, {loop}")
    for name, t in profiles.items():
        if "span_us" in t:
            w.log(f"[{context}x{batch} M{beam}]   {name}: {t['kernels_per_decode']} GPU operations, "
                  f"{t['kernel_us_sum'] / 1e3:.2f} ms of kernels over a span of {t['span_us'] / 1e3:.2f} ms, "
                  f"{t['gap_us'] / 1e3:.2f} ms idle between them"
                  + "".join(f"; {g['us']:.1f} µs before {g['before'][:40]}" for g in t["widest_gaps"][:2]))

    # the other two orders through the same public path: the reference loop (the GPU engine
    # serves filtering first only), staged prefill and decode captured in one CUDA graph as
    # the engine does, so the three orders compare graphed against graphed
    for order in ("score-first", "unconstrained"):
        _peak_reset(dev)
        fn, loop, holder = reference_graph(w, order, beam, sets, batch)
        ms = _timed(fn, dev, replace(cfg, repeats=max(1, cfg.repeats // 2), warmup=1), holder.load)
        ids = items(holder.result)
        rec = dict(base, method=f"zerogr-{order}", order=order, total_ms=ms, peak_gb=_peak_gb(dev),
                   valid_fraction=float((ids >= 0).mean()), loop=loop)
        if profiled:
            rec["kernel_profile"] = profile_call(fn, dev)
        records.append(rec)
        w.log(f"[{context}x{batch} M{beam}] zerogr-{order} {ms:.2f} ms ({loop})")
        del fn, holder
        _release(dev)
    return records


class _Staged:
    """A reference-loop serving whose requests are staged (static buffers) before each call."""

    def __init__(self, run, sets, batch: int):
        self.run, self.sets, self.batch, self.result = run, sets, batch, None

    def load(self, i: int) -> None:
        self.run.step_model.stage(self.sets[i % len(self.sets)], beam_width=self.run.decoder.beam_width)

    def decode(self):
        return self.run.decoder.decode(self.run.step_model, self.batch)


def reference_graph(w: Workload, order: str, beam: int, sets, batch: int):
    """``(fn, loop, holder)``: one call of ``order`` through the reference loop, prefill staged
    inside, replayed from a CUDA graph when it captures (else eager, the reason in ``loop``);
    ``holder.load(i)`` stages input set ``i`` and ``holder.result`` is the last call's result."""
    from ..timing import capture

    holder = _Staged(w.serving(order, "inside", beam), sets, batch)
    holder.load(0)
    if w.device.type != "cuda":
        def eager():
            holder.result = holder.decode()
        return eager, "reference (eager, CPU)", holder
    try:
        graph, out = capture(holder.decode)
    except Exception as exc:  # noqa: BLE001 - a loop that synchronises is timed eagerly, reason recorded
        torch.cuda.synchronize()

        def eager():
            holder.result = holder.decode()
        return eager, f"reference (eager: capture failed, {type(exc).__name__}: {str(exc)[:120]})", holder
    holder.result = out

    def replay():
        graph.replay()
    replay.graph = graph
    return replay, "reference loop, one CUDA graph, prefill inside", holder


def profile_call(fn, device, top: int = 25) -> dict:
    """One call of ``fn`` (after one unprofiled call) under ``torch.profiler``: its GPU events as
    :func:`~zerogr_core.bench.kernel_profile.kernel_table` sums them (``kernels``: the ``top``
    kernels by GPU time, ``kernel_us_sum``, ``busy_us``, ``span_us`` and ``gap_us``, the GPU's idle
    time between the call's first and last kernel)."""
    from torch.profiler import ProfilerActivity, profile

    from .kernel_profile import kernel_table

    fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    return kernel_table(prof.events(), 1, top)


def measure_hf(w: Workload, context: int, batch: int, beam: int) -> list[dict]:
    """Hugging Face ``generate``, constrained and unconstrained (one timed call each)."""
    from ..timing import Stopwatch
    from .e2e import CatalogPrefixes

    L = len(w.offsets)
    ids = w.inputs(batch, context, 7)
    prefixes = CatalogPrefixes(w.catalog, w.offsets, start=context)
    records = []
    for constrained in (True, False):
        kwargs = dict(num_beams=beam, num_return_sequences=beam, do_sample=False, max_new_tokens=L,
                      min_new_tokens=L, length_penalty=0.0, early_stopping=True, pad_token_id=0)
        if constrained:
            kwargs["prefix_allowed_tokens_fn"] = prefixes
        method = "hf-constrained" if constrained else "hf-unconstrained"
        _peak_reset(w.device)
        try:
            with torch.no_grad(), Stopwatch(w.device) as sw:
                out = w.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
            rec = dict(method=method, total_ms=sw.ms, peak_gb=_peak_gb(w.device),
                       valid_fraction=prefixes.valid(out[:, context:context + L]), timed_calls=1)
        except torch.OutOfMemoryError:
            rec = dict(method=method, error="out of memory", peak_gb=_peak_gb(w.device))
        records.append(dict(context=context, batch=batch, beam=beam, levels=L, **rec))
        w.log(f"[{context}x{batch} M{beam}] {method} {rec.get('total_ms', float('nan')):.0f} ms")
        _release(w.device)
    return records


def _top1_text(share: float, interval=None) -> str:
    """A top-1 share with its 95 % interval when the record has one (older records do not)."""
    return f"{share:.0%}" if interval is None else f"{share:.0%} (95 % interval {interval[0]:.0%}–{interval[1]:.0%})"


def markdown(records: list[dict], cfg: LLMBenchConfig, env: dict) -> str:
    """A small Markdown table of the run."""
    lines = [f"# Qwen3 recommender ({cfg.model}, random weights, {cfg.dtype}), {cfg.n_items:,} items",
             "", f"GPU: {env.get('gpu')}, torch {env.get('torch')}, triton {env.get('triton')}; "
             f"milliseconds, medians of {cfg.repeats} calls over {cfg.rotations} rotated input sets.", "",
             "| context | batch | beam | ZeroGR filter-first | prefill | decode | peak GB | prefill MFU | "
             "decode MFU | decode HBM share | score-first | unconstrained | target | SID-GR (H100) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    other = {(r["context"], r["batch"], r["beam"], r["method"]): r for r in records if "total_ms" in r}

    def f(v, spec="{:.2f}"):
        return "" if v is None else spec.format(v)
    for r in records:
        if r.get("method") != "zerogr":
            continue
        k = (r["context"], r["batch"], r["beam"])
        sf = other.get(k + ("zerogr-score-first",), {}).get("total_ms")
        un = other.get(k + ("zerogr-unconstrained",), {}).get("total_ms")
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {f(r['total_ms'])} | {f(r['prefill_ms'])} | {f(r['decode_ms'])} | "
                     f"{f(r['peak_gb'], '{}')} | {f(r['prefill_mfu'])} | {f(r.get('decode_mfu'))} | "
                     f"{f(r['decode_hbm_share'])} | {f(sf)} | "
                     f"{f(un)} | {f(r.get('target_ms'), '≤ {:g}')} | {f(r.get('sid_gr_ms'), '{:g}')} |")
    hf = [r for r in records if str(r.get("method", "")).startswith("hf-")]
    if hf:
        lines += ["", "| Hugging Face generate | context | batch | beam | ms | peak GB |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['method']} | {r['context']} | {r['batch']} | {r['beam']} | "
                  f"{f(r.get('total_ms'), '{:.0f}') or r.get('error')} | {f(r.get('peak_gb'), '{}')} |" for r in hf]
    for r in records:
        if r.get("method") == "agreement":
            lines += ["", f"{cfg.dtype} agreement with Hugging Face's cached forward (scoring first, {r['requests']} "
                          f"requests, context {r['context']}, beam {r['beam']}): top-1 item "
                          f"{_top1_text(r['top1_agreement'], r.get('top1_interval95'))}, top-{r['beam']} overlap "
                          f"{r['topk_overlap']:.1%}."]
            both = r.get("hf_attentions") or {}
            if "top1" in both:
                lines += ["", f"Hugging Face's own {cfg.dtype} forward with SDPA against eager attention, the same "
                              f"requests: top-1 item {_top1_text(both['top1'], both.get('interval95'))}, "
                              f"top-{r['beam']} overlap {both['topk_overlap']:.1%}."]
            exact = r.get("float32") or {}
            if "ours" in exact:
                by = "ours" if "Qwen3StepModel" in exact.get("reference", "") else "Hugging Face's"
                lines += ["", f"Against the float32 computation ({by} forward, the same weights upcast): "
                              f"top-1 item ours {exact['ours']['top1']:.0%}, Hugging Face {cfg.dtype} "
                              f"{exact['hf']['top1']:.0%}; top-{r['beam']} overlap {exact['ours']['topk_overlap']:.1%} "
                              f"and {exact['hf']['topk_overlap']:.1%}."]
        if r.get("method") == "skipped":
            lines += ["", f"Skipped (time budget): {r['what']}."]
    return "\n".join(lines) + "\n"


def run(cfg: LLMBenchConfig, out: Path, command: str, log=print) -> list[dict]:
    """Run the benchmark and write ``llm.json``/``.jsonl``/``.csv`` and ``llm.md`` into ``out``."""
    from ..environment import environment
    from .results import ResultWriter

    t0 = time.perf_counter()
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ZeroGRError("device: cuda was asked for but no GPU is visible (use --quick for the CPU run)")
    if cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    env = environment(device)
    writer = ResultWriter(out / "llm.json", out / "llm.csv", env, command)
    w = Workload(cfg, log)
    writer.add(dict(method="setup", config=asdict(cfg), model_s=w.model_s, catalog_s=w.catalog_s,
                    index_s=w.index_s, catalog_items=w.catalog.n_items, codebooks=list(w.catalog.codebook_sizes),
                    max_segments=[s.max_segment for s in w.index.steps], parameters=sum(
                        p.numel() for p in w.model.parameters())))
    if cfg.shapes is None:
        shapes = [(c, b, cfg.beam) for c in cfg.contexts for b in cfg.batches]
    else:
        shapes = [(int(c), int(b), cfg.beam) for c, b in cfg.shapes]
    # the target shapes first, so a run cut by its budget still has them
    shapes.sort(key=lambda s: (s[:2] not in TARGETS, s))
    if cfg.shapes is None:
        shapes += [(cfg.contexts[0], 1, m) for m in cfg.extra_beams]
    # the agreement check is correctness evidence: it runs first and the budget never drops it (the
    # budget counts from the start, the model's build included)
    todo = [("agreement", (cfg.contexts[0], 1, cfg.beam))] if cfg.agreement_requests else []
    after_first = len(todo) + 1           # Hugging Face right after the first shape
    todo += [("shape", s) for s in shapes]
    todo[after_first:after_first] = [("hf", (c, b, cfg.beam)) for c, b in cfg.hf_shapes]
    with torch.no_grad():
        for what, (c, b, m) in todo:
            if what != "agreement" and time.perf_counter() - t0 > cfg.budget_s:
                writer.add(dict(method="skipped", what=f"{what} context {c} batch {b} beam {m}"))
                continue
            if what == "shape":
                recs = measure_shape(w, c, b, m)
            elif what == "hf":
                recs = measure_hf(w, c, b, m)
            else:
                recs = [agreement(w, c, m)]
            for r in recs:
                writer.add(r)
    writer.add(dict(method="wall", seconds=time.perf_counter() - t0))
    writer.close()
    (out / "llm.md").write_text(markdown(writer.records, cfg, env))
    return writer.records


def _shapes(text: str) -> tuple:
    """The argparse ``type`` of ``--shapes``: ``"1000x1,5000x8"`` -> ``((1000, 1), (5000, 8))``."""
    try:
        shapes = tuple(tuple(to_int(v, least=1) for v in s.split("x")) for s in text.split(","))
    except ValueError:
        shapes = ()
    if not shapes or any(len(s) != 2 for s in shapes):
        raise argparse.ArgumentTypeError(f"expected CONTEXTxBATCH[,…] with positive integers, got {text!r}")
    return shapes


def main(argv=None) -> int:
    p = Parser(prog="python -m zerogr_core.bench.llm",
               description="Qwen3-1.7B-shaped recommender: SID-GR's matrix on this GPU")
    p.add_argument("--out", required=True, help="folder for llm.json, llm.csv, llm.md")
    p.add_argument("--quick", action="store_true", help="the tiny shape on the CPU (seconds)")
    p.add_argument("--budget-s", type=seconds(), default=None, help="skip the shapes not started after this many s")
    p.add_argument("--repeats", type=whole(1), default=None)
    p.add_argument("--shapes", type=_shapes, default=None,
                   help="only these shapes, e.g. 1000x1,5000x8 (context x batch)")
    p.add_argument("--profile", action="store_true", help="kernel tables at every shape")
    p.add_argument("--no-hf", action="store_true", help="skip Hugging Face generate")
    p.add_argument("--partial-last-step", action=argparse.BooleanOptionalAction, default=None,
                   help="filtering first's last step on the beams whose prefix holds more than one item only "
                        "(default: on)")
    p.add_argument("--agreement-requests", type=whole(0), default=None,
                   help="requests of the agreement check against Hugging Face (0 skips it)")
    try:
        a = p.parse_args(argv)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    cfg = LLM_PRESETS["quick" if a.quick else "h200"]
    if a.shapes is not None:
        cfg = replace(cfg, shapes=a.shapes)
    if a.profile:
        cfg = replace(cfg, profile_all=True)
    if a.no_hf:
        cfg = replace(cfg, hf_shapes=())
    if a.partial_last_step is not None:
        cfg = replace(cfg, partial_last_step=a.partial_last_step)
    if a.budget_s is not None:
        cfg = replace(cfg, budget_s=a.budget_s)
    if a.agreement_requests is not None:
        cfg = replace(cfg, agreement_requests=a.agreement_requests)
    if a.repeats is not None:
        cfg = replace(cfg, repeats=a.repeats)
    command = "python -m zerogr_core.bench.llm " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        run(cfg, Path(a.out), command)
    except ZeroGRError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
