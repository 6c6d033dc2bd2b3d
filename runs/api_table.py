"""The public-API table of constraints-suite result files: each condition's median and its
ratio to the same decoder without lists, per batch, one column block per file (an A/B's rounds
side by side).

    python runs/api_table.py FILE.json [FILE.json ...]
"""
import json
import sys
from collections import defaultdict


def label(r) -> str:
    name = r["condition"]
    return name + (", catalog" if r.get("normalise") == "catalog" and "catalog" not in name else "")


def main() -> None:
    tables = []
    for path in sys.argv[1:]:
        recs = [r for r in json.load(open(path))["records"] if r.get("kind") == "constraints-api"]
        med = defaultdict(dict)
        for r in recs:
            med[r["batch"]][label(r)] = r["median_ms"]
        tables.append((path, med))
    conditions = list(dict.fromkeys(c for _, med in tables for b in med for c in med[b]))
    batches = sorted({b for _, med in tables for b in med})
    print("condition | batch | " + " | ".join(p for p, _ in tables))
    for c in conditions:
        for b in batches:
            cells = []
            for _, med in tables:
                none, t = med[b].get("none"), med[b].get(c)
                cells.append("-" if t is None else f"{t:.3f} ms ({t / none:.2f}x)" if none else f"{t:.3f} ms")
            print(f"{c} | {b} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
