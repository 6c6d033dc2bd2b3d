"""How often do two correct bf16 forwards of the same random-weight Qwen3 agree on the top item?

    python runs/probe_bf16_agreement.py [REQUESTS] [CONTEXT]      (on a GPU; defaults 20, 1000)
    QUICK=1 python runs/probe_bf16_agreement.py 3 16                (the tiny float32 shape on a CPU)

Issue 30 asks ZeroGR's bf16 decode to name the same top-1 item as Hugging Face's own cached
decode for at least 90 % of requests. This probe measures what bf16 itself allows on the
benchmark's model (Qwen3-1.7B shape, random weights, the 10^7-item catalog, beam 256, scoring
first, one request at a time): the same beam loop over three step models that differ only in
rounding, all over the same bf16 weights:

* ``ours``: :class:`~zerogr_core.models.qwen3.Qwen3StepModel` (the engine's path);
* ``hf-sdpa``: Hugging Face's cached forward, attention through torch SDPA (its default);
* ``hf-eager``: the same forward with Hugging Face's eager attention (matmul, softmax, matmul).

It prints the top-1 agreement of each pair and the top-256 overlap. If Hugging Face's two
attention implementations agree on fewer than 90 % of requests, the target is below what bf16
reproduces of this model, whatever the implementation.
"""
import itertools
import os
import sys

import numpy as np
import torch

from zerogr_core.bench.llm import LLM_PRESETS, Workload
from zerogr_core.bench.llm_agreement import _overlap


def _attention(model, name: str) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name


def main() -> None:
    from zerogr_core.hf import HFGenerator

    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    context = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    cfg = LLM_PRESETS["quick" if os.environ.get("QUICK") == "1" else "h200"]
    w = Workload(cfg, lambda m: print(m, flush=True))
    gpu = torch.cuda.get_device_name() if w.device.type == "cuda" else "CPU"
    print(f"{gpu}, torch {torch.__version__}, {cfg.dtype}, {requests} requests, context {context}", flush=True)
    inputs = [w.inputs(1, context, 50_000 + r) for r in range(requests)]
    got, scores = {}, {}
    ours = w.serving("score-first", "outside", cfg.beam)
    got["ours"] = [ours.decode(ids).item_rows[0].cpu().numpy() for ids in inputs]
    del ours
    if w.device.type == "cuda":
        torch.cuda.empty_cache()
    for impl in ("sdpa", "eager"):
        _attention(w.model, impl)
        hf = HFGenerator(w.model, w.index, beam_width=cfg.beam, token_offsets=w.offsets, order="score-first")
        results = [hf.generate(ids) for ids in inputs]
        got[f"hf-{impl}"] = [r.item_rows[0].cpu().numpy() for r in results]
        scores[impl] = torch.stack([r.scores[0].float().cpu() for r in results])
        print(f"attention {w.model.config._attn_implementation!r}", flush=True)
        del hf, results
        if w.device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"{impl} done", flush=True)
    _attention(w.model, "sdpa")
    diff = (scores["sdpa"] - scores["eager"]).abs()
    print(f"hf-sdpa vs hf-eager beam scores: largest difference {float(diff.max()):.4g}, "
          f"median {float(diff.median()):.4g} (0 would mean one computation)", flush=True)
    for a, b in itertools.combinations(got, 2):
        top1 = np.mean([x[0] == y[0] for x, y in zip(got[a], got[b])])
        overlap = np.mean([_overlap(x, y) for x, y in zip(got[a], got[b])])
        print(f"{a} vs {b}: top-1 {top1:.0%} ({int(round(top1 * requests))}/{requests}), "
              f"top-{cfg.beam} overlap {overlap:.1%}", flush=True)


if __name__ == "__main__":
    main()
