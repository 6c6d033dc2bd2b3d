"""The benchmark suites. Each writes its records through the session as it goes.

=================  ==========================================================================
suite              what it records
=================  ==========================================================================
headline           whole-decode latency of every method (graph and eager), checks, speedups,
                   the warm-up plan of every shape
beam-sweep         the same over beam widths (default synthetic-7)
codebook-sweep     the same over the codebook size V of synthetic-7
steps              per-step latency of every method (each step's own graph), and the GEMMs
stages             per step: filtering+projection, normalisation (unfused), selection+gather
ablation           step 2 alone: full projection vs naive selective vs slot-based selective
memory             index bytes per step: zerogr vs STATIC-style vs int16 SID table vs host trie
build              index construction: layout streaming (2 and 1 staging buffers), full host
                   then copy, serial, STATIC-style; H2D bandwidth for 60 s / 90 s windows
interference       decode p50/p99 while a streaming (or full-host) rebuild runs beside it
coldstart          seconds to the first decode of a shape in a fresh process, with empty then
                   warm plan and Triton caches (:mod:`.coldstart`)
=================  ==========================================================================
"""
from __future__ import annotations

import shlex
import threading
import time
import traceback
from dataclasses import dataclass, field

import torch

from kernels import filter_slots, full_proj, log_softmax_slots, naive_selective_proj, selective_proj, topk_gather

from ..decode.decoder import Decoder
from ..decode.engine import PLANNED_TOPK, StepOption, StepRunner, step_options
from ..index import IndexConfig, build_index, build_static_index
from ..index.static_style import static_style_bytes, static_style_step_bytes
from .checks import TOLERANCE, check_valid, compare
from .coldstart import suite_coldstart
from .methods import CAPTURABLE, CONSTRAINED, METHODS, ReplayModel, ZeroGRRunner, make_runner
from .summary import ANCHORS, TARGETS
from ..timing import Stopwatch, summarize, synchronize, time_runs, time_step
from .workload import (QUICK_CODEBOOK, CatalogSpec, Workload, default_scale, order_batches, static_step_bytes)

SUITES = ("headline", "beam-sweep", "codebook-sweep", "steps", "stages", "ablation", "memory", "build",
          "interference", "coldstart")
FAST_METHODS = ["zerogr", "static", "static-adapted", "unconstrained"]
@dataclass
class Options:
    """Resolved command-line options (``None``: the suite's default)."""

    suites: list
    catalog: str | None = None
    scale: int | None = None
    methods: list | None = None
    batches: list | None = None
    beams: list | None = None
    configs: list | None = None
    codebooks: list | None = None
    seed: int = 0
    repeats: int | None = None
    warmup: int | None = None
    quick: bool = False
    budget_s: float | None = None
    check: str = "ends"
    build_repeats: int | None = None
    interference_s: float | None = None
    suite_budgets: dict = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    topk_paths: tuple = PLANNED_TOPK

    @property
    def n_sets(self) -> int:
        return 2 if self.quick else 4

    def rep(self) -> int:
        return self.repeats if self.repeats is not None else (3 if self.quick else 30)

    def warm(self) -> int:
        return self.warmup if self.warmup is not None else (1 if self.quick else 5)


def _release(dev: torch.device, *holders) -> None:
    """Release a unit's runners and contexts and hand their cached GPU memory back."""
    for h in holders:
        h.release()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def suite_defaults(suite: str, quick: bool) -> dict:
    """Catalog, batches, beams, configs, methods and codebooks a suite uses unless told."""
    both = [("fp16", 32), ("fp32", 48)] if quick else [("fp16", 1024), ("fp32", 4096)]
    small = [2] if quick else [1, 8, 32]
    d = dict(catalog="search-like", batches=[1, 2] if quick else [1, 2, 4, 8, 16, 32],
             beams=[4] if quick else [128], configs=both, methods=list(METHODS), codebooks=None)
    if suite == "beam-sweep":
        d.update(catalog="synthetic-7", batches=small, beams=[2, 4] if quick else [64, 128, 256],
                 configs=both[:1], methods=list(FAST_METHODS))
    elif suite == "codebook-sweep":
        d.update(catalog="synthetic-7", batches=small, configs=both[:1], methods=list(FAST_METHODS),
                 codebooks=[16, 32] if quick else [2048, 4096, 8192, 16384])
    elif suite in ("steps", "stages", "ablation"):
        d.update(batches=small)
    elif suite == "interference":
        d.update(batches=[2] if quick else [8], configs=both[:1])
    elif suite == "coldstart":
        d.update(batches=[2] if quick else [1, 32], configs=both[:1] if quick else both)
    return d


