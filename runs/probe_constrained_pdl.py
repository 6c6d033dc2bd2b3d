"""PDL in the constrained graphs: device time of one replay and the public-API call's wall time,
with and without lists, under three launch choices, alternating in rounds.

    python runs/probe_constrained_pdl.py [BATCHES] [--rounds=2] [--ids=100]      (on a GPU, from runs/)

The constraints suite's engine (search-like catalog of 2·10^7 SIDs, FP16, H 1,024, beam 128) and
``--ids`` random catalog ids denied per request. Variants:
``main`` as shipped (constrained graphs with PDL up to ``CONSTRAINED_PDL_MAX_BATCH``);
``pdl`` every constrained graph with PDL; ``pdl-serial-lists`` the same but the filters that apply
lists launch without it. ``device`` is 50 replays back to back between two CUDA events, per replay;
``wall`` the median of 200 synchronised ``Decoder.decode(...).item_rows.cpu()`` calls.
"""
import sys

import numpy as np
import torch

import zerogr_kernels.filtering as filtering
from zerogr_core.bench.workload import CatalogSpec, Workload
from zerogr_core.decode import engine as engine_mod

from host_stamps_lists import device_us  # runs/, the script's folder
from host_timeline_lists import deny_setup, wall_us

VARIANTS = {"main": (engine_mod.CONSTRAINED_PDL_MAX_BATCH, True), "pdl": (1 << 30, True),
            "pdl-serial-lists": (1 << 30, False)}


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    batches = [int(b) for b in args[0].split(",")] if args else [1, 8, 32]
    rounds, per_request = int(opts.get("rounds", 2)), int(opts.get("ids", 100))
    wl = Workload(CatalogSpec("search-like", 20_000_000, 0, None), torch.device("cuda"))
    for r in range(rounds):
        for batch in batches:
            for name, (max_batch, list_pdl) in VARIANTS.items():
                engine_mod.CONSTRAINED_PDL_MAX_BATCH, filtering.LIST_FILTER_PDL = max_batch, list_pdl
                ctx, eng, dec, model, ids, _ = deny_setup(wl, batch, per_request)
                none = wall_us(lambda: dec.decode(model, batch).item_rows.cpu(), 200, warmup=10)
                deny = wall_us(lambda: dec.decode(model, batch, deny_items=ids).item_rows.cpu(), 200, warmup=10)
                dev = {("lists" in k): device_us(s.graph) for k, s in eng._shapes.items() if s.graph is not None}
                print(f"round {r} batch {batch:2d} {name:17s} wall none {none:7.1f} deny {deny:7.1f} us "
                      f"({deny / none:.2f}x); device none {dev[False]:7.1f} deny {dev[True]:7.1f} us "
                      f"({dev[True] / dev[False]:.2f}x)", flush=True)
                ctx.release()


if __name__ == "__main__":
    main()
