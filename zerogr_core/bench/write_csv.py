"""``python -m zerogr_core.bench.write_csv PATH [...]``: each committed run's CSV back beside its JSON.

Committed runs keep the ``.json`` document only (the working tree travels to the lent GPU within
64 MiB); :func:`zerogr_core.bench.results.write_csv` rewrites the table the run wrote, one row per record.
A folder stands for every result document under it (other JSON files there are left alone).
"""
from __future__ import annotations

import sys

from ..errors import Parser, UsageError
from .results import write_csvs


def main(argv=None) -> int:
    p = Parser(prog="python -m zerogr_core.bench.write_csv",
               description="Write each benchmark run's CSV beside its JSON document")
    p.add_argument("paths", nargs="+", metavar="PATH", help="a result FILE.json, or a folder of them")
    try:
        a = p.parse_args(argv)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in a.paths:
        try:
            for written in write_csvs(path):
                print(written)
        except (ValueError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