class Session:
    """Runs suites, owns the result writer, the time budget and the workload cache."""

    def __init__(self, options: Options, writer, env: dict, run_command: str, log=print):
        self.o, self.writer, self.env, self.run_command, self.log = options, writer, env, run_command, log
        self.dev = options.device
        self.start = time.perf_counter()
        self.deadline = None if options.budget_s is None else self.start + options.budget_s
        self.suite_deadline = None
        self.current_suite = ""
        self._workload: Workload | None = None
        self.errors = 0

    # ------------------------------------------------------------------ plumbing
    def expired(self) -> bool:
        now = time.perf_counter()
        return any(d is not None and now > d for d in (self.deadline, self.suite_deadline))

    def settings(self, suite: str) -> dict:
        d = suite_defaults(suite, self.o.quick)
        o = self.o
        for key in ("catalog", "batches", "beams", "configs", "methods", "codebooks"):
            if getattr(o, key) is not None:
                d[key] = getattr(o, key)
        return d

    def spec(self, source: str, codebook: int | None = None) -> CatalogSpec:
        scale = self.o.scale if self.o.scale is not None else default_scale(source, self.o.quick)
        if codebook is None and self.o.codebooks and len(self.o.codebooks) == 1:
            codebook = self.o.codebooks[0]
        if codebook is None and self.o.quick:
            codebook = QUICK_CODEBOOK
        from ..catalog.synth import SYNTH_PRESETS

        if source not in SYNTH_PRESETS:
            scale, codebook = None, None
        return CatalogSpec(source, scale, self.o.seed, codebook)

    def workload(self, spec: CatalogSpec) -> Workload:
        if self._workload is not None and self._workload.spec == spec:
            return self._workload
        if self._workload is not None:
            self._workload.release()
            self._workload = None
            if self.dev.type == "cuda":
                torch.cuda.empty_cache()
        t0 = time.perf_counter()
        self.log(f"[catalog] {spec.label}: generating/loading and building the index on {self.dev} …")
        self._workload = Workload(spec, self.dev, self.o.topk_paths)
        wl = self._workload
        self.log(f"[catalog] {spec.label}: {wl.catalog.n_items:,} SIDs, codebooks {wl.fields['codebooks']}, "
                 f"max segments {wl.fields['max_segments']} (catalog {wl.catalog_s:.1f} s, index "
                 f"{wl.index.build.get('total_s', 0):.1f} s, total {time.perf_counter() - t0:.1f} s)")
        self.emit(self.current_suite, "catalog", wl, {}, generation_s=wl.catalog_s, index_build=wl.index.build,
                  index_bytes=wl.index.nbytes, index_kinds="/".join(s.kind for s in wl.index.steps))
        return wl

    def command(self, suite: str, spec: CatalogSpec, **narrow) -> str:
        """The command that regenerates one record (narrowed to its shape and method)."""
        parts = ["python", "-m", "zerogr_core", "bench", "--suite", suite, "--catalog", spec.source]
        if spec.scale is not None:
            parts += ["--scale", str(spec.scale)]
        if spec.codebook is not None:
            parts += ["--codebook", str(spec.codebook)]
        parts += ["--seed", str(spec.seed)]
        if self.o.quick:
            parts.append("--quick")
        if "method" in narrow:
            parts += ["--methods", narrow["method"]]
        elif "methods" in narrow:
            parts += ["--methods", ",".join(narrow["methods"])]
        if "batch" in narrow:
            parts += ["--batch", str(narrow["batch"])]
        if "beam" in narrow:
            parts += ["--beam", str(narrow["beam"])]
        if "dtype" in narrow:
            parts += ["--dtype", narrow["dtype"], "--hidden", str(narrow["hidden"])]
        parts += ["--repeats", str(self.o.rep())]
        if self.dev.type != "cuda":
            parts += ["--device", str(self.dev)]
        if self.o.topk_paths != PLANNED_TOPK:
            parts += ["--topk-paths", ",".join(self.o.topk_paths)]
        return shlex.join(parts)

    def emit(self, suite: str, kind: str, wl_or_spec, narrow: dict | None = None, **fields) -> dict:
        env = self.env
        rec = dict(suite=suite, kind=kind)
        spec = wl_or_spec.spec if isinstance(wl_or_spec, Workload) else wl_or_spec
        if isinstance(wl_or_spec, Workload):
            rec.update({k: v for k, v in wl_or_spec.fields.items() if k != "catalog_stats" or kind == "catalog"})
        elif spec is not None:
            rec.update(catalog=spec.source, catalog_label=spec.label, scale=spec.scale, codebook=spec.codebook)
        clash = [k for k in fields if k in rec and k not in ("suite", "kind") and rec[k] != fields[k]]
        if clash:  # a record field would silently overwrite a catalog statistic
            raise ValueError(f"record fields {clash} clash with the catalog fields")
        rec.update(fields)
        rec.update(seed=self.o.seed, gpu=env["gpu"], driver=env["driver"], torch=env["torch"], triton=env["triton"],
                   device=str(self.dev), quick=self.o.quick)
        if spec is not None:
            rec["command"] = self.command(suite, spec, **(narrow or {}))
        rec["run_command"] = self.run_command
        if "catalog_stats" in rec:  # the per-step statistics last (a long nested field)
            rec["catalog_stats"] = rec.pop("catalog_stats")
        return self.writer.add(rec)

    def error(self, suite: str, spec, what: str, exc: BaseException) -> None:
        self.errors += 1
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        self.log(f"[error] {suite} {what}: {type(exc).__name__}: {exc}")
        self.emit(suite, "error", spec, what=what, error=f"{type(exc).__name__}: {exc}", traceback="".join(tb[-6:]))
        if self.dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def skipped(self, suite: str, spec, what: str, reason: str = "time budget spent") -> None:
        self.log(f"[skip] {suite} {what}: {reason}")
        self.emit(suite, "skipped", spec, what=what, reason=reason)

    # ------------------------------------------------------------------ entry
    def run(self) -> None:
        for suite in self.o.suites:
            if self.expired():
                self.skipped(suite, None, "whole suite")
                continue
            t0 = time.perf_counter()
            self.current_suite = suite
            budget = self.o.suite_budgets.get(suite)
            self.suite_deadline = None if budget is None else t0 + budget
            self.log(f"=== suite {suite} ===" + (f" (budget {budget:.0f} s)" if budget is not None else ""))
            try:
                SUITE_FUNCS[suite](self, suite)
            except Exception as exc:  # noqa: BLE001 - one suite's failure must not lose the others
                self.error(suite, None, "suite", exc)
            self.log(f"=== suite {suite} done in {time.perf_counter() - t0:.1f} s ===")


