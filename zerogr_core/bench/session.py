"""The benchmark session: runs the suites, keeps the time budget, writes every record.

A suite is a function ``fn(session, suite_name)`` (see :mod:`zerogr_core.bench.registry`)
that asks the session for its settings and workloads and hands it each record.
"""
from __future__ import annotations

import time
import traceback

import torch

from ..catalog.synth import SYNTH_PRESETS
from .options import Options, suite_defaults
from .registry import BY_NAME
from .rerun import record_command
from .workload import QUICK_CODEBOOK, CatalogSpec, Workload, WorkloadCache, default_scale, order_batches


class Session:
    """Runs suites, owns the result writer, the time budget and the workload cache."""

    def __init__(self, options: Options, writer, env: dict, run_command: str, log=print):
        self.o, self.writer, self.env, self.run_command, self.log = options, writer, env, run_command, log
        self.dev = options.device
        self.start = time.perf_counter()
        self.deadline = None if options.budget_s is None else self.start + options.budget_s
        self.suite_deadline = None
        self.current_suite = ""
        self._workloads = WorkloadCache(self.dev, options.topk_paths)
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
        if source not in SYNTH_PRESETS:
            scale, codebook = None, None
        return CatalogSpec(source, scale, self.o.seed, codebook)

    def workload(self, spec: CatalogSpec) -> Workload:
        """The workload of ``spec``, built on first use; the catalog record is written then."""
        wl, fresh = self._workloads.get(spec, self.log)
        if fresh:
            self.emit(self.current_suite, "catalog", wl, {}, generation_s=wl.catalog_s, index_build=wl.index.build,
                      index_bytes=wl.index.nbytes, index_kinds="/".join(s.kind for s in wl.index.steps))
        return wl

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
            rec["command"] = record_command(self.o, suite, spec, **(narrow or {}))
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

    def shapes(self, suite: str, wl: Workload, settings: dict):
        """``(beam, batch, dtype, hidden)`` of every shape of ``settings`` (anchor batches first);
        a shape past the time budget is reported as skipped instead."""
        for beam in settings["beams"]:
            for batch in order_batches(settings["batches"]):
                for dtype, hidden in settings["configs"]:
                    if self.expired():
                        self.skipped(suite, wl, f"{dtype}/H{hidden} beam {beam} batch {batch}")
                        continue
                    yield beam, batch, dtype, hidden

    def release(self, *holders) -> None:
        """Release a unit's runners and contexts and hand their cached GPU memory back."""
        for h in holders:
            h.release()
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()

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
                BY_NAME[suite].function()(self, suite)
            except Exception as exc:  # noqa: BLE001 - one suite's failure must not lose the others
                self.error(suite, None, "suite", exc)
            self.log(f"=== suite {suite} done in {time.perf_counter() - t0:.1f} s ===")
