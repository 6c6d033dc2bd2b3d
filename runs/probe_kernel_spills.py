"""Registers and spills of every Triton kernel specialisation the launchers produce, for sm_90, offline.

Run from the repository root on any machine (no GPU needed): python runs/probe_kernel_spills.py [TOP]
It records the launches of tests/test_kernels_compile.py's shape grid, compiles each distinct
specialisation to PTX and runs Triton's own ptxas on it with -v, then prints the TOP (default 40)
specialisations with the largest spill stack, and how many spill at all.

What it reports is this machine's ptxas, not the lent GPU's compile: the decode attention's merge
kernel of commit f6a5c11 compiles here to 32 registers and a 6,000-byte stack (ptxas 12.8 and 13.0
alike), while on a lent H100 the driver loaded it with 180 registers and no local memory
(runs/results/llm/session-2026-12-06/tune-head.txt). Confirm a stack on the device
(runs/tune_beam_context_attention.py prints each loaded kernel's registers and spills) before
acting on it.
"""
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.pop("TRITON_INTERPRET", None)


def _grid_module():
    spec = importlib.util.spec_from_file_location("kernels_compile_grid", os.path.join(ROOT, "tests",
                                                                                      "test_kernels_compile.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ptxas_report(spec) -> tuple:
    """(stack bytes, registers, kernel, warps, stages, first float pointer's dtype, constexprs) of one spec."""
    import triton
    import triton.backends.nvidia as nvidia
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name, signature, constexprs, warps, pdl, stages, fusion = spec
    fn = getattr(importlib.import_module(module), name)
    options = {"num_warps": warps, "launch_pdl": pdl}
    if stages is not None:
        options["num_stages"] = stages
    if fusion is not None:
        options["enable_fp_fusion"] = fusion
    kernel = triton.compile(ASTSource(fn, signature=dict(signature, **{k: "constexpr" for k in constexprs}),
                                      constexprs=constexprs), target=GPUTarget("cuda", 90, 32), options=options)
    ptxas = os.path.join(os.path.dirname(nvidia.__file__), "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        out = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", ptx, "-o", ptx + ".cubin"], capture_output=True,
                             text=True).stderr
    stack, regs = re.search(r"(\d+) bytes stack frame", out), re.search(r"Used (\d+) registers", out)
    floats = [t[1:] for t in signature.values() if t in ("*fp16", "*bf16", "*fp32")]
    return (int(stack.group(1)) if stack else -1, int(regs.group(1)) if regs else -1, name, warps, stages,
            floats[0] if floats else "-", constexprs)


def main() -> None:
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    specs = _grid_module().record_specs()
    with ProcessPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        rows = sorted(pool.map(ptxas_report, specs), key=lambda r: (-r[0], r[2]))
    for stack, regs, name, warps, stages, dtype, constexprs in rows[:top]:
        print(f"stack {stack:6d} B  registers {regs:3d}  {name}  {dtype} warps={warps} stages={stages}  {constexprs}")
    print(f"{len(rows)} specialisations, {sum(r[0] > 0 for r in rows)} with a spill stack")


if __name__ == "__main__":
    main()