# ---------------------------------------------------------------------------- latency suites
def _methods_needing(methods):
    return dict(static=any(m.startswith("static") for m in methods), trie="cpu-trie" in methods)


#: Baseline -> (what its beams are compared with, which reference decode) before timing.
CROSS_CHECKS = {
    "static": ("score-first reference over the STATIC index", "score-first"),
    "static-adapted": ("filter-first reference (valid-token softmax)", "selective"),
    "naive-selective": ("filter-first reference, selective projection", "selective"),
    "cpu-trie": ("score-first reference over the STATIC index", "score-first"),
    "unconstrained": ("unconstrained reference", "unconstrained"),
}


def _projection_of(plan) -> tuple[str, ...]:
    return tuple("full" if s.option.mode.endswith("full") else "selective" for s in plan.steps)


def latency_unit(s: Session, suite: str, wl: Workload, dtype: str, hidden: int, beam: int, batch: int,
                 methods: list, check: bool) -> dict:
    """Time every method at one shape; returns {method: {mode: stats}}."""
    dev = s.dev
    ctx = wl.context(dtype, hidden, beam, batch, s.o.n_sets)
    model = ReplayModel(ctx.sets, batch)
    need = _methods_needing(methods)
    static = wl.static() if need["static"] else None
    trie = wl.trie() if need["trie"] else None
    tol = TOLERANCE[ctx.dtype]
    shape = dict(dtype=dtype, hidden=hidden, beam=beam, batch=batch)
    refs: dict = {}
    dec_heads = wl.decoder_heads(ctx.heads)

    def reference(kind: str, projection=None):
        if kind not in refs:
            model.load(0)
            if kind == "filter-first":
                d = Decoder(wl.index, beam_width=beam, projection=projection, engine="reference", **dec_heads)
            elif kind == "selective":
                d = Decoder(wl.index, beam_width=beam, projection="selective", engine="reference", **dec_heads)
            elif kind == "score-first":
                d = Decoder(wl.index, beam_width=beam, order="score-first", source=static, engine="reference",
                            **dec_heads)
            else:
                d = Decoder(wl.index, beam_width=beam, order="unconstrained", engine="reference", **dec_heads)
            r = d.decode(model, batch)
            refs[kind] = (r.tokens, r.scores, r.item_rows)
        return refs[kind]

    results: dict = {}
    outputs: dict = {}
    for name in methods:
        if s.expired():
            s.skipped(suite, wl, f"{name} {ctx.label} beam {beam} batch {batch}")
            continue
        narrow = dict(method=name, **shape)
        try:
            t0 = time.perf_counter()
            runner = make_runner(name, engine=ctx.engine, heads=ctx.heads, static=static, trie=trie, model=model,
                                 batch=batch, beam_width=beam)
            runner.capture()
            setup_s = time.perf_counter() - t0
            if name == "zerogr":
                plan = runner.plan
                s.emit(suite, "plan", wl, narrow, method=name, **shape, plan=plan.table(),
                       plan_modes="/".join(f"{st.option.mode}:{st.option.topk}" for st in plan.steps),
                       plan_total_us=plan.total_us, graph_error=runner.graph_error, setup_s=setup_s)
            if check:
                model.load(0)
                out = runner.outputs(use_graph=True)
                outputs[name] = out
                v = check_valid(wl.index, *out, constrained=CONSTRAINED[name])
                s.emit(suite, "check", wl, narrow, method=name, **shape, check="valid-items", passed=v["passed"],
                       details=v)
                cmp_against = None
                if name == "zerogr":
                    cmp_against = ("filter-first reference (same plan projections)",
                                   reference("filter-first", _projection_of(runner.plan)), tol, True)
                    if runner.graph is not None:
                        eager = tuple(t.clone() for t in runner.eager())
                        c = compare(out, eager, tol)
                        s.emit(suite, "check", wl, narrow, method=name, **shape, check="graph = eager",
                               passed=c["passed"], status=c["status"], details=c)
                elif name in CROSS_CHECKS:
                    label, kind = CROSS_CHECKS[name]
                    cmp_against = (label, reference(kind), tol, False)
                if cmp_against is not None:
                    label, ref, t, strict = cmp_against
                    c = compare(out, ref, t)
                    # Across implementations (other GEMM shapes, fused vs unfused softmax) rounding can
                    # reorder near-ties and change which beam survives; the item overlap then decides.
                    passed = c["passed"] if strict else (c["passed"] or c["mean_overlap"] >= 0.98)
                    s.emit(suite, "check", wl, narrow, method=name, **shape, check=f"equals {label}",
                           passed=passed, status=c["status"], strict=strict, details=c)
                    if not passed:
                        s.log(f"[check] {name} {ctx.label} b{batch}: {label}: {c}")
            per_mode = {}
            for mode in ("graph", "eager"):
                if s.expired():
                    break
                if mode == "graph" and runner.graph is None:
                    s.emit(suite, "latency", wl, narrow, method=name, mode=mode, **shape, status="unavailable",
                           reason=runner.graph_error)
                    continue
                fn = runner.graph.replay if mode == "graph" else runner.eager
                samples = time_runs(fn, dev, repeats=s.o.rep(), warmup=s.o.warm(),
                                    before=lambda i: model.load(i + 1))
                stats = summarize(samples)
                per_mode[mode] = stats
                s.emit(suite, "latency", wl, narrow, method=name, mode=mode, **shape, status="ok",
                       repeats=s.o.rep(), warmup=s.o.warm(), hidden_sets=s.o.n_sets, setup_s=setup_s, **stats)
            results[name] = per_mode
            runner.release()
            del runner
        except torch.OutOfMemoryError as exc:  # e.g. the naive ablation's packed weight matrix
            s.skipped(suite, wl, f"{name} {ctx.label} beam {beam} batch {batch}",
                      f"out of GPU memory: {str(exc).splitlines()[0]}")
        except Exception as exc:  # noqa: BLE001
            s.error(suite, wl, f"{name} {ctx.label} beam {beam} batch {batch}", exc)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    _emit_speedups(s, suite, wl, shape, results)
    line = " ".join(f"{m}={_best(r)[1]:.3f}ms({_best(r)[0]})" for m, r in results.items() if r)
    s.log(f"[{suite}] {wl.spec.label} {ctx.label} beam {beam} batch {batch}: {line}")
    ctx.release()
    refs.clear()
    outputs.clear()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return results


