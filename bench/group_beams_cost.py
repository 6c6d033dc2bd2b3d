"""Time :func:`zerogr_kernels.group_beams` (the sort behind the shared selective projection) on the GPU.

    python bench/group_beams_cost.py    # prints µs per call (CUDA-graph replays) for 16,384 / 4,096 / 1,024 beams

States are drawn uniformly from the 7,861 first tokens of the search-like catalog, as the beams
of step 2 are; results: bench/results/shared-ab/group_beams_cost.txt.
"""
import sys

import torch

from zerogr_core.timing import median_us
from zerogr_kernels import BeamGroups, group_beams


def main() -> int:
    if not torch.cuda.is_available():
        print("group_beams_cost: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    for n in (16384, 4096, 1024):
        q = torch.randint(0, 7861, (n,), device=dev, dtype=torch.int64)
        out = BeamGroups(*(torch.empty(n, dtype=torch.int64, device=dev) for _ in range(3)))
        t = median_us(lambda: group_beams(q, out=out), dev, 50)
        print(f"group_beams n={n}: {t:.1f} us (graph); distinct {torch.unique(q).numel()}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
