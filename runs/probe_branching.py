"""How many beams a partial last step could leave out: the share of each catalog's last-level
prefixes that hold more than one item (those beams still need the model's last pass).

    python runs/probe_branching.py            (CPU, about a minute; writes nothing, prints a table)

Filtering first gives the only item of a non-branching prefix log-probability 0 whatever the model
says (``zerogr_core.decode.loop``), so at the last step a model with ``partial_last_step`` computes
the beams in branching prefixes only. Catalogs: the LLM benchmark's (``watch-like``, 10^7 items,
3 levels of 8,192) and Amazon Beauty's two content SID sets (tiger-cf, 4 levels of 256). Shares are
over prefixes, which is what a beam lands in when the decode's choice does not depend on how many
items a prefix holds (random weights); a trained model may prefer either kind.
"""
import json

import numpy as np
import torch

from zerogr_core import Catalog, build_index
from zerogr_core.catalog.synth import generate
from zerogr_core.recsys.sequences import BEAUTY_DIR


def shares(catalog) -> list[tuple[int, int, float]]:
    index = build_index(catalog)
    out = []
    for level, mapping in enumerate(index.steps, start=1):
        branching = mapping.branches(torch.arange(mapping.n_states))
        out.append((level, mapping.n_states, float(branching.float().mean())))
    return out


def main() -> None:
    catalogs = {"watch-like, 10^7 items (the LLM benchmark's)": generate("watch-like", 10_000_000, seed=0)}
    for name in ("index_rqkmeans.json", "index_rqvae.json"):
        path = BEAUTY_DIR / name
        if path.is_file():
            sids = np.array(sorted(tuple(v) for v in json.loads(path.read_text()).values()))
            catalogs[f"Amazon Beauty, {name}"] = Catalog.from_sids(sids, (256,) * sids.shape[1])
    print("| catalog | level | prefixes | share that branch (need the last pass) |")
    print("| --- | --- | --- | --- |")
    for name, catalog in catalogs.items():
        for level, states, share in shares(catalog):
            print(f"| {name} | {level} | {states:,} | {share:.3f} |")


if __name__ == "__main__":
    main()