def _best(per_mode: dict) -> tuple[str, float]:
    if "graph" in per_mode:
        return "graph", per_mode["graph"]["median_ms"]
    mode = min(per_mode, key=lambda m: per_mode[m]["median_ms"])
    return mode, per_mode[mode]["median_ms"]


def _emit_speedups(s: Session, suite: str, wl: Workload, shape: dict, results: dict) -> None:
    z = results.get("zerogr", {})
    if "graph" in z:
        zmode, zms = "graph", z["graph"]["median_ms"]
    elif "eager" in z:
        zmode, zms = "eager", z["eager"]["median_ms"]
    else:
        return
    for name, per_mode in results.items():
        if name == "zerogr" or not per_mode:
            continue
        bmode, bms = _best(per_mode)
        rec = dict(method=name, baseline=name, **shape, zerogr_mode=zmode, zerogr_ms=zms, baseline_mode=bmode,
                   baseline_ms=bms, speedup=bms / zms)
        for mode in ("graph", "eager"):
            if mode in per_mode:
                rec[f"speedup_vs_{mode}"] = per_mode[mode]["median_ms"] / zms
        s.emit(suite, "speedup", wl, dict(methods=["zerogr", name], **shape), **rec)


def _latency_suite(s: Session, suite: str, wl: Workload, settings: dict) -> None:
    check_mode = s.o.check
    batches = order_batches(settings["batches"])
    ends = {min(batches), max(batches)} if batches else set()
    for beam in settings["beams"]:
        for batch in batches:
            for dtype, hidden in settings["configs"]:
                if s.expired():
                    s.skipped(suite, wl, f"{dtype}/H{hidden} beam {beam} batch {batch}")
                    continue
                check = check_mode == "all" or (check_mode == "ends" and batch in ends)
                latency_unit(s, suite, wl, dtype, hidden, beam, batch, settings["methods"], check)


def suite_headline(s: Session, suite: str) -> None:
    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    _latency_suite(s, suite, wl, st)


def suite_beam_sweep(s: Session, suite: str) -> None:
    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    _latency_suite(s, suite, wl, st)


def suite_codebook_sweep(s: Session, suite: str) -> None:
    st = s.settings(suite)
    for v in st["codebooks"]:
        if s.expired():
            s.skipped(suite, s.spec(st["catalog"], v), f"codebook {v}")
            continue
        wl = s.workload(s.spec(st["catalog"], v))
        _latency_suite(s, suite, wl, st)


# ---------------------------------------------------------------------------- per-step / per-stage
def _shape_units(s: Session, suite: str, wl: Workload, st: dict):
    for beam in st["beams"]:
        for batch in order_batches(st["batches"]):
            for dtype, hidden in st["configs"]:
                if s.expired():
                    s.skipped(suite, wl, f"{dtype}/H{hidden} beam {beam} batch {batch}")
                    continue
                yield beam, batch, dtype, hidden


