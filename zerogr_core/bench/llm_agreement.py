"""The LLM benchmark's agreement check: does the Qwen3 step model decode what Hugging Face's
own forward decodes, on the same weights, in the same dtype?

Scoring first, one request at a time, the same beam loop over two step models:
:class:`~zerogr_core.models.qwen3.Qwen3StepModel` (ours) and
:class:`~zerogr_core.hf.HFStepModel` (``transformers``' own cached forward). In bf16 the two
round differently (stacked projections, another attention kernel, a padded context; the fused
norm, rotary and gate kernels return Hugging Face's eager bits on a GPU), and with random weights the best items' scores are close, so some requests rank
their top item differently. How much of that is bf16 itself is measured beside it: the same
weights upcast to float32 through Hugging Face's forward (or, where its per-beam cache does not
fit in float32, through ours) are the exact computation, and each bf16 path is compared with
it. A top-1 gap that bf16 alone explains is a gap Hugging Face's own bf16 forward shows too.
And how far two correct implementations of the same dtype part: Hugging Face's forward with its
eager attention (matmul, softmax, matmul) instead of SDPA, against itself with SDPA, on the same
weights.
"""
from __future__ import annotations

import copy
import gc

import numpy as np
import torch


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    return len(set(a[a >= 0].tolist()) & set(b[b >= 0].tolist())) / max(1, int((b >= 0).sum()))


def interval95(agreed: int, n: int) -> tuple[float, float]:
    """Wilson's 95 % interval of a proportion, ``agreed`` of ``n``: how far a share of top items
    measured on ``n`` requests can be from the rate that many more requests would show."""
    if n < 1:
        return 0.0, 1.0
    z2, p = 1.96 ** 2, agreed / n
    mid, half = p + z2 / (2 * n), 1.96 * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # at 0 and n the bounds are exactly 0 and 1, which the float arithmetic misses by an ulp
    lo = 0.0 if agreed == 0 else max(0.0, (mid - half) / (1 + z2 / n))
    hi = 1.0 if agreed == n else min(1.0, (mid + half) / (1 + z2 / n))
    return float(lo), float(hi)


def _share(hits) -> dict:
    """The top-1 share of ``hits`` (one bool per request), its count and its 95 % interval."""
    k, n = int(np.sum(hits)), len(hits)
    return dict(top1=k / max(n, 1), agreed=k, interval95=interval95(k, n))


