"""Tuning sweeps of the two projections on shapes of the search-like steps.

**Selective** (``--part selective``).

Each shape is one step of the search-like 2·10^7 catalog at beam 128 (``n_beams`` beams in
state, ``K`` slots per row, ``mean`` valid slots per beam, a band of ``rows`` head rows),
drawn at random: every beam gets a sorted sample of distinct band tokens, its count drawn
around the step's mean and capped at ``K``. Every tuning of
:func:`zerogr_kernels.selective_proj_triton` (accumulator layout, hidden-dimension chunk,
warps, hidden splits) is captured in a CUDA graph and its replays timed (median of 30);
each result is checked against the default tuning.

**Shared** (``--part shared``): search-like step 2 (7,861 states, each with its own sorted
segment of about 153 of 4,096 band tokens) for batches of 32 and 128 requests at beam 128,
every request on 128 distinct states drawn uniformly, so beams of different requests meet
in a state as often as independent requests do. The per-beam kernel at its default tuning
against :func:`zerogr_kernels.shared_selective_proj_triton` at several group sizes and tunings,
each timed with its :func:`zerogr_kernels.group_beams` sort inside the graph, as the engine
runs it.

**Full** (``--part full``): the band GEMM with float32 output at the search-like steps'
shapes, as :func:`zerogr_kernels.full_proj` runs it (one cuBLAS GEMM) and split over the
hidden dimension into ``S`` batched GEMMs whose float32 partials are summed (more CTAs for
the few-row GEMMs of step 1, which read a 128 MiB float32 band).

    python -m zerogr_core.bench.projection_sweep --part selective,full,shared --out runs/results/projection-sweep/sweep.json

The JSON holds the environment (GPU, driver, torch, triton) and one record per (shape,
dtype, tuning).
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

from zerogr_core.arg_types import seconds
from zerogr_core.environment import environment
from zerogr_core.timing import median_us, synchronize
from zerogr_kernels import (BeamGroups, full_proj, group_beams, selective_proj_triton,
                            shared_selective_proj_triton)
from zerogr_kernels.filtering import TASK_WIDTH

# (name, n_beams, K, mean valid slots per beam, band rows): search-like steps 1-4 at beam 128
SHAPES = [
    ("b32-step2", 4096, 201, 153, 4096),
    ("b32-step3", 4096, 25, 8, 2048),
    ("b32-step4", 4096, 11, 2, 2048),
    ("b8-step2", 1024, 201, 153, 4096),
    ("b1-step2", 128, 201, 153, 4096),
    ("b1-step3", 128, 25, 8, 2048),
    ("b1-step4", 128, 11, 2, 2048),
    ("b32-step1", 32, 8192, 7861, 8192),
]
CONFIGS = {"fp32": (torch.float32, 4096), "fp16": (torch.float16, 1024), "bf16": (torch.bfloat16, 1024)}


def draw_slots(n_beams: int, K: int, mean: int, rows: int, device, gen):
    """(slot_tokens, tasks, pairs): random sparse slot rows whose valid slots lead each row."""
    spread = max(1, mean // 3)
    counts = (torch.randn(n_beams, generator=gen, device=device) * spread + mean).round().clamp(1, K).long()
    toks = torch.rand(n_beams, rows, generator=gen, device=device).argsort(dim=1)[:, :K].sort(dim=1).values
    cols = torch.arange(K, device=device)
    slot_tokens = torch.where(cols[None, :] < counts[:, None], toks, -1).to(torch.int32).contiguous()
    return slot_tokens, work_queue(counts, K), int(counts.sum())


def work_queue(counts: torch.Tensor, K: int) -> torch.Tensor:
    """The filter's ``(n * ceil(K / 64), 3)`` queue for rows whose ``counts`` valid slots lead them."""
    n, T = counts.numel(), -(-K // TASK_WIDTH)
    start = torch.arange(T, device=counts.device) * TASK_WIDTH
    cnt = (counts[:, None] - start[None, :]).clamp(0, TASK_WIDTH)
    beam = torch.arange(n, device=counts.device)[:, None].expand(n, T)
    return torch.stack([beam, start[None, :].expand(n, T), cnt], dim=2).reshape(-1, 3).to(torch.int32).contiguous()


def tunings(H: int):
    yield "default", {}
    for acc2d, bh, nw in itertools.product((False, True), (64, 128, 256, 512), (2, 4, 8)):
        if bh <= H:
            yield f"{'acc2d' if acc2d else 'acc1d'}/h{bh}/w{nw}", dict(acc2d=acc2d, block_h=bh, num_warps=nw)
    for split, bh, nw in itertools.product((2, 4, 8), (128, 256) if H > 64 else (16,), (4,)):
        yield f"acc2d/h{bh}/w{nw}/split{split}", dict(acc2d=True, block_h=bh, num_warps=nw, h_split=split)


def sweep_selective(args, dev, records, t_start) -> None:
    want = set(args.shapes.split(","))
    for dname in args.dtypes.split(","):
        dtype, H = CONFIGS[dname]
        gen = torch.Generator(device=dev).manual_seed(0)
        if args.dry_run:
            H = 40
        for name, n_beams, K, mean, rows in SHAPES:
            if name not in want:
                continue
            if args.dry_run:
                n_beams, K, mean, rows = min(n_beams, 6), min(K, 70), min(mean, 50), min(rows, 300)
            slot_tokens, tasks, pairs = draw_slots(n_beams, K, mean, rows, dev, gen)
            band = 128
            weight = (torch.randn(band + rows, H, generator=gen, device=dev) / H ** 0.5).to(dtype)
            hidden = torch.randn(n_beams, H, generator=gen, device=dev).to(dtype)
            logits = torch.empty(n_beams, K, device=dev)
            variants = {label: (lambda kw=kw: selective_proj_triton(hidden, weight, slot_tokens, tasks, logits,
                                                                    band_start=band, **kw))
                        for label, kw in itertools.islice(tunings(H), 3 if args.dry_run else None)}
            rec = dict(part="selective", shape=name, dtype=dname, hidden=H, n_beams=n_beams, K=K, mean=mean,
                       band_rows=rows, valid_pairs=pairs)
            if not measure_variants(variants, logits, rec, pairs * H * weight.element_size(), args, dev, records,
                                    t_start):
                return


# (name, batch, beam, states, K, mean valid slots per state, band rows): search-like step 2
SHARED_SHAPES = [("b32-step2", 32, 128, 7861, 201, 153, 4096), ("b128-step2", 128, 128, 7861, 201, 153, 4096)]
SHARED_TUNINGS = [("g1/h64/w4", 1, 64, 4), ("g2/h64/w4", 2, 64, 4), ("g2/h64/w8", 2, 64, 8), ("g2/h32/w4", 2, 32, 4),
                  ("g4/h32/w4", 4, 32, 4), ("g4/h64/w8", 4, 64, 8), ("g4/h32/w8", 4, 32, 8)]


def draw_shared(batch: int, beam: int, n_states: int, K: int, mean: int, rows: int, device, gen):
    """(states, slot_tokens, tasks, pairs): every request's beams on distinct random states, every
    state's valid tokens a fixed sorted sample of the band, so beams in one state share their row."""
    seg_tokens, _, _ = draw_slots(n_states, K, mean, rows, device, gen)
    states = torch.rand(batch, n_states, generator=gen, device=device).argsort(dim=1)[:, :beam].reshape(-1)
    slot_tokens = seg_tokens[states].contiguous()
    counts = (slot_tokens >= 0).sum(1)
    return states, slot_tokens, work_queue(counts, K), int(counts.sum())


def sweep_shared(args, dev, records, t_start) -> None:
    for dname in args.dtypes.split(","):
        dtype, H = CONFIGS[dname]
        gen = torch.Generator(device=dev).manual_seed(2)
        if args.dry_run:
            H = 40
        for name, batch, beam, n_states, K, mean, rows in SHARED_SHAPES:
            if args.dry_run:
                batch, beam, n_states, K, mean, rows = 3, 4, 6, 70, 50, 300
            states, slot_tokens, tasks, pairs = draw_shared(batch, beam, n_states, K, mean, rows, dev, gen)
            n = states.numel()
            weight = (torch.randn(rows, H, generator=gen, device=dev) / H ** 0.5).to(dtype)
            hidden = torch.randn(n, H, generator=gen, device=dev).to(dtype)
            groups = BeamGroups.empty(n, n_states, dev)
            logits = torch.empty(n, K, device=dev)
            rec = dict(part="shared", shape=name, dtype=dname, hidden=H, n_beams=n, K=K, mean=mean, band_rows=rows,
                       valid_pairs=pairs, distinct_states=int(torch.unique(states).numel()))
            variants = {"per-beam default": lambda: selective_proj_triton(hidden, weight, slot_tokens, tasks, logits)}
            for label, g, bh, nw in SHARED_TUNINGS[:3] if args.dry_run else SHARED_TUNINGS:
                variants[label] = (lambda g=g, bh=bh, nw=nw: shared_selective_proj_triton(
                    hidden, weight, slot_tokens, logits, group_beams(states, n_states, out=groups), group_size=g,
                    block_h=bh, num_warps=nw))
            if not measure_variants(variants, logits, rec, pairs * H * weight.element_size(), args, dev, records,
                                    t_start):
                return


# (name, rows of hidden states, band rows): the GEMMs of search-like steps 1 and 2
GEMMS = [("b1-step1", 1, 8192), ("b8-step1", 8, 8192), ("b32-step1", 32, 8192), ("b1-step2", 128, 4096),
         ("b32-step2", 4096, 4096), ("b32-step3", 4096, 2048)]


def split_k_proj(hidden: torch.Tensor, band: torch.Tensor, S: int, out: torch.Tensor) -> torch.Tensor:
    """``hidden @ band.T`` as ``S`` batched GEMMs over slices of H, float32 partials summed."""
    M, H = hidden.shape
    part = torch.bmm(hidden.view(M, S, H // S).transpose(0, 1), band.view(-1, S, H // S).permute(1, 2, 0))
    return torch.sum(part, dim=0, out=out)


def sweep_full(args, dev, records, t_start) -> None:
    for dname in args.dtypes.split(","):
        dtype, H = CONFIGS[dname]
        gen = torch.Generator(device=dev).manual_seed(1)
        if args.dry_run:
            H = 64
        for name, M, V in GEMMS:
            if args.dry_run:
                M, V = min(M, 8), min(V, 96)
            band = (torch.randn(V, H, generator=gen, device=dev) / H ** 0.5).to(dtype)
            hidden = torch.randn(M, H, generator=gen, device=dev).to(dtype)
            out = torch.empty(M, V, device=dev)
            variants = {"mm": lambda: full_proj(hidden, band, 0, V, out=out)}
            if dtype == torch.float32:
                for S in (2, 4, 8):
                    variants[f"split-k {S}"] = (lambda S=S: split_k_proj(hidden, band, S, out))
            rec = dict(part="full", shape=name, dtype=dname, hidden=H, n_beams=M, band_rows=V)
            if not measure_variants(variants, out, rec, V * H * band.element_size(), args, dev, records, t_start):
                return


def measure_variants(variants: dict, result: torch.Tensor, rec: dict, nbytes: int, args, dev, records,
                     t_start: float) -> bool:
    """Measure each ``label -> call`` of ``variants`` (which write ``result``) against the first,
    one record each (``rec`` plus ``tuning``); False once the time budget is spent."""
    ref = None
    for label, call in variants.items():
        if time.time() - t_start > args.budget_s:
            print("budget spent", flush=True)
            return False
        result.fill_(float("-inf"))  # slots a variant does not write stay -inf, as the engine's
        ref = measure(call, lambda: result, ref, args, dev, records, dict(rec, tuning=label), nbytes)
    return True


def measure(call, result, ref, args, dev, records, rec: dict, nbytes: int):
    """Run ``call`` once, compare ``result()`` with ``ref`` (the first tuning's), time it; returns ``ref``."""
    try:
        call()
        synchronize(dev)
        got = result()
        if ref is None:
            ref = got.clone()
        ok = torch.isfinite(ref)
        diff = float((got[ok] - ref[ok]).abs().max()) if ok.any() else 0.0
        same_mask = bool(torch.equal(torch.isfinite(got), ok))
        med = median_us(call, dev, repeats=args.repeats)
        status = "ok"
    except Exception as exc:  # noqa: BLE001 - a tuning that fails to compile is recorded
        if args.dry_run:
            raise
        med, diff, same_mask, status = None, None, None, f"error: {type(exc).__name__}: {exc}"[:300]
    rec.update(median_us=med, max_abs_diff=diff, same_mask=same_mask, status=status,
               gbps=None if med is None else nbytes / med / 1e3)
    records.append(rec)
    print(json.dumps(rec), flush=True)
    return ref


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--part", default="selective,full")
    ap.add_argument("--dtypes", default="fp32,fp16")
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES), help="selective shapes")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--budget-s", type=seconds(), default=400.0)
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU check of this script: tiny shapes under TRITON_INTERPRET=1, three tunings")
    args = ap.parse_args(argv)
    parts = {"selective": sweep_selective, "full": sweep_full, "shared": sweep_shared}
    for flag, given, known in (("--part", args.part, parts), ("--dtypes", args.dtypes, CONFIGS),
                               ("--shapes", args.shapes, [s[0] for s in SHAPES])):
        unknown = [v for v in given.split(",") if v not in known]
        if unknown:
            ap.error(f"{flag}: unknown value {unknown[0]!r} (choose from {', '.join(known)})")
    if not args.dry_run and not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (--dry-run checks the script on a CPU)")
    dev = torch.device("cpu" if args.dry_run else "cuda")
    t_start = time.time()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    for part in args.part.split(","):
        parts[part](args, dev, records, t_start)
        out.write_text(json.dumps(dict(env=environment(dev), command=" ".join(sys.argv), records=records), indent=1))
    best = {}
    for r in records:
        if r["median_us"] is not None:
            k = (r["part"], r["shape"], r["dtype"])
            if k not in best or r["median_us"] < best[k]["median_us"]:
                best[k] = r
    for (part, shape, dname), r in sorted(best.items()):
        base = next(x for x in records if (x["part"], x["shape"], x["dtype"]) == (part, shape, dname))
        print(f"{part} {dname} {shape}: {base['tuning']} {base['median_us']:.1f} us, "
              f"best {r['tuning']} {r['median_us']:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