def suite_steps(s: Session, suite: str) -> None:
    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    dev = s.dev
    for beam, batch, dtype, hidden in _shape_units(s, suite, wl, st):
        ctx = wl.context(dtype, hidden, beam, batch, s.o.n_sets)
        model = ReplayModel(ctx.sets, batch)
        need = _methods_needing(st["methods"])
        static = wl.static() if need["static"] else None
        trie = wl.trie() if need["trie"] else None
        shape = dict(dtype=dtype, hidden=hidden, beam=beam, batch=batch)
        z_record = None
        totals = {}
        for name in st["methods"]:
            if s.expired():
                break
            try:
                runner = make_runner(name, engine=ctx.engine, heads=ctx.heads, static=static, trie=trie,
                                     model=model, batch=batch, beam_width=beam)
                model.load(0)
                rec = runner.record()
                if name == "zerogr":
                    z_record = rec
                    plan = runner.plan
                modes = ["graph", "eager"] if CAPTURABLE[name] and dev.type == "cuda" else ["eager"]
                for level, args in enumerate(rec):
                    fn = runner.step_fn(level)
                    for mode in modes:
                        t = time_step(lambda: fn(*args), dev, s.o.rep(), graph=mode == "graph")
                        totals[(name, mode)] = totals.get((name, mode), 0.0) + t["median_us"]
                        extra = {}
                        if name == "zerogr":
                            extra = dict(option=plan.steps[level].option.label)
                        s.emit(suite, "step", wl, dict(method=name, **shape), method=name, mode=mode, **shape,
                               step=level + 1, beams_in=args[0].shape[0], **t, **extra)
                runner.release()
                del runner
            except Exception as exc:  # noqa: BLE001
                s.error(suite, wl, f"{name} {dtype}/H{hidden} batch {batch}", exc)
        # the GEMMs alone: the level's band (full projection) and the whole head (scoring first)
        if z_record is not None and not s.expired():
            heads = ctx.heads
            for level, (_, hid, _) in enumerate(z_record):
                w = heads.shared if heads.shared is not None else heads.bands[level]
                band = heads.band_offsets[level] if heads.shared is not None else 0
                size = heads.bands[level].shape[0]
                whole, _ = heads.normaliser(level)
                for label, (wt, b0, n) in (("band-gemm", (w, band, size)), ("head-gemm", (whole, 0, whole.shape[0]))):
                    t = time_step(lambda: full_proj(hid, wt, b0, n), dev, s.o.rep(), graph=dev.type == "cuda")
                    mode = "graph" if dev.type == "cuda" else "eager"
                    totals[(label, mode)] = totals.get((label, mode), 0.0) + t["median_us"]
                    s.emit(suite, "step", wl, dict(methods=["zerogr"], **shape), method=label, mode=mode, **shape,
                           step=level + 1, beams_in=hid.shape[0], rows=n, **t)
        for (name, mode), us in totals.items():
            s.emit(suite, "step", wl, dict(method=name, **shape), method=name, mode=mode, **shape, step="sum",
                   median_us=us)
        s.log(f"[steps] {wl.spec.label} {ctx.label} batch {batch}: " +
              " ".join(f"{n}/{m}={us / 1e3:.3f}ms" for (n, m), us in totals.items()))
        ctx.release()
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def _zerogr_units(s: Session, suite: str, wl: Workload, st: dict):
    """Per shape of the suite: ``(beam, batch, dtype, hidden, ctx, model, runner, rec)`` with
    zerogr's engine planned and each step's real inputs recorded; a shape whose set-up
    fails is reported and skipped."""
    for beam, batch, dtype, hidden in _shape_units(s, suite, wl, st):
        try:
            ctx = wl.context(dtype, hidden, beam, batch, s.o.n_sets)
            model = ReplayModel(ctx.sets, batch)
            runner = ZeroGRRunner(ctx.engine, model, batch)
            model.load(0)
            rec = runner.record()
        except Exception as exc:  # noqa: BLE001
            s.error(suite, wl, f"{dtype}/H{hidden} batch {batch}", exc)
            continue
        yield beam, batch, dtype, hidden, ctx, model, runner, rec


def suite_stages(s: Session, suite: str) -> None:
    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    dev = s.dev
    graph = dev.type == "cuda"
    mode = "graph" if graph else "eager"
    for beam, batch, dtype, hidden, ctx, model, runner, rec in _zerogr_units(s, suite, wl, st):
        shape = dict(dtype=dtype, hidden=hidden, beam=beam, batch=batch)
        sums: dict = {}
        for level, (states, hid, scores) in enumerate(rec):
            r = runner.shape.runners[level]
            opt = r.option
            slots = r.project(states, hid)
            norm = torch.empty_like(slots.slot_logits)
            top = tuple(torch.empty_like(t) for t in r.top)
            fo = r.filter_out
            stages = {
                "filtering+projection": lambda: r.project(states, hid),
                "normalisation": lambda: log_softmax_slots(slots.slot_logits, scores, out=norm),
                "selection+gather": lambda: topk_gather(norm, slots.slot_tokens, slots.slot_succ, batch, beam,
                                                        path=opt.topk, out=top),
                "fused step": lambda: r(states, hid, scores),
                "filtering": lambda: filter_slots(states, r.K, **r.args, out=fo),
            }
            if r.logits is not None:
                stages["projection"] = lambda: full_proj(hid, r.weight, r.band_start, r.mapping.codebook,
                                                         out=r.logits)
                stages["filter copy"] = lambda: filter_slots(states, r.K, **r.args, logits=r.logits, out=fo)
            else:
                stages["projection"] = lambda: selective_proj(hid, r.weight, fo.slot_tokens, fo.tasks,
                                                              fo.slot_logits, band_start=r.band_start)
            valid = int(slots.seg_len.sum())
            for name, fn in stages.items():
                try:
                    fn()
                    t = time_step(fn, dev, s.o.rep(), graph=graph)
                except Exception as exc:  # noqa: BLE001
                    s.error(suite, wl, f"stage {name} step {level + 1}", exc)
                    continue
                sums[name] = sums.get(name, 0.0) + t["median_us"]
                s.emit(suite, "stage", wl, dict(methods=["zerogr"], **shape), method="zerogr", mode=mode, **shape,
                       step=level + 1, stage=name, option=opt.label, slots_per_beam=r.K, beams_in=states.shape[0],
                       valid_logits=valid, **t)
        unfused = sum(sums.get(k, 0.0) for k in ("filtering+projection", "normalisation", "selection+gather"))
        for name, us in sums.items():
            s.emit(suite, "stage", wl, dict(methods=["zerogr"], **shape), method="zerogr", mode=mode, **shape,
                   step="sum", stage=name, median_us=us)
        s.emit(suite, "stage", wl, dict(methods=["zerogr"], **shape), method="zerogr", mode=mode, **shape,
               step="sum", stage="unfused total", median_us=unfused)
        s.log(f"[stages] {wl.spec.label} {ctx.label} batch {batch}: " +
              " ".join(f"{k}={v:.1f}us" for k, v in sums.items()))
        _release(dev, runner, ctx)


