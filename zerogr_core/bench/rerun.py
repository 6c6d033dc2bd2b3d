"""Command lines that rerun a benchmark: the whole run, or the one record it wrote.

``o`` is a :class:`~zerogr_core.bench.options.Options`.
"""
from __future__ import annotations

import shlex

BASE = ["python", "-m", "zerogr_core", "bench"]


def _tail(o) -> list[str]:
    """What every command spells out last: a device other than CUDA, narrowed top-k paths."""
    from ..decode.options import PLANNED_TOPK

    parts = []
    if o.device.type != "cuda":
        parts += ["--device", str(o.device)]
    if tuple(o.topk_paths) != tuple(PLANNED_TOPK):
        parts += ["--topk-paths", ",".join(o.topk_paths)]
    return parts


def run_command(o) -> str:
    """A command line that reruns ``o`` exactly (every effective option spelled out)."""
    parts = BASE + ["--suite", ",".join(o.suites), "--seed", str(o.seed)]
    if o.catalog:
        parts += ["--catalog", o.catalog]
    if o.scale is not None:
        parts += ["--scale", str(o.scale)]
    for flag, values in (("--methods", o.methods), ("--batch", o.batches), ("--beam", o.beams),
                         ("--codebook", o.codebooks)):
        if values:
            parts += [flag, ",".join(map(str, values))]
    if o.configs:
        parts += ["--dtype", ",".join(d for d, _ in o.configs), "--hidden", ",".join(str(h) for _, h in o.configs)]
    if o.quick:
        parts.append("--quick")
    if o.repeats is not None:
        parts += ["--repeats", str(o.repeats)]
    if o.warmup is not None:
        parts += ["--warmup", str(o.warmup)]
    if o.check != "ends":
        parts += ["--check", o.check]
    return shlex.join(parts + _tail(o))


def record_command(o, suite: str, spec, **narrow) -> str:
    """The command that regenerates one record of ``suite`` on catalog ``spec``, narrowed to
    its shape and method (``narrow``: method or methods, batch, beam, dtype with hidden)."""
    parts = BASE + ["--suite", suite, "--catalog", spec.source]
    if spec.scale is not None:
        parts += ["--scale", str(spec.scale)]
    if spec.codebook is not None:
        parts += ["--codebook", str(spec.codebook)]
    parts += ["--seed", str(spec.seed)]
    if o.quick:
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
    return shlex.join(parts + ["--repeats", str(o.rep())] + _tail(o))
