"""Which part of the Qwen3 step model parts its bf16 decode from Hugging Face's forward: the
LLM benchmark's agreement check (scoring first, one request at a time, context 1,000, beam 256)
with parts of the step model swapped for the computation Hugging Face's forward does there.

    python runs/probe_agreement_parts.py [REQUESTS] [VARIANT,...]   # default 60, every variant
    python runs/probe_agreement_parts.py quick                      # the tiny float32 model on the CPU

Variants (each a fresh step model over the same weights, against the same Hugging Face rows):
  shipped   the step model as it is (context padded to a multiple of 64)
  exact     the context not padded (bucket 1): the prefill's causal attention is then the same
            SDPA call as Hugging Face's
  lastfull  exact, and the prefill's last layer runs every row with the causal attention and keeps
            the last, as Hugging Face's does (the step model attends from the last row alone)
  sdpa      exact, and each beam's decode attention is one SDPA call over its context and lineage
            keys, as Hugging Face's per-beam cache makes it (the step model: its Triton kernel)
  apart     exact, and q/k/v and gate/up as separate GEMMs, as Hugging Face's modules run them
            (the step model stacks each set into one GEMM; cuBLAS may then pick another kernel)
  all       lastfull, sdpa and apart
  torch     exact, and the fused norm, q/k norm + rotary and SwiGLU kernels replaced by their PyTorch
            references (Hugging Face's eager ops, rounding for rounding)
  every     all, and torch: the step model computes what Hugging Face's forward does, op for op
  qkref     exact, and the q/k norm + rotary kernel replaced by its reference (the other kernels kept)

Hugging Face's eager attention against its SDPA one is printed beside them: how far two correct
forwards of the same weights part.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from zerogr_core.bench import llm as bench_llm
from zerogr_core.bench.llm_agreement import _overlap, set_attention
from zerogr_core.hf import HFGenerator
from zerogr_core.models import qwen3
from zerogr_core.models.protocol import StepDecoder
from zerogr_kernels.head_norm_rope import qk_norm_rope_reference
from zerogr_kernels.rms_norm import rms_layer_norm_reference
from zerogr_kernels.swiglu import silu_mul_reference

VARIANTS = ("shipped", "exact", "lastfull", "sdpa", "apart", "all", "torch", "every", "qkref")


def per_beam_sdpa(q, k, v, lengths, *, context_len, lineage_len, step, scale=None, lineage=None):
    """Each beam's attention as one SDPA call over its own key list (the context's first
    ``context_len`` slots, then its lineage), as Hugging Face's per-beam cache holds it. The
    context must fill its slots (no padding: bucket 1)."""
    b, m, h, d = q.shape
    kvh = k.shape[2]
    t = torch.arange(step, device=q.device)
    out = []
    for r in range(b):
        slots = context_len + lineage[r, :, :step].long() * lineage_len + t                  # (m, step)
        keys = torch.cat([k[r, :context_len][None].expand(m, context_len, kvh, d), k[r][slots]], dim=1)
        vals = torch.cat([v[r, :context_len][None].expand(m, context_len, kvh, d), v[r][slots]], dim=1)
        o = F.scaled_dot_product_attention(q[r][:, :, None], keys.transpose(1, 2), vals.transpose(1, 2),
                                           scale=scale, enable_gqa=True)
        out.append(o[:, :, 0])
    return torch.stack(out)


class ApartLinear:
    """``torch.nn.functional`` for the step model's module, except that a stacked weight's GEMM
    runs as its parts' GEMMs, concatenated (``parts``: data pointer -> row counts)."""

    def __init__(self, parts: dict):
        self.parts, self.split_calls = parts, 0

    def __getattr__(self, name):
        return getattr(F, name)

    def linear(self, x, weight, bias=None):
        sizes = self.parts.get(weight.data_ptr())
        if sizes is None:
            return F.linear(x, weight, bias)
        self.split_calls += 1
        ws = weight.split(sizes)
        bs = [None] * len(ws) if bias is None else bias.split(sizes)
        return torch.cat([F.linear(x, w_, b_) for w_, b_ in zip(ws, bs)], dim=-1)