def suite_ablation(s: Session, suite: str) -> None:
    """Step 2 alone: full projection, naive selective and slot-based selective (Table 1)."""
    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    dev = s.dev
    level = 1 if wl.catalog.n_levels > 1 else 0
    for beam, batch, dtype, hidden, ctx, model, runner, rec in _zerogr_units(s, suite, wl, st):
        shape = dict(dtype=dtype, hidden=hidden, beam=beam, batch=batch)
        states, hid, scores = rec[level]
        engine, heads = ctx.engine, ctx.heads
        mapping = wl.index.steps[level]
        weight = heads.shared if heads.shared is not None else heads.bands[level]
        band = heads.band_offsets[level]
        beams_in = states.shape[0] // batch
        topk = runner.shape.runners[level].option.topk
        modes = ["sparse+full", "sparse+selective"] + (["dense+full"] if mapping.kind == "dense" else [])
        available = step_options(mapping, beams_in, beam)
        step_runners = {m: StepRunner(mapping, engine.sparse_view(level), weight, band,
                                      StepOption(m, topk) if StepOption(m, topk) in available else StepOption(m, "wide"),
                                      batch, beams_in, beam) for m in modes}
        sparse_tokens, sparse_offsets = engine.sparse_view(level)
        naive_slots = filter_slots(states, mapping.max_segment, tokens=sparse_tokens, offsets=sparse_offsets)
        naive_top = None

        def naive_project():
            filter_slots(states, mapping.max_segment, tokens=sparse_tokens, offsets=sparse_offsets, out=naive_slots)
            return naive_selective_proj(hid, weight, naive_slots.slot_tokens, naive_slots.slot_logits,
                                        band_start=band)

        def naive_step():
            naive_project()
            return topk_gather(naive_slots.slot_logits, naive_slots.slot_tokens, naive_slots.slot_succ, batch, beam,
                               beam_scores=scores)

        variants = {  # label: (projection only, filtering+projection, whole step, capturable)
            "full projection": (lambda: full_proj(hid, weight, band, mapping.codebook,
                                                  out=step_runners["sparse+full"].logits),
                                lambda: step_runners["sparse+full"].project(states, hid),
                                lambda: step_runners["sparse+full"](states, hid, scores), True),
            "naive selective": (lambda: naive_selective_proj(hid, weight, naive_slots.slot_tokens,
                                                             naive_slots.slot_logits, band_start=band),
                                naive_project, naive_step, False),
            "slot-based selective": (
                lambda: selective_proj(hid, weight, step_runners["sparse+selective"].filter_out.slot_tokens,
                                       step_runners["sparse+selective"].filter_out.tasks,
                                       step_runners["sparse+selective"].filter_out.slot_logits, band_start=band),
                lambda: step_runners["sparse+selective"].project(states, hid),
                lambda: step_runners["sparse+selective"](states, hid, scores), True),
        }
        if "dense+full" in step_runners:
            dr = step_runners["dense+full"]
            variants["dense full projection"] = (
                lambda: full_proj(hid, weight, band, mapping.codebook, out=dr.logits),
                lambda: dr.project(states, hid), lambda: dr(states, hid, scores), True)
        # equality of the slot logits (before timing)
        full_logits = step_runners["sparse+full"].project(states, hid).slot_logits.clone()
        sel_logits = step_runners["sparse+selective"].project(states, hid).slot_logits.clone()
        naive_project()
        naive_top = naive_slots.slot_logits.clone()
        tol = TOLERANCE[ctx.dtype]
        fin = torch.isfinite(full_logits)
        agree = dict(
            same_valid_slots=bool(torch.equal(fin, torch.isfinite(sel_logits)) and
                                  torch.equal(fin, torch.isfinite(naive_top))),
            max_diff_selective_vs_full=float((sel_logits - full_logits)[fin].abs().max()) if fin.any() else 0.0,
            max_diff_naive_vs_full=float((naive_top - full_logits)[fin].abs().max()) if fin.any() else 0.0)
        agree["passed"] = agree["same_valid_slots"] and agree["max_diff_selective_vs_full"] <= tol and \
            agree["max_diff_naive_vs_full"] <= tol
        s.emit(suite, "check", wl, dict(methods=["zerogr"], **shape), method="ablation", **shape,
               check="step-2 logits agree", passed=agree["passed"], details=agree)
        valid = int(fin.sum())
        n = states.shape[0]
        H = hid.shape[1]
        counts = dict(step=level + 1, beams_in=n, step_codebook=mapping.codebook, valid_logits=valid,
                      full_logits=n * mapping.codebook, slots=n * mapping.max_segment,
                      gflop_selective=2 * valid * H / 1e9, gflop_full=2 * n * mapping.codebook * H / 1e9)
        summary = {}
        for label, (proj, fproj, whole, capturable) in variants.items():
            for part, fn in (("projection", proj), ("filtering+projection", fproj), ("whole step", whole)):
                for mode in (["graph", "eager"] if capturable and dev.type == "cuda" else ["eager"]):
                    if s.expired():
                        break
                    try:
                        fn()
                        t = time_step(fn, dev, s.o.rep(), graph=mode == "graph")
                    except Exception as exc:  # noqa: BLE001
                        s.error(suite, wl, f"{label} {part} {mode}", exc)
                        continue
                    if part == "filtering+projection":
                        summary[(label, mode)] = t["median_us"]
                    s.emit(suite, "ablation", wl, dict(methods=["zerogr"], **shape), method="zerogr", **shape,
                           variant=label, part=part, mode=mode, capturable=capturable, **counts, **t)
        s.log(f"[ablation] {wl.spec.label} {ctx.label} batch {batch} step {level + 1} (filter+proj): " +
              " ".join(f"{k[0]}/{k[1]}={v:.1f}us" for k, v in summary.items()))
        variants.clear()
        step_runners.clear()
        _release(dev, runner, ctx)


