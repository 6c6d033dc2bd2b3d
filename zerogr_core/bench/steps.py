"""Per-step suites: every method's steps timed alone (steps), zerogr's steps cut into their
stages (stages), and step 2 under three projections (ablation)."""
from __future__ import annotations

import torch

from zerogr_kernels import filter_slots, full_proj, naive_selective_proj, selective_proj, topk_gather
from zerogr_kernels.selective import passes_for_cache

from ..decode.engine import StepRunner
from ..decode.options import StepOption, step_options
from ..timing import time_step
from .checks import CONTRACT_TOLERANCE, TOLERANCE
from .methods import CAPTURABLE, ReplayModel, ZeroGRRunner, make_runner
from .session import Session
from .workload import Workload


def suite_steps(s: Session, suite: str) -> None:
    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    dev = s.dev
    for beam, batch, dtype, hidden in s.shapes(suite, wl, st):
        ctx = wl.context(dtype, hidden, beam, batch, s.o.n_sets)
        model = ReplayModel(ctx.sets, batch)
        static, trie = wl.baselines(st["methods"])
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
                w, band = heads.band(level)
                size = heads.bands[level].shape[0]
                whole, _ = heads.normaliser(level)
                gemms = [("band-gemm", (w, band, size, torch.float32)),
                         ("head-gemm", (whole, 0, whole.shape[0], torch.float32))]
                if hid.dtype != torch.float32:  # what the float32 logits of the contract cost the band GEMM
                    gemms.append(("band-gemm-head-dtype-out", (w, band, size, hid.dtype)))
                for label, (wt, b0, n, odt) in gemms:
                    t = time_step(lambda: full_proj(hid, wt, b0, n, out_dtype=odt), dev, s.o.rep(),
                                  graph=dev.type == "cuda")
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
    for beam, batch, dtype, hidden in s.shapes(suite, wl, st):
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
            r = runner.step_runner(level)
            opt = r.option
            stages = r.stages(states, hid, scores)
            slots = stages["filtering+projection"]()
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
        s.release(runner, ctx)


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
        weight, band = heads.band(level)
        beams_in = states.shape[0] // batch
        topk = runner.step_runner(level).option.topk
        modes = ["sparse+full", "sparse+selective"] + (["dense+full"] if mapping.kind == "dense" else [])
        available = step_options(mapping, beams_in, beam)
        step_runners = {m: StepRunner(mapping, engine.sparse_view(level), weight, band,
                                      StepOption(m, topk) if StepOption(m, topk) in available else StepOption(m, "wide"),
                                      batch, beams_in, beam) for m in modes}
        sparse_tokens, sparse_offsets = engine.sparse_view(level)
        naive_slots = filter_slots(states, mapping.max_segment, tokens=sparse_tokens, offsets=sparse_offsets)

        def naive_project():
            filter_slots(states, mapping.max_segment, tokens=sparse_tokens, offsets=sparse_offsets, out=naive_slots)
            return naive_selective_proj(hid, weight, naive_slots.slot_tokens, naive_slots.slot_logits,
                                        band_start=band)

        def naive_step():
            naive_project()
            return topk_gather(naive_slots.slot_logits, naive_slots.slot_tokens, naive_slots.slot_succ, batch, beam,
                               beam_scores=scores)

        def engine_variant(mode: str) -> tuple:
            parts = step_runners[mode].stages(states, hid, scores)
            return parts["projection"], parts["filtering+projection"], parts["fused step"], True

        variants = {  # label: (projection only, filtering+projection, whole step, capturable)
            "full projection": engine_variant("sparse+full"),
            "naive selective": (lambda: naive_selective_proj(hid, weight, naive_slots.slot_tokens,
                                                             naive_slots.slot_logits, band_start=band),
                                naive_project, naive_step, False),
            "slot-based selective": engine_variant("sparse+selective"),
        }
        if "dense+full" in step_runners:
            variants["dense full projection"] = engine_variant("dense+full")
        # the selective kernel over the hidden dimension in slices whose band rows fit in L2
        # (and half and twice as many passes, to see which the GPU prefers)
        fit = passes_for_cache(mapping.codebook, hid.shape[1], weight.element_size())
        split_passes = sorted({p for p in (fit // 2, fit, 2 * fit) if p > 1}) if fit > 1 else []
        sel_runner = step_runners["sparse+selective"]
        fo = sel_runner.filter_out

        def split_variant(passes: int) -> tuple:
            def project():
                return selective_proj(hid, weight, fo.slot_tokens, fo.tasks, fo.slot_logits, band_start=band,
                                      h_passes=passes)

            def filter_project():
                filter_slots(states, sel_runner.K, **sel_runner.args, out=fo)
                project()
                return fo

            return project, filter_project, lambda: sel_runner.select(filter_project(), scores), True

        for passes in split_passes:
            variants[f"slot-based selective, H in {passes} passes"] = split_variant(passes)
        # equality of the slot logits (before timing)
        full_logits = step_runners["sparse+full"].project(states, hid).slot_logits.clone()
        sel_logits = step_runners["sparse+selective"].project(states, hid).slot_logits.clone()
        split_logits = {}
        for passes in split_passes:
            variants[f"slot-based selective, H in {passes} passes"][1]()
            split_logits[passes] = fo.slot_logits.clone()
        naive_project()
        naive_top = naive_slots.slot_logits.clone()
        tol = TOLERANCE[ctx.dtype]
        fin = torch.isfinite(full_logits)
        agree = dict(
            same_valid_slots=bool(torch.equal(fin, torch.isfinite(sel_logits)) and
                                  torch.equal(fin, torch.isfinite(naive_top))),
            max_diff_selective_vs_full=float((sel_logits - full_logits)[fin].abs().max()) if fin.any() else 0.0,
            max_diff_naive_vs_full=float((naive_top - full_logits)[fin].abs().max()) if fin.any() else 0.0)
        # selective and full keep float32 logits (one contract); the naive ablation rounds to the dtype
        agree["passed"] = agree["same_valid_slots"] and agree["max_diff_selective_vs_full"] <= CONTRACT_TOLERANCE \
            and agree["max_diff_naive_vs_full"] <= tol
        if split_logits:  # float32 sums of the same products, reduced per pass
            agree["selective_h_passes"] = split_passes
            agree["max_diff_h_passes_vs_one_pass"] = max(
                float((v - sel_logits)[fin].abs().max()) if fin.any() else 0.0 for v in split_logits.values())
            agree["passed"] = agree["passed"] and agree["max_diff_h_passes_vs_one_pass"] <= CONTRACT_TOLERANCE
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
        s.release(runner, ctx)
