"""Count the operators one eager training step of the `tiger` preset's T5 dispatches, on the CPU.

    python -m zerogr_core.bench.count_train_ops [--batch 64] [--out runs/cpu_results/train-step-ops.json]

Every ATen operator the forward pass, the backward pass and gradient clipping dispatch is
counted (on a GPU each is at least one kernel launch); the optimizer is left out because
the CUDA path uses fused AdamW (one launch for all parameters). Host synchronisations
(``_local_scalar_dense``, ``nonzero``, ``is_nonzero``) are counted separately.
"""
from __future__ import annotations

import argparse
import collections
import json
import platform
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNCS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.is_nonzero.default"}


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def main(argv=None) -> int:
    import transformers

    from zerogr_core.recsys.seqrec_config import SeqPreset
    from zerogr_core.recsys.t5 import T5Recommender

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--out", default="runs/cpu_results/train-step-ops.json")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    preset = SeqPreset.preset("tiger")
    model = T5Recommender(preset.model, (256, 256, 256, 256)).train()
    sids = torch.randint(0, 256, (1000, 4))
    width = preset.model.max_items
    rows = torch.randint(0, 1000, (args.batch, width))
    lengths = torch.full((args.batch,), width)
    targets = torch.randint(0, 1000, (args.batch,))

    def forward():
        ids, mask = model.pack(rows, lengths, sids)
        return model.loss(ids, mask, sids[targets])

    forward().backward()                       # first call: lazy initialisation out of the count
    counts = {}
    for stage in ("forward", "backward", "clip"):
        model.zero_grad(set_to_none=True)
        loss = forward() if stage != "forward" else None
        if stage == "backward":
            with _Count() as c:
                loss.backward()
        elif stage == "clip":
            loss.backward()
            with _Count() as c:
                torch.nn.utils.clip_grad_norm_(model.parameters(), preset.train.grad_clip)
        else:
            with _Count() as c:
                forward()
        counts[stage] = dict(operators=sum(c.ops.values()), syncs=sum(v for k, v in c.ops.items() if k in SYNCS))
    result = dict(preset="tiger", batch=args.batch, history_items=width, counts=counts,
                  total_operators=sum(v["operators"] for v in counts.values()),
                  torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
                  command="python -m zerogr_core.bench.count_train_ops " + " ".join(argv or []))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(counts), "total", result["total_operators"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
