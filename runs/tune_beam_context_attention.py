"""Tuning sweep of the Qwen3 decode attention kernel against SDPA with a bias (H200 shapes).

Run on a GPU from the repository root: python runs/tune_beam_context_attention.py [TILES [SPLITS [STEPS]]]
TILES: comma list of BLOCK_MxBLOCK_NxWARPSxSTAGES (default 128x64x8x2,64x64x4x2; STAGES 0 is the
launcher's choice); SPLITS: comma list
of split counts or "auto" (default auto,1,4,16); STEPS: comma list of decode steps, the lineage
positions each row sees (default 2). The kernels are those of the tree the script sits in, so a copy
of the script in another checkout times that checkout's kernel.
Prints microseconds per call (10 calls per CUDA graph replay) and the largest difference to SDPA.
Environment: TUNE_SHAPES, a comma list of BATCHxKEYS (default 1x1024,1x5056,8x1024,8x5056);
TUNE_MERGES, a comma list of ROWSxWARPS for the merge kernel (default: the launcher's).
"""
import sys, os
import zlib
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# one link per checkout, so that two checkouts timed on one machine each import their own kernels
LINKS = f"/tmp/zl-{zlib.crc32(ROOT.encode()):08x}"
os.makedirs(LINKS, exist_ok=True)
if not os.path.exists(f"{LINKS}/zerogr_kernels"):
    os.symlink(os.path.join(ROOT, "kernels"), f"{LINKS}/zerogr_kernels")
sys.path.insert(0, LINKS)
import torch
import torch.nn.functional as F
import zerogr_kernels.context_attention as bca

def timeit(fn, reps=50):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10): fn()
    g.replay(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps): g.replay()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps / 10 * 1000  # us per call

TILES = [tuple(int(x) for x in t.split("x")) for t in (sys.argv[1] if len(sys.argv) > 1 else "128x64x8x2,64x64x4x2").split(",")]
SPLITS = [None if x == "auto" else int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "auto,1,4,16").split(",")]
STEPS = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "2").split(",")]
dev = "cuda"
M, H, KVH, D, P = 256, 16, 8, 128, 2
SHAPES = [tuple(int(x) for x in t.split("x")) for t in os.environ.get("TUNE_SHAPES", "1x1024,1x5056,8x1024,8x5056").split(",")]
MERGES = [tuple(int(x) for x in t.split("x")) for t in os.environ["TUNE_MERGES"].split(",")] \
    if os.environ.get("TUNE_MERGES") else [None]
for B, ctx in SHAPES:
    L = {1024: 1000, 5056: 5000}.get(ctx, ctx)   # the model's buckets hold 1,000 and 5,000 tokens
    S = ctx + M * P
    kv = torch.randn(2, 1, B, S, KVH, D, device=dev, dtype=torch.bfloat16)
    q = torch.randn(B, M, H, D, device=dev, dtype=torch.bfloat16)
    lens = torch.full((B,), L, device=dev, dtype=torch.int64)
    k, v = kv[0, 0], kv[1, 0]
    # an ancestor table as the model's decode passes it: each beam's lineage in random beams' slots
    anc = torch.randint(0, M, (B, M, P), device=dev, dtype=torch.int32)
    for step in STEPS:
        kw = dict(context_len=ctx, lineage_len=P, step=step, lineage=anc)
        bias = bca.beam_context_bias(lens, beams=M, group=2, slots=S, context_len=ctx, lineage_len=P, step=step,
                                     dtype=torch.bfloat16, lineage=anc)
        def sdpa():
            qg = q.view(B, M, KVH, 2, D).permute(0, 2, 1, 3, 4).reshape(B, KVH, M * 2, D)
            o = F.scaled_dot_product_attention(qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias)
            return o.view(B, KVH, M, 2, D).permute(0, 2, 1, 3, 4).reshape(B, M, H, D)
        want = sdpa()
        ref = bca.beam_context_attention_reference(q, k, v, lens, **kw)
        print(f"B={B} ctx={ctx} step={step}: sdpa {timeit(sdpa):.1f} us; ref-vs-sdpa maxerr "
              f"{(ref.float()-want.float()).abs().max().item():.3g}", flush=True)
        for bm, bn, nw, ns in TILES:
            bca.NUM_WARPS, bca.NUM_STAGES = nw, ns or None   # stages 0: the launcher's choice
            for splits, merge in ((sp, mg) for sp in SPLITS for mg in MERGES):
                if merge is not None:
                    bca.MERGE_BLOCK_M, bca.MERGE_NUM_WARPS = merge
                try:
                    f = lambda: bca.beam_context_attention_triton(q, k, v, lens, splits=splits, block_m=bm, block_n=bn,
                                                                  **kw)
                    got = f()
                    err = (got.float() - want.float()).abs().max().item()
                    auto = bca.split_count(ctx, (512 // bm) * B * KVH, 132) if splits is None else splits
                    tag = "" if merge is None else f" merge={merge[0]}x{merge[1]}"
                    print(f"  bm={bm} bn={bn} warps={nw} stages={ns} splits={splits}({auto}){tag}: {timeit(f):.1f} us "
                          f"maxerr {err:.3g}", flush=True)
                except Exception as e:
                    print(f"  bm={bm} bn={bn} warps={nw} stages={ns} splits={splits}: FAILED {type(e).__name__}: "
                          f"{str(e)[:200]}", flush=True)

# registers and spills of every compiled specialisation, as the driver loaded them
for name in ("_split_kernel", "_merge_kernel"):
    fn = getattr(bca, name, None)
    for caches in getattr(fn, "device_caches", {}).values():
        for kernel in caches[0].values():
            try:
                print(f"{name}: {kernel.n_regs} registers, {kernel.n_spills} spilled, {kernel.metadata.num_warps} warps")
            except Exception as e:  # a loader without these attributes: say so, the timings above stand
                print(f"{name}: registers not known ({type(e).__name__})")
