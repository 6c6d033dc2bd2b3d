"""How fast per-call numpy ids can reach the GPU: the gather into a pinned block and its copy, each way
the allow-ids path could do it (issue 34: allow 1 % of a 2·10^7 catalog is 200,000 ids, 1.6 MB, per
request).

    python runs/probe_id_gather.py [--batches 1,8,32] [--reps 30]      (on a GPU machine)

Per batch, the median over ``--reps`` of the wall time from the first byte gathered to the device copy
done (a stream synchronisation), for:

- ``serial``: what ``place_ids`` does (torch's copy per part into the pinned block, each part's copy
  parallel over torch's intra-op threads), then one copy of the whole block;
- ``threads-T``: the parts split into 4 MiB pieces, copied by T Python threads with numpy (which
  releases the GIL for such copies), then one copy of the block;
- ``pipelined-T``: the same T threads, each 4 MiB piece copied to the device as soon as it is gathered.

The ids are fresh arrays each repetition (as a caller's would be), the pinned block is reused.
"""
from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

PIECE = 1 << 19  # int64 ids per piece: 4 MiB


def pieces(parts):
    """``(part, src_start, dst_start, n)`` pieces of at most PIECE ids, in destination order."""
    out, at = [], 0
    for p in parts:
        for s in range(0, p.size, PIECE):
            n = min(PIECE, p.size - s)
            out.append((p, s, at + s, n))
        at += p.size
    return out


def serial(parts, host, block):
    at = 0
    for p in parts:
        host[at:at + p.size].copy_(torch.from_numpy(p))
        at += p.size
    block[:at].copy_(host[:at], non_blocking=True)


def threaded(pool, pipelined):
    def run(parts, host, block):
        host_np = host.numpy()

        def copy(piece):
            p, s, d, n = piece
            np.copyto(host_np[d:d + n], p[s:s + n])

        work = pieces(parts)
        futures = [pool.submit(copy, w) for w in work]
        if pipelined:
            for w, f in zip(work, futures):
                f.result()
                d, n = w[2], w[3]
                block[d:d + n].copy_(host[d:d + n], non_blocking=True)
        else:
            for f in futures:
                f.result()
            total = sum(p.size for p in parts)
            block[:total].copy_(host[:total], non_blocking=True)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--per-request", type=int, default=200_000)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(dev)} | torch {torch.__version__} | torch threads "
          f"{torch.get_num_threads()}", flush=True)
    most = max(batches) * args.per_request
    host = torch.zeros(most, dtype=torch.int64, pin_memory=True)
    block = torch.zeros(most, dtype=torch.int64, device=dev)
    pools = {t: ThreadPoolExecutor(t) for t in (4, 8, 16)}
    ways = {"serial": serial}
    for t, pool in pools.items():
        ways[f"threads-{t}"] = threaded(pool, False)
        ways[f"pipelined-{t}"] = threaded(pool, True)
    rng = np.random.default_rng(0)
    for batch in batches:
        times = {name: [] for name in ways}
        for rep in range(args.reps + 3):
            for name, fn in ways.items():  # rotated: each way sees each repetition's memory state
                parts = [rng.integers(0, 2**40, args.per_request) for _ in range(batch)]
                torch.cuda.synchronize()
                t = time.perf_counter()
                fn(parts, host, block)
                torch.cuda.synchronize()
                if rep >= 3:
                    times[name].append((time.perf_counter() - t) * 1e6)
                want = np.concatenate(parts)
                assert np.array_equal(block[:want.size].cpu().numpy(), want), name
        mb = batch * args.per_request * 8 / 1e6
        print(f"--- batch {batch}: {mb:.1f} MB of ids", flush=True)
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"   {name:14s} {med:9.1f} us  {mb * 1e3 / med:6.1f} GB/s", flush=True)


if __name__ == "__main__":
    main()
