#!/usr/bin/env bash
# Offline decoding (`decode-dataset`) on 1..N GPUs of one host, torchrun + NCCL, and whether the
# outputs agree. Run it on the lent 2-GPU machine:
#
#   bash runs/decode_scaling.sh            # GPUS="1 2", the Beauty checkpoint, every test user
#
# A short one-GPU run first fills the plan store and Triton's cache, so every measured run starts
# equally warm; each run's `<out>.summary.json` (per-rank setup and decode seconds, users/s, GPU,
# driver, torch, Triton) lands in $OUT as dd-<g>gpu.summary.json, with scaling.json comparing them.
#
# Environment: OUT (default ./gpu_out), GPUS (default "1 2"), CHECKPOINT, INPUT, K (default 10),
# USERS (default: all), PYTHON (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/gpu_out}
GPUS=${GPUS:-1 2}
CKPT=${CHECKPOINT:-sample_catalogs/amazon-beauty/model.pt}
INPUT=${INPUT:-sample_catalogs/amazon-beauty/inter.json}
K=${K:-10}
WORK=$(mktemp -d /tmp/zerogr_scaling.XXXXXX)
mkdir -p "$OUT"
# empty caches of this run's own, so the warm-up below is what fills them
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$WORK/triton} ZEROGR_CACHE_DIR=${ZEROGR_CACHE_DIR:-$WORK/cache}
source "$ROOT/runs/checkout_env.sh"   # zerogr_kernels from this checkout
users=()
[[ -n "${USERS:-}" ]] && users=(--users "$USERS")
common=(decode-dataset --checkpoint "$CKPT" --input "$INPUT" --k "$K")
echo "warm-up: one GPU, 512 users (plans and compiles once)"
$PY -m zerogr_core "${common[@]}" --users 512 --out "$WORK/warm.jsonl" || exit 1
for g in $GPUS; do
  echo "decode-dataset on $g GPU(s)"
  $PY -m torch.distributed.run --standalone --nproc-per-node "$g" -m zerogr_core "${common[@]}" "${users[@]}" \
    --out "$WORK/dd-${g}gpu.jsonl" || exit 1
  cp "$WORK/dd-${g}gpu.jsonl.summary.json" "$OUT/dd-${g}gpu.summary.json"
done
$PY - "$WORK" "$OUT" $GPUS <<'PY'
import json, sys, pathlib
work, out, gpus = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
runs, recs = {}, {}
for g in gpus:
    s = json.loads((out / f"dd-{g}gpu.summary.json").read_text())
    recs[g] = {r["user"]: r for r in map(json.loads, (work / f"dd-{g}gpu.jsonl").read_text().splitlines())}
    runs[g] = dict(world_size=s["world_size"], users=s["users"], errors=s["errors"], wall_s=s["wall_s"],
                   rank_setup_s=s["rank_setup_s"], rank_decode_s=s["rank_decode_s"],
                   slowest_rank_decode_s=max(s["rank_decode_s"]), users_per_s_decode=s["users_per_s_decode"])
base = gpus[0]
agreement = {}
for g in gpus[1:]:
    same = sum(recs[g].get(u, {}).get("items") == r["items"] for u, r in recs[base].items())
    gap = max((abs(a - b) for u, r in recs[base].items() if u in recs[g]
               for a, b in zip(r["scores"], recs[g][u]["scores"])), default=0.0)
    agreement[g] = dict(users_same_items=same, users=len(recs[base]), max_abs_score_diff=gap)
report = dict(command="bash runs/decode_scaling.sh", runs=runs,
              speedup_decode={g: round(runs[base]["slowest_rank_decode_s"] / r["slowest_rank_decode_s"], 3)
                              for g, r in runs.items()},
              speedup_wall={g: round(runs[base]["wall_s"] / r["wall_s"], 3) for g, r in runs.items()},
              agreement_with_first=agreement,
              machine=json.loads((out / f"dd-{base}gpu.summary.json").read_text())["machine"])
(out / "scaling.json").write_text(json.dumps(report, indent=2) + "\n")
print(json.dumps({k: report[k] for k in ("speedup_decode", "speedup_wall", "agreement_with_first")}))
PY