# ---------------------------------------------------------------------------- memory
def suite_memory(s: Session, suite: str) -> None:
    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    rep = wl.index.report()
    n, L = wl.catalog.n_items, wl.catalog.n_levels
    # Without a STATIC-style method in --methods (e.g. at 10^9 SIDs, where building it
    # would take minutes) its bytes come from the layout formula, which the built index
    # matches exactly (tests/test_index.py); the host trie is counted only for cpu-trie.
    need = _methods_needing(st["methods"])
    vocab, dense_levels = wl.static_layout()
    entries = [x["entries"] for x in rep["steps"]]
    static_steps = (static_step_bytes(wl.static()) if need["static"]
                    else static_style_step_bytes(entries, vocab, dense_levels))
    trie = wl.trie() if need["trie"] else None
    narrow: dict = {}
    rows = []
    for row, sb in zip(rep["steps"], static_steps):
        step = row["step"]
        rows.append(dict(structure="zerogr", step=step, bytes=row["bytes"], representation=row["kind"],
                         step_states=row["states"], step_entries=row["entries"], density=row["density"],
                         max_segment=row["max_segment"]))
        rows.append(dict(structure="zerogr (all sparse)", step=step, bytes=row["sparse_bytes"],
                         representation="sparse"))
        rows.append(dict(structure="static-style", step=step, bytes=sb,
                         representation="dense V^%d" % dense_levels if step <= dense_levels else "csr",
                         built=need["static"]))
        rows.append(dict(structure="sid-table-int16", step=step, bytes=n * 2, representation="column"))
        if trie is not None:
            rows.append(dict(structure="host-trie", step=step,
                             bytes=trie.tokens[step - 1].numel() * trie.tokens[step - 1].element_size() +
                             trie.offsets[step - 1].numel() * trie.offsets[step - 1].element_size(),
                             representation="sparse (host)"))
    totals = {}
    for r in rows:
        totals[r["structure"]] = totals.get(r["structure"], 0) + r["bytes"]
    for r in rows:
        s.emit(suite, "memory", wl, narrow, **r)
    estimate = static_style_bytes(entries, vocab, dense_levels)
    for name, b in totals.items():
        s.emit(suite, "memory", wl, narrow, structure=name, step="total", bytes=b,
               ratio_to_sid_table=b / (n * L * 2), ratio_to_zerogr=b / totals["zerogr"],
               **({"formula_bytes": estimate, "vocab": vocab, "dense_levels": dense_levels,
                   "built": need["static"]} if name == "static-style" else {}))
    s.log(f"[memory] {wl.spec.label}: " + " ".join(f"{k}={v / 2**30:.3f}GiB" for k, v in totals.items()) +
          f"; static/zerogr = {totals['static-style'] / totals['zerogr']:.1f}x")


# ---------------------------------------------------------------------------- build
def _h2d_bandwidth(dev: torch.device, nbytes: int = 256 << 20) -> dict:
    out = {}
    if dev.type != "cuda":
        return out
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    for label, pin in (("pinned", True), ("pageable", False)):
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        src.fill_(1)
        times = []
        for _ in range(4):
            with Stopwatch(dev) as watch:
                dst.copy_(src, non_blocking=pin)
            times.append(watch.seconds)
        out[f"h2d_{label}_gbps"] = nbytes / min(times[1:]) / 1e9
    return out


def _same_index(a, b) -> bool:
    for sa, sb in zip(a.steps, b.steps):
        if sa.kind != sb.kind:
            return False
        for ta, tb in zip(sa.tensors(), sb.tensors()):
            if ta.dtype != tb.dtype or not torch.equal(ta, tb.to(ta.device)):
                return False
    return True


