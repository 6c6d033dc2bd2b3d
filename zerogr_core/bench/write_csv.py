"""``python -m zerogr_core.bench.write_csv PATH [...]``: each committed run's CSV back beside its JSON.

Committed runs keep the ``.json`` document only (the working tree travels to the lent GPU within
64 MiB); :func:`zerogr_core.bench.results.write_csv` rewrites the table the run wrote, one row per record.
A folder stands for every result document under it (other JSON files there are left alone).
"""
from __future__ import annotations

import sys

from .results import write_csvs


def main(argv=None) -> int:
    files = sys.argv[1:] if argv is None else list(argv)
    if not files or any(f.startswith("-") for f in files):
        print("usage: python -m zerogr_core.bench.write_csv PATH [PATH ...]  (a result FILE.json, or a folder of "
              "them; writes FILE.csv beside each)", file=sys.stderr)
        return 2
    for f in files:
        try:
            for written in write_csvs(f):
                print(written)
        except (ValueError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
