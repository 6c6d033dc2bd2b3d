"""Library attention kernels for the decode's context part, timed against the project's kernel.

The Qwen3 decode attends each request's M beams (16 query heads, 8 KV heads) to the request's
context keys, then to each beam's own lineage keys. The project's kernel
(``zerogr_kernels.beam_context_attention``) does both; this probe times what torch's libraries
would take for the context part alone, returning the log-sum-exp a merge with the lineage keys
needs: FlashAttention-2's variable-length forward (queries in the projection's own layout,
``seqused_k`` for each request's context length) and cuDNN's attention (the two query heads of a
KV head folded into the rows, a bias masking the padding). Times are per call: a CUDA graph of 10
calls, the median of 150 replays.

Run on a GPU from the repository root: python runs/probe_context_attention_libs.py [SHAPES]
SHAPES: comma list of BATCHxKEYS (default 1x1024,8x1024,1x5056,8x5056).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import torch

import zerogr_kernels.context_attention as bca

from zerogr_core.timing import median_us

M, H, KVH, D, P = 256, 16, 8, 128, 2
G = H // KVH
SCALE = D ** -0.5


def timeit(fn):
    """µs per call: a CUDA graph of 10 calls, the median of 150 replays (zerogr_core.timing)."""
    return median_us(lambda: [fn() for _ in range(10)], "cuda", repeats=150) / 10


def main():
    shapes = [tuple(int(x) for x in s.split("x")) for s in
              (sys.argv[1] if len(sys.argv) > 1 else "1x1024,8x1024,1x5056,8x5056").split(",")]
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | cudnn {torch.backends.cudnn.version()}")
    print("schema:", torch.ops.aten._flash_attention_forward.default._schema)
    dev = "cuda"
    for B, ctx in shapes:
        L = {1024: 1000, 5056: 5000}.get(ctx, ctx)
        S = ctx + M * P
        torch.manual_seed(0)
        kv = torch.randn(2, B, S, KVH, D, device=dev, dtype=torch.bfloat16)
        k, v = kv[0], kv[1]
        q = torch.randn(B, M, H, D, device=dev, dtype=torch.bfloat16)
        lens = torch.full((B,), L, device=dev, dtype=torch.int64)
        anc = torch.randint(0, M, (B, M, P), device=dev, dtype=torch.int32)
        flops = 4 * B * M * H * L * D
        # the context part's reference: math SDPA over the first L keys, float32
        qf = q.float().permute(0, 2, 1, 3)                              # (B, H, M, D)
        kf = k[:, :L].float().permute(0, 2, 1, 3).repeat_interleave(G, 1)
        vf = v[:, :L].float().permute(0, 2, 1, 3).repeat_interleave(G, 1)
        s = (qf @ kf.transpose(-1, -2)) * SCALE
        ref_lse = torch.logsumexp(s, -1)                                 # (B, H, M)
        ref = (torch.softmax(s, -1) @ vf).permute(0, 2, 1, 3)            # (B, M, H, D)
        del s
        res = {}

        def ours():
            return bca.beam_context_attention_triton(q, k, v, lens, context_len=ctx, lineage_len=P, step=2,
                                                     lineage=anc)
        res["ours (context + lineage, split + merge)"] = (ours, None)

        cu_q = torch.arange(0, (B + 1) * M, M, device=dev, dtype=torch.int32)
        cu_k = torch.arange(0, (B + 1) * S, S, device=dev, dtype=torch.int32)
        used = lens.to(torch.int32)
        qv, kvv, vvv = q.view(B * M, H, D), k.reshape(B * S, KVH, D), v.reshape(B * S, KVH, D)

        def fa2(splits=None):
            def f():
                kw = dict(scale=SCALE, seqused_k=used)
                if splits is not None:
                    kw["num_splits"] = splits
                out, lse = torch.ops.aten._flash_attention_forward(qv, kvv, vvv, cu_q, cu_k, M, S, 0.0, False,
                                                                   False, **kw)[:2]
                return out.view(B, M, H, D), lse
            return f
        res["flash-2 varlen, seqused_k"] = (fa2(), "fa2")
        for sp in (4, 8):
            res[f"flash-2 varlen, seqused_k, num_splits={sp}"] = (fa2(sp), "fa2")

        bias = torch.zeros(B, 1, 1, ctx, device=dev, dtype=torch.bfloat16)
        bias[:, :, :, L:] = float("-inf")
        kc, vc = k[:, :ctx].permute(0, 2, 1, 3), v[:, :ctx].permute(0, 2, 1, 3)   # (B, KVH, ctx, D) views

        def cudnn(with_bias, folded_copy=True):
            def f():
                qg = q.view(B, M, KVH, G, D).permute(0, 2, 1, 3, 4).reshape(B, KVH, M * G, D)
                out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
                    qg, kc, vc, bias.expand(B, KVH, M * G, ctx) if with_bias else None, True, 0.0, False, False,
                    scale=SCALE)[:2]
                return out.view(B, KVH, M, G, D).permute(0, 2, 1, 3, 4).reshape(B, M, H, D), lse
            return f
        res["cudnn, padding bias"] = (cudnn(True), "cudnn")
        res["cudnn, no mask (padding scored: timing only)"] = (cudnn(False), None)

        print(f"B={B} ctx={ctx} (len {L}): context part {flops / 1e9:.2f} GFLOP")
        for name, (fn, kind) in res.items():
            try:
                got = fn()
                err = ""
                if kind is not None:
                    out, lse = got
                    e = (out.float() - ref).abs().max().item()
                    if kind == "fa2":
                        lse = lse.view(H, B, M).permute(1, 0, 2) if lse.dim() == 2 else lse
                    else:
                        lse = lse.reshape(B, KVH, M, G).permute(0, 1, 3, 2).reshape(B, H, M)
                    el = (lse.float() - ref_lse).abs().max().item()
                    err = f" maxerr out {e:.3g} lse {el:.3g}"
                us = timeit(fn)
                print(f"  {name}: {us:.1f} us ({flops / us / 1e6:.0f} TFLOP/s){err}", flush=True)
            except Exception as exc:  # noqa: BLE001 - a backend that refuses the shape is a result too
                print(f"  {name}: FAILED {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", flush=True)


if __name__ == "__main__":
    main()
