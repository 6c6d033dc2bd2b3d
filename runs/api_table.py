"""The public-API table of constraints-suite result files: each condition's median and its
ratio to the same decoder without lists, per batch, one column block per file (an A/B's rounds
side by side). Where a record holds it, the ratio is to the list-free calls that took turns with
the condition's (``p50_ratio`` beside ``none_paired_median_ms``), else to the suite's own
list-free row.

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
            med[r["batch"]][label(r)] = (r["median_ms"], r.get("p50_ratio") if "none_paired_median_ms" in r else None)
        tables.append((path, med))
    conditions = list(dict.fromkeys(c for _, med in tables for b in med for c in med[b]))
    batches = sorted({b for _, med in tables for b in med})
    print("condition | batch | " + " | ".join(p for p, _ in tables))
    for c in conditions:
        for b in batches:
            cells = []
            for _, med in tables:
                none, (t, paired) = med[b].get("none", (None, None))[0], med[b].get(c, (None, None))
                ratio = paired if paired is not None else (t / none if none and t is not None else None)
                cells.append("-" if t is None else f"{t:.3f} ms ({ratio:.2f}x)" if ratio else f"{t:.3f} ms")
            print(f"{c} | {b} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
