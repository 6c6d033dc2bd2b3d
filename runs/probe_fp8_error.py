"""How far the FP8 projections move the Qwen3 recommender's last hidden state from the model's own.

    python runs/probe_fp8_error.py            # on a GPU: the Qwen3-1.7B shape, 4 requests of 1,000 tokens
    python runs/probe_fp8_error.py deep       # anywhere: a 28-layer, 256-wide shape, 2 requests of 200 tokens

Both shapes have random weights. Each request's context runs through the prefill of a step model with
``projections="model"`` and one with ``projections="fp8"`` (same weights); the line per request gives the
relative error and cosine of the final normed hidden state (what predicts SID level 1). The ``deep`` shape
also runs in float32, so that the FP8 error stands beside bfloat16's own rounding error. On the 1.7B shape
it also prints the level-1 SID logits' spread and whether their top token is the same.
"""
import sys

import torch


def _first(model, offsets, ids, projections, bucket):
    from zerogr_core.models.qwen3 import Qwen3StepModel

    sm = Qwen3StepModel(model, offsets, context_bucket=bucket, projections=projections)
    sm.prefill(ids, beam_width=4)
    return sm.first.float()


def _compare(name, a, b) -> None:
    rel = ((a - b).norm(dim=1) / a.norm(dim=1)).tolist()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=1).tolist()
    print(f"{name}: relative error {[round(r, 4) for r in rel]}, cosine {[round(c, 5) for c in cos]}", flush=True)


def deep() -> None:
    from zerogr_core.models.qwen3 import Qwen3Preset, build_random

    shape = Qwen3Preset("deep", layers=28, hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=768, base_vocab=512,
                        codebook_sizes=(64, 64, 64), rope_theta=1e6, max_positions=4096)
    m32 = build_random(shape, seed=1)[0]
    m16 = build_random(shape, seed=1, dtype=torch.bfloat16)[0]
    m16.load_state_dict({k: v.to(torch.bfloat16) for k, v in m32.state_dict().items()})
    ids = torch.randint(1, shape.base_vocab, (2, 200), generator=torch.Generator().manual_seed(0))
    off = shape.token_offsets
    a32, a16, a8 = (_first(m32, off, ids, "model", 8), _first(m16, off, ids, "model", 8),
                    _first(m16, off, ids, "fp8", 8))
    _compare("deep, bfloat16 against float32", a32, a16)
    _compare("deep, fp8 against float32", a32, a8)
    _compare("deep, fp8 against bfloat16", a16, a8)


def llm() -> None:
    from zerogr_core.bench.llm import LLM_PRESETS, Workload

    w = Workload(LLM_PRESETS["h200"], lambda m: print(m, flush=True))
    ids = w.inputs(4, 1000, 11)
    a, b = (_first(w.model, w.offsets, ids, p, w.cfg.context_bucket) for p in ("model", "fp8"))
    _compare("qwen3-1.7b, 4 requests of 1,000 tokens, fp8 against bfloat16", a, b)
    lo = w.offsets[0]
    band = w.model.get_output_embeddings().weight[lo:lo + 8192].float()
    la, lb = a @ band.t(), b @ band.t()
    top = la.topk(2).values
    print(f"level-1 SID logits: spread (std) {[round(v, 3) for v in la.std(dim=1).tolist()]}, largest change "
          f"{[round(v, 3) for v in (la - lb).abs().max(dim=1).values.tolist()]}, top-1 gap "
          f"{[round(v, 3) for v in (top[:, 0] - top[:, 1]).tolist()]}, same top token "
          f"{(la.argmax(1) == lb.argmax(1)).tolist()}", flush=True)


if __name__ == "__main__":
    with torch.no_grad():
        deep() if sys.argv[1:] == ["deep"] else llm()
