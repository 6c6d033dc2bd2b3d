"""``python -m zerogr_core.bench.write_csv FILE.json [...]``: each committed run's CSV back beside its JSON.

Committed runs keep the ``.json`` document only (the working tree travels to the lent GPU within
64 MiB); :func:`zerogr_core.bench.results.write_csv` rewrites the table the run wrote, one row per record.
"""
from __future__ import annotations

import sys

from .results import write_csv


def main(argv=None) -> int:
    files = sys.argv[1:] if argv is None else list(argv)
    if not files or any(f.startswith("-") for f in files):
        print("usage: python -m zerogr_core.bench.write_csv FILE.json [FILE.json ...]  (writes FILE.csv beside each)",
              file=sys.stderr)
        return 2
    for f in files:
        try:
            print(write_csv(f))
        except (ValueError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