def stacked_parts(sm) -> dict:
    """Each stacked weight of step model ``sm`` by data pointer, with its parts' row counts."""
    d = sm.head_dim
    qkv = (sm.heads * d, sm.kv_heads * d, sm.kv_heads * d)
    parts = {w.data_ptr(): qkv for w in sm.qkv_weight}
    parts.update({w.data_ptr(): (w.shape[0] // 2, w.shape[0] // 2) for w in sm.gate_up_weight})
    return parts


@contextmanager
def swapped(lastfull: bool, sdpa: bool, apart: dict | None = None, eager: bool = False, qk: bool = False):
    """The step model's module patched for the variant, restored afterwards."""
    layers, attention, functional = qwen3.Qwen3StepModel._layers, qwen3.beam_context_attention_triton, qwen3.F
    fused = qwen3.rms_layer_norm, qwen3.qk_norm_rope, qwen3.silu_mul

    def every_row(self, x, cos, sin, cache, attend, keep=None):
        out = layers(self, x, cos, sin, cache, attend)
        return out if keep is None else out[keep]

    try:
        if lastfull:
            qwen3.Qwen3StepModel._layers = every_row
        if sdpa:
            qwen3.beam_context_attention_triton = per_beam_sdpa
        if apart:
            qwen3.F = ApartLinear(apart)
        if eager:
            qwen3.rms_layer_norm, qwen3.qk_norm_rope, qwen3.silu_mul = (
                rms_layer_norm_reference, qk_norm_rope_reference, silu_mul_reference)
        if qk:
            qwen3.qk_norm_rope = qk_norm_rope_reference
        yield
    finally:
        qwen3.Qwen3StepModel._layers, qwen3.beam_context_attention_triton, qwen3.F = layers, attention, functional
        qwen3.rms_layer_norm, qwen3.qk_norm_rope, qwen3.silu_mul = fused


def main() -> None:
    args = sys.argv[1:]
    quick = bool(args) and args[0] == "quick"
    cfg = bench_llm.LLM_PRESETS["quick" if quick else "h200"]
    requests = cfg.agreement_requests if quick else int(args[0]) if args else 60
    variants = VARIANTS if len(args) < 2 else tuple(args[1].split(","))
    cfg = replace(cfg, agreement_requests=requests)
    w = bench_llm.Workload(cfg, print)
    context, beam = cfg.contexts[0], cfg.beam
    if not quick:
        print(torch.cuda.get_device_name(), torch.__version__, w.dtype, f"{requests} requests, context {context}, "
              f"beam {beam}", flush=True)
    inputs = [w.inputs(1, context, 50_000 + r) for r in range(requests)]
    theirs = HFGenerator(w.model, w.index, beam_width=beam, token_offsets=w.offsets, order="score-first")
    hf = [theirs.generate(ids).item_rows[0].cpu().numpy() for ids in inputs]
    set_attention(w.model, "eager")
    eager = HFGenerator(w.model, w.index, beam_width=beam, token_offsets=w.offsets, order="score-first")
    eager_rows = [eager.generate(ids).item_rows[0].cpu().numpy() for ids in inputs]
    set_attention(w.model, "sdpa")
    del theirs, eager
    # the prefill's last hidden state (final norm applied), Hugging Face's forward against each variant's
    probes = inputs[:10]
    with torch.no_grad():
        hf_last = [w.model.model(input_ids=ids).last_hidden_state[:, -1] for ids in probes]

    def prefill_bits(sm) -> str:
        same, worst = [], 0.0
        for ids, ref in zip(probes, hf_last):
            sm.prefill(ids, beam_width=beam)
            mine = sm.first.view_as(ref)
            same.append((mine == ref).float().mean().item())
            worst = max(worst, (mine.float() - ref.float()).abs().max().item())
        return f"; prefill hidden state: {np.mean(same):.1%} of elements bitwise Hugging Face's, max |diff| {worst:.3g}"

    def report(name, rows, note=""):
        top1 = [int(a[0] == b[0]) for a, b in zip(rows, hf)]
        print(f"{name:>9} vs hf-sdpa: top-1 {np.mean(top1):.1%} ({sum(top1)}/{len(top1)}), top-{beam} overlap "
              f"{np.mean([_overlap(a, b) for a, b in zip(rows, hf)]):.1%}; flips at {[i for i, t in enumerate(top1) if not t]}{note}",
              flush=True)

    report("hf-eager", eager_rows)
    for name in variants:
        bucket = cfg.context_bucket if name == "shipped" else 1
        sm = qwen3.Qwen3StepModel(w.model, w.offsets, context_bucket=bucket)
        every = name in ("all", "every")
        with swapped(every or name == "lastfull", every or name == "sdpa",
                     stacked_parts(sm) if every or name == "apart" else None, name in ("torch", "every"),
                     name == "qkref"):
            ours = StepDecoder(sm, w.index, sm.head, beam_width=beam, order="score-first", band_offsets=w.offsets,
                               prefill="outside")
            rows = [ours.decode(ids).item_rows[0].cpu().numpy() for ids in inputs]
            split = getattr(qwen3.F, "split_calls", None)
            bits = prefill_bits(sm)
        report(name, rows, ("" if split is None else f"; {split} GEMMs split") + bits)
        del ours, sm
        if w.device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
