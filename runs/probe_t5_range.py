"""What the range check of ids already on the GPU costs a TIGER-size T5 call, as a user calls it.

    python runs/probe_t5_range.py [BATCHES] [REPEATS]     (on a GPU; BATCHES like 8,32; REPEATS 60)

The end-to-end benchmark's T5 (``E2EConfig.preset("tiger")``, bf16, random weights) over its ``tiger``
catalog (10^6 items), beam 128, ``HFGenerator(..., step_model=T5StepModel, prefill="inside")``: the
encoder and the decode in one CUDA graph; requests of the benchmark's shape, given as CUDA tensors with
their mask. Arms (:func:`zerogr_core.timing.paired_runs`: taking turns, each on an idle device, medians):

* ``deferred``: as shipped: the staged ids' min and max copied to pinned memory inside the graph and
  read after the launch (:class:`~zerogr_core.models.protocol.StagedRange`), the ids embedded clamped;
* ``check-first``: the check read before the staging (``t5.defers_range`` forced off): the host waits
  for a device reduction before the graph may start;
* ``no-check``: another generator whose step model records nothing (its graph without the min/max copy
  and event; the clamp stays): what the check costs at all.

Each arm's items are compared with the first's on the same requests.
"""
import statistics
import sys

import torch

from zerogr_core.bench.e2e import E2EConfig, build_catalog, build_model, requests, token_offsets
from zerogr_core.hf import HFGenerator
from zerogr_core.index import build_index
from zerogr_core.models import t5
from zerogr_core.timing import paired_runs


def main() -> None:
    batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "8,32").split(",")]
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    dev = torch.device("cuda")
    cfg = E2EConfig.preset("tiger")
    catalog = build_catalog(cfg, "tiger", seed=0)
    offsets = token_offsets(catalog.codebook_sizes)
    model = build_model(cfg, offsets[-1] + int(catalog.codebook_sizes[-1]), dev, seed=0).to(torch.bfloat16)
    index = build_index(catalog, device=dev)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; T5 d_model {cfg.d_model}, "
          f"{cfg.layers}+{cfg.layers} layers, {catalog.n_items:,} items, beam 128", flush=True)

    def generator(record: bool):
        sm = t5.T5StepModel(model, offsets)
        if not record:
            sm._range.record = lambda ids: None
        return HFGenerator(model, index, beam_width=128, token_offsets=offsets, step_model=sm, prefill="inside")

    for batch in batches:
        sets = [requests(catalog, cfg.history, offsets, batch, dev, seed=100 * batch + i) for i in range(4)]
        shipped, bare = generator(True), generator(False)
        cur = {"i": 0}

        def pick(i):
            cur["i"] = i % len(sets)

        def deferred():
            return shipped.generate(*sets[cur["i"]]).item_ids(catalog)

        def check_first():
            original, t5.defers_range = t5.defers_range, lambda history, device: False
            try:
                return shipped.generate(*sets[cur["i"]]).item_ids(catalog)
            finally:
                t5.defers_range = original

        def no_check():
            return bare.generate(*sets[cur["i"]]).item_ids(catalog)

        fns = {"deferred": deferred, "check-first": check_first, "no-check": no_check}
        for fn in fns.values():  # captures both graphs
            for i in range(len(sets)):
                pick(i)
                fn()
        got = paired_runs(fns, dev, repeats=repeats, warmup=5, before=pick)
        med = {k: statistics.median(v) for k, v in got.items()}
        base = med["deferred"]
        print(f"batch {batch}: " + ", ".join(f"{k} {v:.4f} ms ({v / base:.3f}x)" for k, v in med.items()), flush=True)
        same = []
        for i in range(len(sets)):
            pick(i)
            out = [fn() for fn in fns.values()]
            same.append(all((o == out[0]).all() for o in out[1:]))
        print(f"batch {batch}: the arms' items equal on {sum(same)} of {len(same)} request sets", flush=True)
        bad = sets[0][0].clone()
        bad[0, 0] = model.config.vocab_size
        try:
            shipped.generate(bad, sets[0][1])
            print(f"batch {batch}: a bad id was NOT refused", flush=True)
        except Exception as e:  # noqa: BLE001 - the probe prints what a user sees
            print(f"batch {batch}: a bad id: {type(e).__name__}: {e}", flush=True)
        del shipped, bare
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
