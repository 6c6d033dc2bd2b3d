"""Device time of ``deny_rows`` alone, the first kernels of a decode given deny ids: each
request's ids looked up in a dense id table of 2·10^7 rows (the constraints suite's catalog
size), sorted, their repeats dropped, and the row bitmap set, as the engine calls it.

    python runs/probe_deny_rows.py [OUT.json]            (on a GPU, from the repository root)

Each request lists ``0.61 · width`` random ids (10,000 at 16,384) with repeats and ids outside
the table, already on the device (what the engine copies past ``MAX_WIDTH``). ``deny_rows`` is
the op as this checkout dispatches it; where the checkout has the wide path's block
(``WIDE_BLOCK``), ``wide`` times that path at every width too, so the two sides of ``MAX_WIDTH``
compare. Median of graph replays (``zerogr_core.timing.median_us``); one line per (batch,
width) and a JSON file with the environment. Run it in another checkout's tree for an A/B.
"""
import json
import platform
import sys

import torch
import triton

import zerogr_kernels.deny_ids as deny_ids
from zerogr_core.timing import median_us
from zerogr_kernels.row_marks import mark_words

N_ROWS = 20_000_000
WIDTHS = (128, 1024, 2048, 4096, 8192, 16_384, 65_536)


def case(batch: int, width: int, g: torch.Generator):
    dev = torch.device("cuda")
    n_ids = int(0.61 * width)
    ids = torch.randint(-5, N_ROWS + 5, (batch * n_ids,), generator=g).to(dev)
    id_offsets = (torch.arange(batch + 1) * n_ids).to(dev)
    table = torch.randperm(N_ROWS, generator=g).to(torch.int32).to(dev)
    offsets = torch.cat([torch.zeros(2, dtype=torch.int64), torch.arange(1, batch + 1) * width]).to(dev)
    rows = torch.empty(batch * width, dtype=torch.int64, device=dev)
    marks = torch.zeros(mark_words(N_ROWS), dtype=torch.int32, device=dev)
    return ids, id_offsets, width, table, 0, rows, offsets, N_ROWS, marks


def wide(*args, marks):
    """The checkout's wide path whatever the width (``MAX_WIDTH`` lowered for the call)."""
    saved, deny_ids.MAX_WIDTH = deny_ids.MAX_WIDTH, 0
    try:
        return deny_ids.deny_rows_triton(*args, marks=marks)
    finally:
        deny_ids.MAX_WIDTH = saved


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else None
    g = torch.Generator().manual_seed(0)
    fns = {"deny_rows": deny_ids.deny_rows}
    if hasattr(deny_ids, "WIDE_BLOCK"):
        fns["wide"] = wide
    records = []
    for batch in (1, 8, 32):
        for width in WIDTHS:
            *args, marks = case(batch, width, g)
            want = deny_ids.deny_rows_reference(*args[:5], args[5].clone(), *args[6:])
            rec = {"batch": batch, "width": width, "ids_per_request": int(0.61 * width),
                   "max_width": deny_ids.MAX_WIDTH}
            for name, fn in fns.items():
                got = fn(*args[:5], args[5].clone(), *args[6:], marks=marks)
                assert torch.equal(got, want), f"{name} differs from the reference at width {width}"
                rec[name + "_us"] = median_us(lambda fn=fn: fn(*args, marks=marks), "cuda", repeats=200)
            records.append(rec)
            print(f"batch {batch:3d} width {width:6d}: " + "  ".join(f"{k} {v:8.1f}" for k, v in rec.items()
                                                                     if k.endswith("_us")), flush=True)
            del args, marks
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version(), "n_rows": N_ROWS}
    if out:
        with open(out, "w") as f:
            json.dump({"environment": env, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
