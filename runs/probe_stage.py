"""What staging a request's context costs the Qwen3 recommender's call: an A/B in one process.

    python runs/probe_stage.py [SHAPES] [ROUNDS]      (on a GPU; SHAPES like 1000x1,1000x8, ROUNDS 3)

The LLM benchmark's workload (Qwen3-1.7B shape, random bf16 weights, the 10^7-item catalog, beam
256, filtering first, prefill inside the graph), timed end to end as the benchmark times it (CUDA
events, warm-up, rotated inputs of one length, median), in two arms taking turns on one serving:

* ``skip``: :meth:`Qwen3StepModel.stage` as shipped, which skips the padding's zeroing and the
  lengths' fill when the last call left them as this one needs;
* ``always``: the same calls with both launched every time (the stage before that change), by
  telling the model before each call that its padding and lengths are stale.

A line per round, arm and shape, then the medians of the rounds and the ratio.
"""
import statistics
import sys

from zerogr_core.bench.llm import LLM_PRESETS, Workload, _timed


def main() -> None:
    import torch

    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1] if len(sys.argv) > 1 else "1000x1,1000x8").split(",")]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    cfg = LLM_PRESETS["h200"]
    w = Workload(cfg, lambda m: print(m, flush=True))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    got = {}
    for context, batch in shapes:
        sets = [w.inputs(batch, context, 1000 * batch + context + i) for i in range(cfg.rotations)]
        run = w.serving("filter-first", "auto", cfg.beam)
        sm = run.step_model
        cur = {"i": 0}

        def before(i, stale):
            cur["i"] = i % len(sets)
            if stale and sm._static_key is not None:
                sm._ids_written, sm._uniform_length = sm.ids.shape[1], None

        for r in range(rounds):
            for arm in ("skip", "always"):
                ms = _timed(lambda: run.decode(sets[cur["i"]]).item_rows.cpu(), w.device, cfg,
                            lambda i, stale=arm == "always": before(i, stale))
                got.setdefault((context, batch, arm), []).append(ms)
                print(f"round {r} {arm:6s} {context}x{batch}: {ms:.3f} ms", flush=True)
        del run, sm
        torch.cuda.empty_cache()
    for context, batch in shapes:
        new = statistics.median(got[(context, batch, "skip")])
        old = statistics.median(got[(context, batch, "always")])
        print(f"{context}x{batch}: skip {new:.3f} ms, always {old:.3f} ms ({new / old:.4f}x)", flush=True)


if __name__ == "__main__":
    main()
