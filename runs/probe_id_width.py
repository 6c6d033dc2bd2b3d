"""Host time to gather a call's numpy ids into one buffer as int64 (what `place_ids` and
`ListBuffers._load_ids` do) against int32, each id first clipped to just outside the id
table's range so that an id the table does not hold stays a miss instead of wrapping onto a
real one (what an int32 id buffer would need): per-call ids at batch 1 / 8 / 32, 10,000 deny ids
and allow lists of 1 % of 2·10^7 items (200,000 ids) per request.

    python runs/probe_id_width.py [--repeats=N]      (on any machine: numpy only)

Prints the median microseconds of each gather and the bytes it writes (the bytes the copy to
the GPU then moves).
"""
import statistics
import sys
import time

import numpy as np

N_ITEMS = 20_000_000


def median_us(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    repeats = int(opts.get("repeats", 30))
    rng = np.random.default_rng(0)
    lo, hi = -1, N_ITEMS  # one past each end of a table of ids 0 … N_ITEMS - 1
    print(f"{'ids per request':>16} {'batch':>5} {'int64 us':>10} {'int32 us':>10} {'int64 MB':>9} {'int32 MB':>9}")
    for per_request in (10_000, 200_000):
        for batch in (1, 8, 32):
            parts = [rng.integers(0, N_ITEMS, per_request) for _ in range(batch)]
            n = per_request * batch
            wide, narrow = np.empty(n, np.int64), np.empty(n, np.int32)

            def gather64():
                np.concatenate(parts, out=wide)

            def gather32():
                at = 0
                for p in parts:
                    np.clip(p, lo, hi, out=narrow[at:at + p.size], casting="unsafe")
                    at += p.size

            gather32()
            assert (narrow.astype(np.int64) == np.concatenate(parts)).all()
            print(f"{per_request:>16,} {batch:>5} {median_us(gather64, repeats):>10.1f} "
                  f"{median_us(gather32, repeats):>10.1f} {wide.nbytes / 1e6:>9.2f} {narrow.nbytes / 1e6:>9.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
