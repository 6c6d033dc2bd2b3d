"""Deny lists of more than 2,048 ids per request read in place from pinned memory, against copied
to the device first (``zerogr_kernels.deny_ids.IN_PLACE_WIDTH``), through the public API
(search-like catalog of 2·10^7 SIDs, FP16, H 1,024, beam 128), on a GPU, from runs/:

    python probe_in_place_width.py [BATCHES] [IDS] [CALLS]    # default 1,8,32 10000 60

Per batch, three arms take turns call by call (:func:`zerogr_core.timing.paired_runs`): the same
decoder without lists, the deny list with ``IN_PLACE_WIDTH`` 2,048 (wider ids copied), and with it
at ``MAX_IDS`` (read in place at every width). Each arm sets the limit before its calls; the two
list arms take shapes of their own in the one engine (copied or not is part of a shape's key). The items of the two list arms must
be equal.
"""
import statistics
import sys

import numpy as np
import torch

import zerogr_kernels.deny_ids as deny_kernels
from zerogr_core.bench.methods import ReplayModel
from zerogr_core.bench.workload import CatalogSpec, Workload
from zerogr_core.decode import id_lists, list_buffers
from zerogr_core.decode.decoder import Decoder
from zerogr_core.timing import paired_runs


def set_limit(width: int) -> None:
    for module in (deny_kernels, id_lists, list_buffers):
        module.IN_PLACE_WIDTH = width


def main() -> None:
    args = sys.argv[1:]
    batches = [int(b) for b in args[0].split(",")] if args else [1, 8, 32]
    per_request = int(args[1]) if len(args) > 1 else 10_000
    calls = int(args[2]) if len(args) > 2 else 60
    wl = Workload(CatalogSpec("search-like", 20_000_000, 0, None), torch.device("cuda"))
    print(torch.cuda.get_device_name(), torch.__version__, f"{per_request} denied ids per request", flush=True)
    limits = {"copied": 2048, "in place": deny_kernels.MAX_IDS}
    for batch in batches:
        ctx = wl.context("fp16", 1024, 128, batch, n_sets=1)
        model = ReplayModel(ctx.sets, batch)
        rng = np.random.default_rng(batch)
        ids = [wl.catalog.item_ids[rng.integers(0, wl.catalog.n_items, per_request)] for _ in range(batch)]
        dec = Decoder(wl.index, beam_width=128, catalog=wl.catalog, **wl.decoder_heads(ctx.heads))
        dec.gpu_engine = ctx.engine  # the suite's planned engine; each arm's lists take a shape of their own

        def arm(name):
            if name == "none":
                return lambda: dec.decode(model, batch)
            return lambda: (set_limit(limits[name]), dec.decode(model, batch, deny_items=ids))[1]

        results = {}
        for name in limits:
            results[name] = arm(name)()
            in_place = [s.lists.in_place for k, s in ctx.engine._shapes.items() if "lists" in k]
            print(f"batch {batch} {name}: list shapes read in place: {in_place}", flush=True)
        same = torch.equal(results["copied"].item_rows, results["in place"].item_rows)
        times = paired_runs({name: arm(name) for name in ("none", *limits)}, "cuda", repeats=calls, warmup=5)
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"batch {batch}: none {med['none'] * 1e3:.1f} us; copied {med['copied'] * 1e3:.1f} us "
              f"({med['copied'] / med['none']:.2f}x); in place {med['in place'] * 1e3:.1f} us "
              f"({med['in place'] / med['none']:.2f}x); in place / copied {med['in place'] / med['copied']:.3f}; "
              f"same items: {same}", flush=True)
    set_limit(2048)


if __name__ == "__main__":
    main()
