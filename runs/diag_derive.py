"""Each derived-step count of ``allow_nodes`` against its reference on CUDA, per test case: how
many bitmap words differ and the first of them, or what raised (a per-case form of
``tests/test_allow_nodes.py::test_cuda_kernel_matches_reference``).

    python runs/diag_derive.py      # from the repository root, on a GPU
"""
import sys
import traceback

import torch

sys.path.insert(0, "tests")
from test_allow_nodes import case, derived_of, layout_of, run  # noqa: E402

from zerogr_kernels.allow_nodes import allow_nodes_reference, allow_nodes_triton, node_layout  # noqa: E402

for seed, batch, n_ids in [(1, 1, 30), (3, 5, 200), (4, 8, 3000), (2, 3, 40)]:
    full = case(seed, batch, n_ids)
    words, stride = node_layout(layout_of(full[1])[1])
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in full[2:]]
    want = run(allow_nodes_reference, args)
    same = torch.equal(want.cpu(), run(allow_nodes_reference, list(full[2:])))
    print(f"case {seed},{batch},{n_ids}: words {words} stride {stride}; reference cuda==cpu {same}")
    for d in (0, 1, 2):
        try:
            derived = tuple((t[0].cuda(), *t[1:]) for t in derived_of(full[1], d))
            got = run(allow_nodes_triton, args, derived)
            torch.cuda.synchronize()
            bad = (want != got).nonzero()
            first = tuple(bad[:6].T)
            print(f"  derive {d}: {bad.shape[0]} bad words; first {bad[:6].tolist()} got {got[first].tolist()} "
                  f"want {want[first].tolist()}")
        except Exception:
            print(f"  derive {d}: raised")
            traceback.print_exc(limit=3)
