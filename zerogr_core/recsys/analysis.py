"""Per-step density of the real Amazon Beauty SID catalogs against the synthetic presets.

The catalog-level density of step l is E_l / (S_l · |V_l|) (:meth:`Catalog.step_stats`,
the Density page's catalog rows): the share of the codebook that is valid after a
prefix, every prefix counted once. With a trained model, the invalid probability mass
per step (what scoring first leaves on tokens that lead to no item) comes from a quality
report's ``invalid_mass`` rows.

``python -m zerogr_core.recsys.analysis [--quality FILE ...] [--out FILE]`` writes the
markdown tables (default ``bench/results/beauty-density.md``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..catalog import Catalog
from ..catalog.synth import SYNTH_PRESETS, generate
from .data import REPO_ROOT, leave_one_out
from .semantic_ids import SIDConfig
from .sequences import BEAUTY_DIR, load_sequences, sequence_semantic_ids

DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "beauty-density.md"


def beauty_catalogs() -> dict[str, Catalog]:
    """The three Beauty SID tables: content RQ-KMeans, content RQ-VAE (tiger-cf files) and
    RQ-KMeans built here from the training interactions of ``Beauty.txt``."""
    out = {}
    for name, sids in (("Beauty, content RQ-KMeans (tiger-cf)", "index_rqkmeans.json"),
                       ("Beauty, content RQ-VAE (tiger-cf)", "index_rqvae.json")):
        data = load_sequences(BEAUTY_DIR / "inter.json", BEAUTY_DIR / sids)
        out[name] = sequence_semantic_ids(data, leave_one_out(data)).catalog
    data = load_sequences(BEAUTY_DIR / "Beauty.txt")
    config = SIDConfig(levels=3, codebook_size=256, collab_dim=64, content_weight=0.0)
    out["Beauty, collaborative RQ-KMeans 3×256 + collision (built here)"] = \
        sequence_semantic_ids(data, leave_one_out(data), config).catalog
    return out


def synthetic_catalogs(n_items: int) -> dict[str, Catalog]:
    """Every synthetic preset at ``n_items`` items (seed 0)."""
    return {f"synthetic {kind}, N = {n_items:,}": generate(kind, n_items, seed=0) for kind in SYNTH_PRESETS}


def density_markdown(catalogs: dict[str, Catalog]) -> str:
    """One row per catalog: codebooks and the catalog-level density and mean branching per step."""
    depth = max(c.n_levels for c in catalogs.values())
    head = "| catalog | items | codebooks | " + " | ".join(f"step {s + 1}" for s in range(depth)) + " |"
    lines = [head, "|" + " --- |" * (3 + depth)]
    for name, cat in catalogs.items():
        steps = cat.step_stats()
        cells = [f"{s['density']:.4f} ({s['mean_segment']:.1f})" for s in steps] + [""] * (depth - len(steps))
        lines.append(f"| {name} | {cat.n_items:,} | {'/'.join(map(str, cat.codebook_sizes))} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def invalid_mass_markdown(reports: dict[str, dict]) -> str:
    """Per step of each report: mean / p90 / p99 invalid mass and beam-weighted density."""
    lines = ["| model | step | beams | mean invalid mass | p90 | p99 | beam density |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, rep in reports.items():
        for row in rep["invalid_mass"]:
            lines.append(f"| {name} | {row['step']} | {row['beams']:,} | {row['mean']:.4f} | {row['p90']:.4f} | "
                         f"{row['p99']:.4f} | {row['beam_density']:.4f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quality", nargs="*", default=[], metavar="FILE",
                        help="quality reports (JSON) whose invalid mass per step to tabulate")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    beauty = beauty_catalogs()
    n = next(iter(beauty.values())).n_items
    text = ["# Amazon Beauty: per-step density of a real SID catalog", "",
            "Catalog-level density E_l / (S_l·|V_l|) per step, with the mean number of valid tokens per "
            "prefix in brackets (`catalog.step_stats`, the Density page's catalog density). The synthetic "
            f"presets are generated at the same item count ({n:,}).", "",
            density_markdown({**beauty, **synthetic_catalogs(n)}), ""]
    if args.quality:
        reports = {}
        for path in args.quality:
            rep = json.loads(Path(path).read_text())
            reports[f"{rep.get('preset', '?')} preset, {rep['users']:,} users"] = rep
        text += ["## Invalid probability mass per step under scoring first (beam 128, test users)", "",
                 invalid_mass_markdown(reports), ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(text))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
