"""Latency suites: whole-decode latency of every method at every shape (headline, beam and
codebook sweeps), with correctness checks before timing and speedups after."""
from __future__ import annotations

import time

import torch

from ..timing import summarize, time_runs
from .checks import TOLERANCE, check_valid, compare
from .crosscheck import References, check_model, cross_check
from .methods import CONSTRAINED, ReplayModel, make_runner
from .session import Session
from .workload import Workload, order_batches


def latency_unit(s: Session, suite: str, wl: Workload, dtype: str, hidden: int, beam: int, batch: int,
                 methods: list, check: bool) -> dict:
    """Time every method at one shape; returns {method: {mode: stats}}."""
    dev = s.dev
    ctx = wl.context(dtype, hidden, beam, batch, s.o.n_sets)
    model = ReplayModel(ctx.sets, batch)
    static, trie = wl.baselines(methods)
    tol = TOLERANCE[ctx.dtype]
    shape = dict(dtype=dtype, hidden=hidden, beam=beam, batch=batch)
    # the cross-checks decode on content-keyed hidden states; the timed runs on the replay
    refs = References(wl, ctx.heads, check_model(wl, ctx.heads, beam, batch), beam, batch, static) if check else None

    results: dict = {}
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
                v = check_valid(wl.index, *out, constrained=CONSTRAINED[name])
                s.emit(suite, "check", wl, narrow, method=name, **shape, check="valid-items", passed=v["passed"],
                       details=v)
                if name == "zerogr" and runner.graph is not None:
                    eager = tuple(t.clone() for t in runner.eager())
                    c = compare(out, eager, tol)
                    s.emit(suite, "check", wl, narrow, method=name, **shape, check="graph = eager",
                           passed=c["passed"], status=c["status"], details=c)
                checked = cross_check(name, runner, refs, tol)
                if checked is not None:
                    label, passed, strict, c = checked
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
    del refs
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
    batches = order_batches(settings["batches"])
    ends = {min(batches), max(batches)} if batches else set()
    for beam, batch, dtype, hidden in s.shapes(suite, wl, settings):
        check = s.o.check == "all" or (s.o.check == "ends" and batch in ends)
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
