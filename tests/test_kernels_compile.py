"""Every Triton kernel compiles for the lent GPU's architecture (Hopper, sm_90), offline.

The interpreter tests check what the kernels compute, not that the compiler accepts them:
a kernel changed on a machine without a GPU could still fail to compile there, and the
GPU lease is short. Triton compiles ahead of time without a device (with its own ptxas),
so CI compiles representative specialisations of each kernel down to a cubin. The
compiles run in a subprocess: the test session imports the kernels under
``TRITON_INTERPRET=1``, which replaces them with interpreted functions.
"""
import itertools
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GATHER = {"slot_tok_ptr": "*i32", "slot_succ_ptr": "*i64", "out_score_ptr": "*fp32", "out_parent_ptr": "*i64",
          "out_tok_ptr": "*i32", "out_succ_ptr": "*i64", "prev_ptr": "*i64", "next_ptr": "*i64", "level": "i32",
          "Mb": "i32", "K": "i32", "M": "i32"}
FILTER_OUT = {"slot_tok_ptr": "*i32", "slot_succ_ptr": "*i64", "slot_logit_ptr": "*fp32", "seg_len_ptr": "*i32",
              "tasks_ptr": "*i32", "n_beams": "i32", "K": "i32", "n_col_tasks": "i32"}

# (module, kernel, runtime argument types, constexprs, num_warps)
SPECS = [
    *(("selection", "_rows_topk_kernel",
       {"scores_ptr": "*fp32", "beam_scores_ptr": "*fp32", "top_ptr": "*i64", "lse_ptr": "*fp32", "thr_ptr": "*fp32",
        **GATHER},
       dict(NORMALIZE=True, ROWS=1 if n_col > 1 else 4, BLOCK_C=1024 if n_col > 1 else 256, N_COL=n_col,
            BLOCK_OUT=128, FINAL=final, PRUNE=prune, EXTEND=True, LP=4), 8)
      for prune, final, n_col in itertools.product([False, True], [False, True], [1, 8])),
    *(("selection", "_chunk_topk_kernel", {"keys_ptr": "*i64", "L": "i32", "top_ptr": "*i64", **GATHER},
       dict(CHUNK=1024, BLOCK_OUT=128, FINAL=final, PRUNE=prune, EXTEND=False, LP=2), 8)
      for prune, final in itertools.product([False, True], [False, True])),
    ("selection", "_row_stats_kernel",
     {"x_ptr": "*fp32", "beam_scores_ptr": "*fp32", "lse_ptr": "*fp32", "best_ptr": "*fp32", "n_rows": "i32",
      "K": "i32"}, dict(NORMALIZE=True, ROWS=1, BLOCK_K=2048, N_CHUNKS=4), 4),
    ("selection", "_threshold_kernel", {"best_ptr": "*fp32", "thr_ptr": "*fp32", "Mb": "i32", "M": "i32"},
     dict(BLOCK_MB=128), 4),
    ("selection", "_slot_keys_kernel",
     {"x_ptr": "*fp16", "beam_scores_ptr": "*fp32", "keys_ptr": "*i64", "n_rows": "i32", "Mb": "i32", "K": "i32"},
     dict(NORMALIZE=True, ROWS=4, BLOCK_K=256, N_CHUNKS=1), 4),
    ("selection", "_gather_kernel", {"top_ptr": "*i64", "n_top": "i32", **GATHER},
     dict(BLOCK_OUT=128, EXTEND=True, LP=8), 4),
    ("normalize", "_log_softmax_slots_kernel",
     {"x_ptr": "*bf16", "score_ptr": "*fp32", "out_ptr": "*fp32", "n_rows": "i32", "K": "i32"},
     dict(ROWS=1, BLOCK_K=2048, N_CHUNKS=4), 4),
    ("filtering", "_filter_sparse_kernel",
     {"states_ptr": "*i64", "tokens_ptr": "*i16", "offsets_ptr": "*i32", "logits_ptr": "*fp16", **FILTER_OUT,
      "stride_lb": "i32", "stride_lv": "i32"}, dict(HAS_LOGITS=True, ROWS=8, BLOCK_K=64, TASK_W=64), 4),
    ("filtering", "_filter_dense_kernel",
     {"states_ptr": "*i64", "table_ptr": "*i32", "logits_ptr": "*fp16", **FILTER_OUT, "stride_ds": "i32",
      "stride_dv": "i32", "stride_lb": "i32", "stride_lv": "i32"},
     dict(HAS_LOGITS=True, ATOMIC_LEN=True, ROWS=8, BLOCK_K=64, TASK_W=64), 4),
    *(("selective", "_selective_proj_kernel",
       {"hidden_ptr": f"*{dt}", "weight_ptr": f"*{dt}", "slot_tok_ptr": "*i32", "tasks_ptr": "*i32",
        "out_ptr": "*fp32", "n_tasks": "i32", "K": "i32", "band_start": "i32", "stride_hb": "i32",
        "stride_hh": "i32", "stride_wv": "i32", "stride_wh": "i32"},
       dict(H=1024, BLOCK_T=64, BLOCK_H=128, TASKS_PER_PROG=1), 4) for dt in ("fp16", "fp32")),
]


def compile_all() -> int:
    """Compile every spec for sm_90; print one line per failure; return the failure count."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target, failures = GPUTarget("cuda", 90, 32), 0
    for module, name, signature, constexprs, warps in SPECS:
        fn = getattr(importlib.import_module(f"kernels.{module}"), name)
        sig = dict(signature, **{k: "constexpr" for k in constexprs})
        try:
            kernel = triton.compile(ASTSource(fn, signature=sig, constexprs=constexprs), target=target,
                                    options={"num_warps": warps})
            assert kernel.asm["cubin"], "empty cubin"
        except Exception as exc:  # noqa: BLE001 - report every kernel, not only the first
            failures += 1
            first = (str(exc).strip().splitlines() or [""])[0]
            print(f"FAILED {module}.{name} {constexprs}: {type(exc).__name__}: {first}")
    print(f"compiled {len(SPECS) - failures} of {len(SPECS)} kernel specialisations for sm_90")
    return failures


def test_every_kernel_compiles_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert f"compiled {len(SPECS)} of {len(SPECS)}" in result.stdout


if __name__ == "__main__":
    sys.exit(1 if compile_all() else 0)
