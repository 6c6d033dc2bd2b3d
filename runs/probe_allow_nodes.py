"""Where ``allow_nodes``' device time goes on the constraints suite's catalog (search-like, 2·10^7
SIDs, 5 steps), for 1 % of the catalog allowed per request at batch 1, 8 and 32: the launcher as
the engine calls it (the first steps derived from the next, ``derived``), every step set bit by bit,
the bitmaps' memset, the kernel without its first steps (what their atomics cost), and with
``--sweep`` the ids per program and warps. Every variant's bitmaps are checked against the first.

    python runs/probe_allow_nodes.py [--sweep]      (on a GPU, from the repository root)
"""
import sys

import numpy as np
import torch

from zerogr_core.bench.workload import CatalogSpec, Workload
from zerogr_core.decode.device_lists import lookup_table
from zerogr_core.decode.id_lists import node_tables
from zerogr_core.timing import median_us
from zerogr_kernels._common import cdiv, pdl_args
from zerogr_kernels.allow_nodes import _allow_nodes_kernel, allow_nodes_triton


def main() -> None:
    dev = torch.device("cuda")
    wl = Workload(CatalogSpec("search-like", 20_000_000, 0, None), dev)
    cat, index = wl.catalog, wl.index
    t = node_tables(index)
    base, table = lookup_table(cat._id_lookup, dev)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; steps {index.n_levels}, words per request "
          f"{t.stride:,}, step offsets {t.words}, derived steps {len(t.derived)}", flush=True)
    rng = np.random.default_rng(0)
    for batch in (1, 8, 32):
        k = 200_000
        ids = np.concatenate([rng.choice(cat.item_ids, k, replace=False) for _ in range(batch)])
        buf = torch.zeros(1 << (ids.size - 1).bit_length(), dtype=torch.int64, device=dev)
        buf[:ids.size] = torch.from_numpy(ids).to(dev)
        off = torch.arange(batch + 1, dtype=torch.int64, device=dev) * k
        nodes = torch.zeros(batch, t.stride, dtype=torch.int32, device=dev)

        def launch(derived=(), first=0):
            return allow_nodes_triton(buf, off, table, base, t.rank_bits[first:].contiguous(),
                                      t.rank_before[first:].contiguous(), t.level_words[first:].contiguous(), nodes,
                                      derived)

        ref = launch().clone()
        print(f"batch {batch}: {ids.size:,} ids, buffer {buf.numel():,}", flush=True)
        launch(t.derived)
        print(f"  as the engine calls it (derived)  {median_us(lambda: launch(t.derived), 'cuda'):8.1f} us  "
              f"same={torch.equal(nodes, ref)}")
        print(f"  every step bit by bit             {median_us(launch, 'cuda'):8.1f} us")
        print(f"  memset of the bitmaps             {median_us(nodes.zero_, 'cuda'):8.1f} us")
        for first in (1, 2, 3):
            us = median_us(lambda: launch(first=first), "cuda")
            print(f"  bit by bit from step {first + 1} only       {us:8.1f} us")
        if "--sweep" not in sys.argv:
            continue
        for block in (128, 256, 512, 1024):
            for warps in (4, 8):
                def go():
                    nodes.zero_()
                    _allow_nodes_kernel[(cdiv(buf.numel(), block),)](
                        buf, off, table, table.numel(), base, t.rank_bits, t.rank_before, t.rank_bits.shape[1],
                        t.level_words, t.level_words.numel(), nodes, nodes.shape[1], BATCH=batch,
                        LOG_B=(batch + 1).bit_length(), BLOCK=block, num_warps=warps, **pdl_args(dev))
                go()
                print(f"  BLOCK {block:5d}, {warps} warps, bit by bit  {median_us(go, 'cuda'):8.1f} us  "
                      f"same={torch.equal(nodes, ref)}", flush=True)


if __name__ == "__main__":
    main()