def suite_build(s: Session, suite: str) -> None:
    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    dev = s.dev
    cuda = dev.type == "cuda"
    reps = s.o.build_repeats if s.o.build_repeats is not None else (1 if s.o.quick else 2)
    bw = _h2d_bandwidth(dev)
    zbytes = wl.index.nbytes
    s.emit(suite, "build", wl, {}, builder="catalog generation", total_s=wl.catalog_s, runs=1,
           note="synthetic generator (numpy), not part of any index build")
    builders = [  # in priority order (a time budget cuts the tail)
        ("layout, 2 staging buffers (streaming)", "layout", IndexConfig(), dev),
        ("static-style (numpy, as published)", "static", None, dev),
        ("serial", "serial", IndexConfig(), dev),
        ("layout, full host then copy", "host-copy", IndexConfig(), dev),
        ("layout, 1 staging buffer", "layout", IndexConfig(staging_buffers=1), dev),
        ("layout, host only (no transfer)", "layout", IndexConfig(), torch.device("cpu")),
    ]
    for label, builder, config, target in builders:
        if s.expired():
            s.skipped(suite, wl, label)
            continue
        if not cuda and label.startswith("layout, 1 staging"):
            s.skipped(suite, wl, label, "staging buffers need a CUDA device")
            continue
        try:
            runs = []
            identical = None
            nbytes = None
            for _ in range(reps):
                if cuda:
                    torch.cuda.empty_cache()
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                if builder == "static":
                    idx = build_static_index(wl.catalog, device=target, dense_levels=wl.static().dense_levels,
                                             band_offsets=wl.band_offsets)
                else:
                    idx = build_index(wl.catalog, device=target, builder=builder, config=config)
                synchronize(target)
                wall = time.perf_counter() - t0
                info = dict(idx.build, wall_s=wall)
                runs.append(info)
                nbytes = idx.nbytes
                if builder != "static" and identical is None:
                    identical = _same_index(wl.index, idx)
                del idx
            total = sorted(r["wall_s"] for r in runs)[len(runs) // 2]
            last = runs[-1]
            rec = dict(builder=label, builder_name=builder, target=str(target), runs=reps, total_s=total,
                       min_s=min(r["wall_s"] for r in runs), index_bytes=nbytes,
                       sids_per_s=wl.catalog.n_items / max(total, 1e-9), identical_to_zerogr_index=identical,
                       staging_buffers=(config.staging_buffers if config is not None and builder == "layout" and
                                        target.type == "cuda" else None),
                       **{f"build_{k}": v for k, v in last.items() if k.endswith("_s") or k.endswith("_bytes")},
                       **bw)
            s.emit(suite, "build", wl, {}, **rec)
            s.log(f"[build] {wl.spec.label} {label}: {total:.2f} s ({nbytes / 2**20:.0f} MiB, identical="
                  f"{identical})")
        except Exception as exc:  # noqa: BLE001
            s.error(suite, wl, label, exc)
    static_bytes = wl.static().nbytes
    for name, b in (("zerogr", zbytes), ("static-style", static_bytes),
                    ("sid-table-int16", wl.catalog.sid_table_bytes_int16())):
        rec = dict(structure=name, bytes=b, window_60s_gbps=b / 60 / 1e9, window_90s_gbps=b / 90 / 1e9, **bw)
        if "h2d_pinned_gbps" in bw:
            rec["ship_s_at_pinned"] = b / (bw["h2d_pinned_gbps"] * 1e9)
            rec["window_60s_fraction_of_pinned"] = rec["window_60s_gbps"] / bw["h2d_pinned_gbps"]
        s.emit(suite, "bandwidth", wl, {}, **rec)


# ---------------------------------------------------------------------------- interference
def suite_interference(s: Session, suite: str) -> None:
    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    dev = s.dev
    seconds = s.o.interference_s if s.o.interference_s is not None else (0.3 if s.o.quick else 3.0)
    dtype, hidden = st["configs"][0]
    beam = st["beams"][0]
    for batch in st["batches"]:
        if s.expired():
            s.skipped(suite, wl, f"batch {batch}")
            continue
        ctx = wl.context(dtype, hidden, beam, batch, s.o.n_sets)
        model = ReplayModel(ctx.sets, batch)
        runner = ZeroGRRunner(ctx.engine, model, batch)
        runner.capture()
        fn = runner.graph.replay if runner.graph is not None else runner.eager
        mode = "graph" if runner.graph is not None else "eager"
        shape = dict(dtype=dtype, hidden=hidden, beam=beam, batch=batch)
        time_runs(fn, dev, repeats=5, warmup=2)

        def serve(stop_when) -> list[float]:
            samples = []
            t_end = time.perf_counter() + seconds
            while True:
                samples += time_runs(fn, dev, repeats=1, warmup=0)
                if stop_when(t_end, len(samples)):
                    return samples

        idle = serve(lambda t_end, k: time.perf_counter() >= t_end and k >= 50)
        stats = summarize(idle)
        s.emit(suite, "interference", wl, dict(methods=["zerogr"], **shape), method="zerogr", mode=mode, **shape,
               condition="idle", rebuilds=0, **stats)
        line = [f"idle p50={stats['median_ms']:.3f} p99={stats['p99_ms']:.3f}"]
        for builder in ("layout", "host-copy"):
            if s.expired():
                break
            stop = threading.Event()
            build_times: list[float] = []
            failure: list = []

            def rebuild():
                try:
                    while not stop.is_set():
                        t0 = time.perf_counter()
                        build_index(wl.catalog, device=dev, builder=builder)  # dropped at once
                        build_times.append(time.perf_counter() - t0)
                except Exception as exc:  # noqa: BLE001
                    failure.append(exc)

            th = threading.Thread(target=rebuild, daemon=True)
            th.start()
            busy = serve(lambda t_end, k: (time.perf_counter() >= t_end and len(build_times) >= 1 and k >= 50)
                         or bool(failure))
            stop.set()
            th.join()
            if failure:
                s.error(suite, wl, f"rebuild {builder}", failure[0])
                continue
            st2 = summarize(busy)
            s.emit(suite, "interference", wl, dict(methods=["zerogr"], **shape), method="zerogr", mode=mode, **shape,
                   condition=f"during {builder} rebuild", builder=builder, rebuilds=len(build_times),
                   rebuild_s=build_times, p99_ratio=st2["p99_ms"] / stats["p99_ms"],
                   p50_ratio=st2["median_ms"] / stats["median_ms"], **st2)
            line.append(f"{builder}: p50={st2['median_ms']:.3f} p99={st2['p99_ms']:.3f} ({len(build_times)} builds)")
        s.log(f"[interference] {wl.spec.label} {ctx.label} batch {batch}: " + "; ".join(line))
        _release(dev, runner, ctx)


SUITE_FUNCS = {"headline": suite_headline, "beam-sweep": suite_beam_sweep, "codebook-sweep": suite_codebook_sweep,
               "steps": suite_steps, "stages": suite_stages, "ablation": suite_ablation, "memory": suite_memory,
               "build": suite_build, "interference": suite_interference, "coldstart": suite_coldstart}

__all__ = ["ANCHORS", "FAST_METHODS", "Options", "SUITES", "Session", "TARGETS", "suite_defaults"]
