"""A/B of two settings of the Qwen3 recommender's call, taking turns in one process.

    python runs/probe_llm_ab.py blas [SHAPES] [ROUNDS]     (on a GPU; SHAPES like 1000x1,1000x8, ROUNDS 2)
    python runs/probe_llm_ab.py stage [SHAPES] [ROUNDS]
    python runs/probe_llm_ab.py sums [SHAPES] [ROUNDS]
    python runs/probe_llm_ab.py halves [SHAPES] [ROUNDS]
    python runs/probe_llm_ab.py fp8 [SHAPES] [ROUNDS]
    python runs/probe_llm_ab.py partial [SHAPES] [ROUNDS]

The LLM benchmark's workload (Qwen3-1.7B shape, random bf16 weights, the 10^7-item catalog, beam
256, filtering first, prefill inside the graph) is built once; each arm is timed end to end as the
benchmark times it (CUDA events, warm-up, rotated inputs of one length, median), round after round.

* ``blas``: ``torch.backends.cuda.preferred_blas_library`` set to cuBLAS, then cuBLASLt; each arm's
  serving is captured afresh under its setting.
* ``sums``: the norms' variance sums as shipped (``eager``: torch's order, :mod:`zerogr_kernels.row_sums`)
  against Triton's tree (``tree``, ``row_sums.IMPL = 0``: other bits, the price of the agreement); each
  arm's serving is captured afresh, since the order is chosen at each kernel's launch.
* ``halves``: the shipped eager order (``halves``: the q/k heads of 128 summed from the halves the
  kernel holds, :data:`~zerogr_kernels.row_sums.HALVES`) against the lanes layout it replaced (``lanes``,
  ``row_sums.IMPL = 1``; the same bits), each arm captured afresh.
* ``fp8``: the layers' weight GEMMs in the model's bf16 (``model``, as shipped) against float8 e4m3
  weights and activations with row scales (``fp8``: ``Qwen3StepModel(projections="fp8")``), each arm
  captured afresh.
* ``partial``: the last step's layers over every beam (``full``, ``partial_last_step=False``) against the beams whose
  prefix holds more than one item only (``partial``, as shipped: a beam in any other
  prefix gets log-probability 0 for its only item whatever its logits), each arm captured afresh; the
  partial arm also prints the row counts its last step ran at (a graph each).
* ``stage``: ``always`` (the padding's zeroing and the lengths' fill launched every call, by telling the
  model before each call that both are stale) against :meth:`Qwen3StepModel.stage` as shipped (``skip``:
  neither launch when the last call left them as this one needs), on one serving.

A line per round, arm and shape, then the medians of the rounds and each later arm's ratio to the first,
and how often each later arm's items agree with the first arm's on the same requests (at least 24, other inputs
than the timed ones, decoded once per arm after its first round): the top-1 item, and the overlap of the M
returned items.
"""
import statistics
import sys

import torch

from zerogr_core.bench.llm import LLM_PRESETS, Workload, _timed


def _blas(lib: str):
    def enter(sm):
        torch.backends.cuda.preferred_blas_library(lib)
    return enter


def _sums(impl):
    def enter(sm):
        import zerogr_kernels.row_sums as row_sums
        row_sums.IMPL = impl
    return enter


def _projections(kind: str):
    def enter(w):
        w.projections = kind
    return enter


def _partial(on: bool):
    def enter(w):
        w.partial_last_step = on
    return enter


def _stage(stale: bool):
    def before(sm):
        if stale and sm._static_key is not None:
            sm._ids_written, sm._uniform_length = sm.ids.shape[1], None
    return before


# per experiment: whether each arm captures a fresh serving, and its arms (name, what runs before its calls)
EXPERIMENTS = {
    "blas": (True, {"cublas": _blas("cublas"), "cublaslt": _blas("cublaslt")}),
    "sums": (True, {"eager": _sums(None), "tree": _sums(0)}),
    "halves": (True, {"halves": _sums(None), "lanes": _sums(1)}),
    "fp8": (True, {"model": _projections("model"), "fp8": _projections("fp8")}),
    "partial": (True, {"full": _partial(False), "partial": _partial(True)}),
    "stage": (False, {"always": _stage(True), "skip": _stage(False)}),
}


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name not in EXPERIMENTS:
        sys.exit(f"usage: python runs/probe_llm_ab.py {{{','.join(EXPERIMENTS)}}} [SHAPES] [ROUNDS]")
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[2] if len(sys.argv) > 2 else "1000x1,1000x8").split(",")]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    fresh, arms = EXPERIMENTS[name]
    cfg = LLM_PRESETS["h200"]
    w = Workload(cfg, lambda m: print(m, flush=True))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    got, items = {}, {}
    for context, batch in shapes:
        sets = [w.inputs(batch, context, 1000 * batch + context + i) for i in range(cfg.rotations)]
        # at least 24 requests for the agreement, in calls of the timed shape
        agree = [w.inputs(batch, context, 7000 + i) for i in range(-(-24 // batch))]
        run = None
        for r in range(rounds):
            for arm, setting in arms.items():
                if fresh:  # the setting applies at capture (or at the wrap): this arm's own serving
                    setting(w)
                    run = None
                    torch.cuda.empty_cache()
                run = run or w.serving("filter-first", "auto", cfg.beam)
                cur = {"i": 0}

                def before(i, sm=run.step_model, hook=None if fresh else setting):
                    cur["i"] = i % len(sets)
                    if hook is not None:
                        hook(sm)

                ms = _timed(lambda: run.decode(sets[cur["i"]]).item_rows.cpu(), w.device, cfg, before)
                got.setdefault((context, batch, arm), []).append(ms)
                print(f"round {r} {arm:9s} {context}x{batch}: {ms:.3f} ms", flush=True)
                partial = [s.partial for s in run.decoder.gpu_engine._shapes.values() if s.partial is not None]
                if partial:
                    print(f"  last-step rows per request: {sorted(partial[0].graphs)} of {cfg.beam}", flush=True)
                if r == 0:
                    items[(context, batch, arm)] = torch.cat([run.decode(x).item_rows.cpu() for x in agree])
        del run
        torch.cuda.empty_cache()
    first = next(iter(arms))
    if fresh:
        arms[first](w)
    for context, batch in shapes:
        a = statistics.median(got[(context, batch, first)])
        line = ", ".join(f"{arm} {statistics.median(got[(context, batch, arm)]):.3f} ms "
                         f"({statistics.median(got[(context, batch, arm)]) / a:.4f}x)" for arm in list(arms)[1:])
        print(f"{context}x{batch}: {first} {a:.3f} ms, {line}", flush=True)
        base = items[(context, batch, first)]
        for arm in list(arms)[1:]:
            rows = items[(context, batch, arm)]
            top1 = (rows[:, 0] == base[:, 0]).float().mean().item()
            overlap = sum(len(set(x.tolist()) & set(y.tolist())) for x, y in zip(rows, base)) / base.numel()
            print(f"{context}x{batch}: {arm} against {first} over {base.shape[0]} requests: top-1 item {top1:.1%}, "
                  f"top-{base.shape[1]} overlap {overlap:.1%}", flush=True)


if __name__ == "__main__":
    main()
