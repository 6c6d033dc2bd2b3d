"""Whether this torch can put a data-dependent branch inside one CUDA graph (IF nodes).

    python runs/probe_graph_conditionals.py     (on a GPU)

A partial last step (``zerogr_core.decode.loop``) runs the last step's layers on a number of rows that
is known only on the device. With CUDA graph conditional nodes (torch's ``CUDAGraph.begin_capture_to_if_node``,
used by ``torch.cond`` under capture in later releases) one graph could hold a branch per row count;
without them the engine reads the count on the host between two graphs (``zerogr_core.decode.last_step``).
Prints the torch version and the CUDAGraph methods, then, if the API is there, replays a graph of three
IF bodies (a cuBLAS GEMM and a Triton kernel each) for several counts and checks their outputs.
"""
import torch, time, sys
print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
G = torch.cuda.CUDAGraph
print("has get_currently_capturing_graph", hasattr(G, "get_currently_capturing_graph"))
print("has begin_capture_to_if_node", hasattr(G, "begin_capture_to_if_node"))
print([m for m in dir(G) if not m.startswith("_")])
try:
    import triton, triton.language as tl
    @triton.jit
    def _add1(x_ptr, n, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + o, mask=o < n)
        tl.store(x_ptr + o, x + 1, mask=o < n)
    a = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    out = torch.zeros(256, 2048, device="cuda", dtype=torch.bfloat16)
    kmax = torch.zeros((), dtype=torch.int64, device="cuda")
    buckets = [64, 128, 256]
    def body(k):
        y = a[:k] @ w.T
        out[:k].copy_(y)
        _add1[(triton.cdiv(k * 2048, 1024),)](out, k * 2048, BLOCK=1024)
    for k in buckets:   # warm
        body(k)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            out.zero_()
            cur = torch.cuda.CUDAGraph.get_currently_capturing_graph()
            lo = 0
            for k in buckets:
                pred = (kmax > lo) & (kmax <= k)
                cur.begin_capture_to_if_node(pred)
                try:
                    body(k)
                finally:
                    cur.end_capture_to_conditional_node()
                lo = k
    for kv in [10, 100, 200, 0]:
        kmax.fill_(kv); g.replay(); torch.cuda.synchronize()
        nz = int((out.float().abs().sum(1) > 0).sum())
        ref = torch.zeros_like(out)
        kb = next((k for k in buckets if kv <= k and kv > 0), 0)
        if kb: ref[:kb] = (a[:kb] @ w.T) + 1
        print("kmax", kv, "rows written", nz, "max diff", float((out.float() - ref.float()).abs().max()))
    # timing: graph with if nodes vs direct
    for kv in [10, 100, 200]:
        kmax.fill_(kv)
        for _ in range(5): g.replay()
        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
        e0.record(); [g.replay() for _ in range(100)]; e1.record(); torch.cuda.synchronize()
        print("kmax", kv, "replay us", e0.elapsed_time(e1) * 10)
except Exception as e:
    import traceback; traceback.print_exc()
