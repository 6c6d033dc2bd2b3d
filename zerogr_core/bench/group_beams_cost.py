"""Time :func:`zerogr_kernels.group_beams` (the grouping behind the shared selective projection) on the GPU.

    python -m zerogr_core.bench.group_beams_cost    # µs per call (CUDA-graph replays), 16,384 / 4,096 / 1,024 beams

States are drawn uniformly from the 7,861 first tokens of the search-like catalog, as the beams
of step 2 are. Each size is timed for the counting sort that the engine runs and for the
stable ``torch.sort`` it replaced (the reference's sort and binary search, graph-safe);
results: runs/results/shared-ab/group_beams_cost.txt.
"""
import sys

import torch

from zerogr_core.timing import median_us
from zerogr_kernels import BeamGroups, group_beams_triton

N_STATES = 7861


def stable_sort(q: torch.Tensor, out: BeamGroups) -> None:
    torch.sort(q, stable=True, out=(out.states, out.order))
    torch.searchsorted(out.states, out.states, out=out.first)


def main() -> int:
    if not torch.cuda.is_available():
        print("group_beams_cost: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    for n in (16384, 4096, 1024):
        q = torch.randint(0, N_STATES, (n,), device=dev, dtype=torch.int64)
        out = BeamGroups.empty(n, N_STATES, dev)
        count = median_us(lambda: group_beams_triton(q, N_STATES, out=out), dev, 50)
        ok = torch.equal(out.states, torch.sort(q).values) and torch.equal(q[out.order], out.states)
        sort = median_us(lambda: stable_sort(q, out), dev, 50)
        print(f"group_beams n={n}: counting sort {count:.1f} us, stable torch.sort {sort:.1f} us (graph); "
              f"distinct {torch.unique(q).numel()}/{n}; sorted {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