def _release(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def set_attention(model, name: str) -> None:
    """Switch a ``transformers`` model's attention implementation (``"sdpa"``, ``"eager"``)."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name


def agreement(w, context: int, beam: int) -> dict:
    """Top-1 item agreement and top-``beam`` overlap of ours against Hugging Face's forward.

    Parameters
    ----------
    w : zerogr_core.bench.llm.Workload
        The run's model (in its dtype), index and inputs.
    context, beam : int

    Returns
    -------
    dict
        ``top1_agreement``/``topk_overlap`` (ours vs Hugging Face, same dtype); ``hf_attentions``,
        the same two figures for Hugging Face's SDPA attention against its eager one (or
        ``error``); and when the dtype is not float32, ``float32`` with each path's agreement with
        the exact computation and ``requests_detail`` (per request: agreements and the float32
        top-1 margin over the second item, in log-probability).
    """
    from ..hf import HFGenerator

    ours = w.serving("score-first", "outside", beam)
    theirs = HFGenerator(w.model, w.index, beam_width=beam, token_offsets=w.offsets, order="score-first")
    inputs = [w.inputs(1, context, 50_000 + r) for r in range(w.cfg.agreement_requests)]
    got = {"ours": [], "hf": []}
    for ids in inputs:
        got["ours"].append(ours.decode(ids).item_rows[0].cpu().numpy())
        got["hf"].append(theirs.generate(ids).item_rows[0].cpu().numpy())
    del ours, theirs
    _release(w.device)
    pairs = list(zip(got["ours"], got["hf"]))
    top1 = _share([a[0] == b[0] for a, b in pairs])
    rec = dict(method="agreement", context=context, batch=1, beam=beam, requests=len(pairs),
               top1_agreement=top1["top1"], top1_agreed=top1["agreed"], top1_interval95=top1["interval95"],
               topk_overlap=float(np.mean([_overlap(a, b) for a, b in pairs])),
               reference="zerogr_core.hf.HFStepModel (transformers' own DynamicCache forward), scoring first",
               hf_attentions=_hf_attentions(w, inputs, got["hf"], beam))
    w.log(f"agreement over {len(pairs)} requests: top-1 {rec['top1_agreement']:.2f}, "
          f"top-{beam} overlap {rec['topk_overlap']:.3f}")
    if w.dtype != torch.float32 and w.cfg.agreement_float32:
        rec.update(_against_float32(w, inputs, got, beam))
    return rec


def _hf_attentions(w, inputs, sdpa: list, beam: int) -> dict:
    """Hugging Face's forward with its eager attention against its SDPA one (``sdpa``, the rows it
    returned): how far two correct forwards of the same weights and dtype part."""
    from ..hf import HFGenerator

    before = getattr(w.model.config, "_attn_implementation", None) or "sdpa"
    try:
        set_attention(w.model, "eager")
        eager = HFGenerator(w.model, w.index, beam_width=beam, token_offsets=w.offsets, order="score-first")
        rows = [eager.generate(ids).item_rows[0].cpu().numpy() for ids in inputs]
    except (ValueError, ImportError, torch.OutOfMemoryError) as exc:  # no eager attention here, or no memory for it
        return dict(error=f"{type(exc).__name__}: {exc}")
    finally:
        eager = None
        set_attention(w.model, before)
        _release(w.device)
    out = dict(_share([a[0] == b[0] for a, b in zip(sdpa, rows)]),
               topk_overlap=float(np.mean([_overlap(a, b) for a, b in zip(sdpa, rows)])),
               pair=f"Hugging Face's forward: {before} attention against eager attention")
    w.log(f"Hugging Face's own attentions (SDPA, eager): top-1 {out['top1']:.2f}, top-{beam} overlap "
          f"{out['topk_overlap']:.3f}")
    return out


def _float32_paths(w, exact_model, beam: int):
    """``(reference, decode)`` of the float32 computation, the most independent of ours first:
    Hugging Face's forward, then our step model, whose context is held once rather than once per
    beam (Hugging Face's float32 cache of 256 beams of 1,000 tokens outgrows an 80 GB card)."""
    from ..hf import HFGenerator

    def hf():
        return HFGenerator(exact_model, w.index, beam_width=beam, token_offsets=w.offsets,
                           order="score-first").generate

    def ours():
        return w.serving("score-first", "outside", beam, model=exact_model).decode

    yield "zerogr_core.hf.HFStepModel over the weights upcast to float32", hf
    yield ("zerogr_core.models.qwen3.Qwen3StepModel over the weights upcast to float32 (Hugging Face's "
           "forward ran out of memory)"), ours


def _against_float32(w, inputs, got: dict, beam: int) -> dict:
    """Each bf16 path against the float32 computation over the same weights: Hugging Face's forward,
    or ours where Hugging Face's does not fit."""
    rows, reference, exact_model = None, None, None
    try:
        exact_model = copy.deepcopy(w.model).float()
        for reference, make in _float32_paths(w, exact_model, beam):
            try:
                decode = make()
                rows, margins = [], []
                for ids in inputs:
                    r = decode(ids)
                    rows.append(r.item_rows[0].cpu().numpy())
                    s = r.scores[0].float().cpu().numpy()
                    margins.append(float(s[0] - s[1]) if s.size > 1 else float("inf"))
                break
            except torch.OutOfMemoryError:
                rows = decode = None
                _release(w.device)
    except torch.OutOfMemoryError:
        rows = None
    finally:
        exact_model = decode = None
        _release(w.device)
    if rows is None:
        return dict(float32={"error": "out of memory"})
    out = {name: dict(top1=float(np.mean([a[0] == c[0] for a, c in zip(got[name], rows)])),
                      topk_overlap=float(np.mean([_overlap(a, c) for a, c in zip(got[name], rows)])))
           for name in ("ours", "hf")}
    detail = [dict(margin=m, ours_vs_hf=bool(a[0] == b[0]), ours_vs_float32=bool(a[0] == c[0]),
                   hf_vs_float32=bool(b[0] == c[0]))
              for m, a, b, c in zip(margins, got["ours"], got["hf"], rows)]
    w.log(f"against float32 ({reference}): top-1 ours {out['ours']['top1']:.2f}, "
          f"Hugging Face bf16 {out['hf']['top1']:.2f}")
    return dict(float32=dict(out, reference=reference), requests_detail=detail)
