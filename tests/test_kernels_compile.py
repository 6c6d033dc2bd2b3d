"""Every Triton kernel specialisation the launchers produce compiles for the lent GPU (Hopper, sm_90), offline.

The interpreter tests check what the kernels compute, not that the compiler accepts them:
a kernel or a tiling rule changed on a machine without a GPU can still fail to compile
there, and the GPU lease is short. (Triton 3.6 rejects a ``(ROWS, 1)`` top-k tile, which
only showed on the H200.) So CI drives the real ``*_triton`` launchers over a grid of
edge and production shapes with the kernel launch replaced by a recorder (the launchers'
control flow depends on shapes only, so no kernel needs to run), then compiles every
distinct specialisation they asked for down to a cubin, which Triton does without a
device (with its own ptxas). The work runs in a subprocess: the test session imports the
kernels under ``TRITON_INTERPRET=1``, which replaces them with interpreted functions.
"""
import itertools
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "fp8e4nv", "int64": "i64",
          "int32": "i32", "int16": "i16", "int8": "i8", "bool": "i1"}


def _arg_type(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return "*" + _TYPES[str(value.dtype).replace("torch.", "")]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    return "fp32"


def _launch_grid():
    """Call every launcher over the shape grid (yields nothing; the recorder collects)."""
    import torch

    from zerogr_kernels.filtering import filter_slots_triton
    from zerogr_kernels.normalize import log_softmax_slots_triton
    from zerogr_kernels.selection import PATHS, topk_gather_triton
    from zerogr_kernels.selective import MANY_TASKS, selective_proj_triton

    e = torch.empty
    # (beams per request, K, beam width): K = 1 and 3, beam width 1, single beams, dense
    # wide rows (watch-like step 2), search-like rows, beam 256, codebook 16384
    # the engine always normalises in the selection and extends prefixes after step 0
    # (True, 3, True): catalog-normalised lists, deferred slots dropped by the selection
    for (mb, K, bw), (normalize, level, deferred) in itertools.product(
            [(1, 1, 4), (4, 1, 4), (1, 3, 1), (2, 2, 2), (128, 8, 128), (128, 300, 128), (1, 8192, 128),
             (128, 8192, 128), (256, 64, 256), (2, 16384, 128)],
            [(False, 0, False), (True, 3, False), (True, 3, True)]):
        batch = 2
        scores = e(batch * mb, K)
        prefixes = (e(batch, mb, level, dtype=torch.int64), e(batch, bw, level + 1, dtype=torch.int64)) \
            if level else None
        for path in PATHS:
            try:
                topk_gather_triton(scores, e(batch * mb, K, dtype=torch.int32), e(batch * mb, K, dtype=torch.int64),
                                   batch, bw, beam_scores=e(batch * mb) if normalize else None, path=path,
                                   prefixes=prefixes, deferred=deferred)
            except ValueError:  # e.g. the small path's tile limit: the launcher refuses, nothing to compile
                pass
    for K, n_beams in [(1, 1), (3, 5), (300, 256), (16384, 64)]:
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            log_softmax_slots_triton(e(n_beams, K, dtype=dtype), e(n_beams))
        for logits in (None, e(n_beams, K + 7, dtype=torch.float16), e(n_beams, K, dtype=torch.float32)):
            for tok_dtype, off_dtype in [(torch.int16, torch.int32), (torch.int32, torch.int64)]:
                filter_slots_triton(e(n_beams, dtype=torch.int64), K, tokens=e(10, dtype=tok_dtype),
                                    offsets=e(4, dtype=off_dtype), logits=logits)
            if logits is None or logits.shape[1] == K:
                filter_slots_triton(e(n_beams, dtype=torch.int64), K, table=e(4, K, dtype=torch.int32),
                                    logits=logits)
    from zerogr_kernels.constraints import constrain_slots_triton
    from zerogr_kernels.scored_constraints import constrain_scored_slots_triton

    for (K, n_beams), dtype, starts in itertools.product(
            [(1, 2), (3, 4), (300, 256), (16384, 2), (1024, 4096)],  # the last: several blocks per program
            (torch.float16, torch.bfloat16, torch.float32),
            (None, e(9, dtype=torch.int32), e(9, dtype=torch.int64))):
        lists = (e(4, dtype=torch.int64), e(1024, dtype=torch.int64), e(2, dtype=torch.int32), n_beams // 2, 11)
        for defer in (False, True):
            constrain_slots_triton(e(n_beams, K, dtype=torch.int32), e(n_beams, K, dtype=torch.int64),
                                   e(n_beams, K, dtype=dtype), starts, *lists, defer)
        constrain_scored_slots_triton(e(n_beams, K, dtype=torch.int32), e(n_beams, K, dtype=torch.int64),
                                      e(n_beams, K, dtype=dtype), starts, *lists, e(n_beams), e(n_beams))
    from zerogr_kernels.constraints import SlotLists

    # the filters with the lists applied as they fill the slots (the engine's constrained steps)
    # (and with allow lists as bitmaps of alive successors: ``nodes``)
    for (K, n_beams), starts, defer, marks in itertools.product(
            [(3, 4), (300, 256), (8192, 2)], (None, e(9, dtype=torch.int32)), (False, True),
            ({}, dict(marks=e(8, dtype=torch.int32), mark_shift=0),
             dict(marks=e(8, dtype=torch.int32), mark_shift=0, spans=e(3, dtype=torch.int64), floor=5),
             dict(nodes=e(2, 40, dtype=torch.int32), node_off=3, node_stride=40))):
        lists = SlotLists(starts, e(4, dtype=torch.int64), e(1024, dtype=torch.int64), e(2, dtype=torch.int32),
                          n_beams // 2, 11, defer, **marks)
        for logits in (None, e(n_beams, K, dtype=torch.float32)):
            filter_slots_triton(e(n_beams, dtype=torch.int64), K, tokens=e(10, dtype=torch.int16),
                                offsets=e(4, dtype=torch.int32), logits=logits, constraint=lists)
            filter_slots_triton(e(n_beams, dtype=torch.int64), K, table=e(4, K, dtype=torch.int32), logits=logits,
                                constraint=lists)
    from zerogr_kernels.deny_ids import MAX_IDS, MAX_WIDTH, deny_rows_triton

    # the sorting kernel and the wide path's two, with int32 keys and (past 2^31 rows) int64 ones
    for width, table_dtype, marks, n_rows, spans in itertools.product(
            (16, 128, MAX_WIDTH, 2 * MAX_WIDTH, MAX_IDS), (torch.int32, torch.int64),
            (None, e(8, dtype=torch.int32)), (90, 2**31 + 5), (None, e(3, dtype=torch.int64))):
        if n_rows > 90 and (table_dtype == torch.int32 or width not in (128, MAX_IDS)):
            continue
        deny_rows_triton(e(40, dtype=torch.int64), e(4, dtype=torch.int64), width, e(100, dtype=table_dtype), 7,
                         e(3 * width, dtype=torch.int64), e(5, dtype=torch.int64), n_rows, marks=marks, spans=spans)
    from zerogr_kernels.list_spans import list_spans_triton

    list_spans_triton(e(34, dtype=torch.int64), e(2000, dtype=torch.int64), e(33, dtype=torch.int64))
    from zerogr_kernels.allow_nodes import allow_nodes_triton

    # one program count and batch per shape: a request's search over the id offsets unrolls by batch
    for batch, levels, table_dtype in itertools.product((1, 3, 32), (1, 5), (torch.int32, torch.int64)):
        # the suite's two derived steps, where there are steps to derive
        derived = tuple((e(41, dtype=torch.int32), 3, 0, 2) for _ in range(min(2, levels - 1)))
        allow_nodes_triton(e(5000, dtype=torch.int64), e(batch + 1, dtype=torch.int64), e(100, dtype=table_dtype), 7,
                           e(max(levels - 1, 1), 30, dtype=torch.int32), e(max(levels - 1, 1), 30, dtype=torch.int32),
                           e(levels, dtype=torch.int64), e(batch, 64, dtype=torch.int32), derived)
    for (K, H), dtype in itertools.product([(1, 48), (3, 1024), (300, 1024), (64, 4096)],
                                           (torch.float16, torch.bfloat16, torch.float32)):
        n_beams = 4
        tasks = torch.zeros(n_beams, 3, dtype=torch.int32)
        selective_proj_triton(e(n_beams, H, dtype=dtype), e(K + 5, H, dtype=dtype), e(n_beams, K, dtype=torch.int32),
                              tasks, e(n_beams, K))
        if H == 4096:  # the hidden dimension in cache-sized passes (float32: 4 passes for 4096 rows)
            selective_proj_triton(e(n_beams, H, dtype=dtype), e(K + 5, H, dtype=dtype),
                                  e(n_beams, K, dtype=torch.int32), tasks, e(n_beams, K), h_passes=4)
        # a queue long enough for the 2-D accumulator, and the hidden dimension split over programs
        many = torch.zeros(MANY_TASKS, 3, dtype=torch.int32)
        selective_proj_triton(e(MANY_TASKS, H, dtype=dtype), e(K + 5, H, dtype=dtype),
                              e(MANY_TASKS, K, dtype=torch.int32), many, e(MANY_TASKS, K))
        selective_proj_triton(e(n_beams, H, dtype=dtype), e(K + 5, H, dtype=dtype), e(n_beams, K, dtype=torch.int32),
                              tasks, e(n_beams, K), h_split=2)
    from zerogr_kernels.beam_groups import BeamGroups, group_beams_triton
    from zerogr_kernels.shared_selective import shared_selective_proj_triton

    group_beams_triton(e(4096, dtype=torch.int64), 7861)
    # the engine's group sizes; rows of 1, 11, 201 and 8,192 slots
    for (K, H), g, dtype in itertools.product([(1, 48), (11, 1024), (201, 4096), (8192, 1024)], (1, 2, 4),
                                              (torch.float16, torch.bfloat16, torch.float32)):
        n_beams = 64
        groups = BeamGroups.empty(n_beams, 10, "cpu")
        shared_selective_proj_triton(e(n_beams, H, dtype=dtype), e(K + 5, H, dtype=dtype),
                                     e(n_beams, K, dtype=torch.int32), e(n_beams, K), groups, group_size=g)

    from zerogr_kernels.beam_attention import cached_self_attention_triton
    from zerogr_kernels.rms_norm import rms_layer_norm_triton

    # T5 widths (d_model 16 … 1024, a non-power of two), one row and a decode's 4,096 rows;
    # a float32 weight over half-precision rows; with and without the fused residual add
    for (n, d), dtype, residual in itertools.product([(1, 1), (7, 100), (4096, 128), (4096, 512), (64, 1024)],
                                                     (torch.float16, torch.bfloat16, torch.float32), (False, True)):
        x = e(n, d, dtype=dtype)
        for w_dtype in {dtype, torch.float32}:
            rms_layer_norm_triton(x, e(d, dtype=w_dtype), 1e-6, residual=e(n, d, dtype=dtype) if residual else None)
    from zerogr_kernels.head_norm_rope import qk_norm_rope_triton
    from zerogr_kernels.row_sums import row_sum_squares_triton
    from zerogr_kernels.swiglu import silu_mul_triton

    # Qwen3: hidden 2,048 rows (prefill, decode, one kept row) summed in eager order; q/k heads of
    # 128 (eager order) and of 16 (a tiny config, Triton's tree), keys straight into a cache; SwiGLU
    for n, dtype in itertools.product((1, 256, 1000), (torch.bfloat16, torch.float32)):
        rms_layer_norm_triton(e(n, 2048, dtype=dtype), e(2048, dtype=dtype), 1e-6, residual=e(n, 2048, dtype=dtype))
        row_sum_squares_triton(e(n, 2048, dtype=dtype))
        for heads, kvh, d in ((16, 8, 128), (4, 2, 16)):
            q, k = e(n, heads, d, dtype=dtype), e(n, kvh, d, dtype=dtype)
            qk_norm_rope_triton(q, k, e(d, dtype=dtype), e(d, dtype=dtype), 1e-6, e(n, d, dtype=dtype),
                                e(n, d, dtype=dtype), k_out=e(1, n, kvh, d, dtype=dtype), v=e(n, kvh, d, dtype=dtype),
                                v_out=e(1, n, kvh, d, dtype=dtype))
        silu_mul_triton(e(n, 2 * 6144, dtype=dtype))
    from zerogr_kernels.fp8_rows import quantize_rows_triton

    # the FP8 projections' activations: Qwen3-1.7B's GEMM inputs (hidden 2,048, FFN 6,144) at a decode's
    # 256 rows and a prefill's 8,064, and rows wider than a block (two passes) in every dtype
    for n, k in ((256, 2048), (256, 6144), (8064, 2048), (8064, 6144)):
        quantize_rows_triton(e(n, k, dtype=torch.bfloat16))
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        quantize_rows_triton(e(3, 9000, dtype=dtype))
    # every step of an 8-level decode; head widths 64 (T5's), 8 and 5 (not a power of two)
    for step, (heads, d), dtype in itertools.product(range(8), [(6, 64), (4, 8), (2, 5)],
                                                     (torch.float16, torch.bfloat16, torch.float32)):
        cached_self_attention_triton(e(8, 4096, 3 * heads * d, dtype=dtype), e(8, 4096, dtype=torch.int64),
                                     e(heads, 8), step=step, n=4096, heads=heads)
    from zerogr_kernels.memory_attention import request_attention_triton

    # T5 cross-attention: one beam or 4 … 256 per request, history buckets of 1 … 320 keys;
    # float32 both strict (IEEE) and with TF32 allowed, as the launcher follows PyTorch's switch
    for (m, t), (heads, d), dtype, tf32 in itertools.product(
            [(1, 1), (4, 16), (128, 32), (256, 320)], [(6, 64), (4, 8), (2, 5)],
            (torch.float16, torch.bfloat16, torch.float32), (False, True)):
        if tf32 and dtype != torch.float32:
            continue
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            request_attention_triton(e(2, m, heads * d, dtype=dtype), e(2, t, heads * d, dtype=dtype),
                                     e(2, t, heads * d, dtype=dtype), e(2, 1, 1, t, dtype=dtype), heads=heads)
            if m == t or m == 4:  # the encoder's: slices of a fused projection, a per-head position bias
                qkv = e(2, t, 3 * heads * d, dtype=dtype)
                request_attention_triton(*qkv.split(heads * d, dim=-1), e(2, heads, t, t, dtype=dtype), heads=heads)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
    from zerogr_kernels.context_attention import beam_context_attention_triton

    # Qwen3 decode attention: tiny odd shapes, and Qwen3-1.7B's (16 / 8 heads of 128, beam 256,
    # 3 SID levels) with one split (batch 8) and several (batch 1, then the merge kernel), each
    # with and without an ancestor table (the step model passes one)
    for (b, m, heads, kvh, d, ctx, p, splits), dtype, anc in itertools.product(
            [(1, 3, 2, 1, 16, 1, 2, 1), (2, 5, 4, 2, 24, 40, 1, 3), (1, 256, 16, 8, 128, 1024, 2, 4),
             (8, 256, 16, 8, 128, 5056, 2, 1)], (torch.float16, torch.bfloat16, torch.float32), (False, True)):
        slots = ctx + -(-m * p // 16) * 16
        beam_context_attention_triton(e(b, m, heads, d, dtype=dtype), e(b, slots, kvh, d, dtype=dtype),
                                      e(b, slots, kvh, d, dtype=dtype), e(b, dtype=torch.int64), context_len=ctx,
                                      lineage_len=p, step=p, splits=splits,
                                      lineage=e(b, m, p, dtype=torch.int32) if anc else None)


def record_specs() -> list[tuple]:
    """``(module, kernel, signature, constexprs, num_warps, launch_pdl, num_stages, enable_fp_fusion)`` of every
    distinct launch over the grid (``num_stages``, ``enable_fp_fusion`` None where the launcher leaves Triton's
    default)."""
    from triton.runtime.jit import JITFunction

    specs: dict = {}

    def record(self, *args, grid, warmup, **kwargs):
        params = {p.name for p in self.params}
        constexprs = {k: v for k, v in kwargs.items() if k in params}
        signature = {name: _arg_type(a) for name, a in zip(self.arg_names, args)}
        spec = (self.fn.__module__, self.fn.__name__, signature, constexprs, kwargs.get("num_warps", 4),
                bool(kwargs.get("launch_pdl", False)), kwargs.get("num_stages"), kwargs.get("enable_fp_fusion"))
        specs.setdefault(repr(spec), spec)

    original = JITFunction.run
    JITFunction.run = record
    try:
        _launch_grid()
    finally:
        JITFunction.run = original
    return list(specs.values())


def compile_spec(spec: tuple) -> str:
    """Compile one recorded spec for sm_90; return ``""`` or a one-line failure."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name, signature, constexprs, warps, pdl, stages, fusion = spec
    fn = getattr(importlib.import_module(module), name)
    sig = dict(signature, **{k: "constexpr" for k in constexprs})
    options = {"num_warps": warps, "launch_pdl": pdl}
    if stages is not None:
        options["num_stages"] = stages
    if fusion is not None:
        options["enable_fp_fusion"] = fusion
    try:
        kernel = triton.compile(ASTSource(fn, signature=sig, constexprs=constexprs),
                                target=GPUTarget("cuda", 90, 32), options=options)
        assert kernel.asm["cubin"], "empty cubin"
    except Exception as exc:  # noqa: BLE001 - report every kernel, not only the first
        first = (str(exc).strip().splitlines() or [""])[0]
        return (f"FAILED {name} {constexprs} num_warps={warps} launch_pdl={pdl} num_stages={stages}: "
                f"{type(exc).__name__}: {first}")
    return ""


def compile_all() -> int:
    """Compile every recorded spec (over the CPU cores); print the failures; return their count."""
    from concurrent.futures import ProcessPoolExecutor

    specs = record_specs()
    with ProcessPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        failures = [msg for msg in pool.map(compile_spec, specs) if msg]
    for msg in failures:
        print(msg)
    names = sorted({name for _, name, *_ in specs})
    print(f"compiled {len(specs) - len(failures)} of {len(specs)} kernel specialisations for sm_90 "
          f"({len(names)} kernels: {', '.join(names)}); {sum(s[5] for s in specs)} launched with programmatic "
          f"dependent launch")
    print("decode attention pipeline stages:", sorted({s[6] for s in specs if s[1] == "_split_kernel"}))
    print("filter launches (HAS_LOGITS, launch_pdl):",
          sorted({(c["HAS_LOGITS"], pdl) for _, name, _, c, _, pdl, *_ in specs if name.startswith("_filter")}))
    return len(failures)


def test_every_launched_specialisation_compiles_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    # the decode's kernels as an sm_90 device launches them: with programmatic dependent launch
    env["ZEROGR_PDL"] = "force"
    result = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    out = result.stdout
    # every kernel of the package was reached by the grid
    for kernel in ("_rows_topk_kernel", "_chunk_topk_kernel", "_row_stats_kernel", "_threshold_kernel",
                   "_slot_keys_kernel", "_gather_kernel", "_log_softmax_slots_kernel", "_filter_sparse_kernel",
                   "_filter_dense_kernel", "_selective_proj_kernel", "_split_sum_kernel", "_constrain_kernel",
                   "_constrain_scored_kernel", "_deny_rows_kernel", "_deny_keys_kernel",
                   "_deny_count_kernel", "_deny_distinct_kernel", "_rms_norm_kernel", "_qk_norm_rope_kernel",
                   "_row_sum_squares_kernel", "_silu_mul_kernel", "_quantize_rows_kernel",
                   "_cached_attention_kernel", "_request_attention_kernel", "_split_kernel",
                   "_merge_kernel"):
        assert kernel in out, f"{kernel} not launched by the shape grid"
    pdl = int(out.split(" launched with programmatic dependent launch")[0].rsplit(" ", 1)[-1])
    assert pdl > 0, out[-2000:]
    # the filter that copies a band GEMM's logits is the one decode kernel launched without it
    assert "filter launches (HAS_LOGITS, launch_pdl): [(False, True), (True, False)]" in out, out[-2000:]
    # short splits pipeline two deep, long ones three (batch 8, 5,056 keys, one split)
    assert "decode attention pipeline stages: [2, 3]" in out, out[-2000:]


def test_pdl_switch(monkeypatch):
    import torch

    from zerogr_kernels._common import pdl_args, pdl_disabled, pdl_enabled

    cpu = torch.device("cpu")
    monkeypatch.setenv("ZEROGR_PDL", "1")
    assert not pdl_enabled(cpu) and pdl_args(cpu) == {"PDL": False}
    monkeypatch.setenv("ZEROGR_PDL", "force")
    assert pdl_args(cpu) == {"PDL": True, "launch_pdl": True}
    with pdl_disabled():  # what a constrained graph of a large batch is captured under
        assert pdl_args(cpu) == {"PDL": False}
        with pdl_disabled(False):
            assert pdl_enabled(cpu)
    assert pdl_enabled(cpu)
    monkeypatch.setenv("ZEROGR_PDL", "0")
    assert not pdl_enabled(torch.device("cuda", 0))    # off before any device query


if __name__ == "__main__":
    sys.exit(1 if compile_all() else 0)
