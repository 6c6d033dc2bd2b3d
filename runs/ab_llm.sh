#!/usr/bin/env bash
# An A/B of the Qwen3 recommender's code on one lent GPU: the LLM bench on a base copy of the model
# code, then on this checkout, in ROUNDS alternating rounds (default 2: base, new, base, new), so that
# a drift of the machine during the run shows as a difference between rounds rather than as a gain.
#
#   bash runs/ab_llm.sh BASE OUT [BENCH_ARGS...]
#
# BASE is a folder holding another version's kernels/ and zerogr_core/ (for example
# `git archive COMMIT kernels zerogr_core | tar x -C .wt_base`); OUT gets base1/, new1/, base2/, new2/, ...
# (llm.json, llm.csv, llm.md and run.log each) and ab.txt, the filter-first lines of every round.
# BENCH_ARGS go to `python -m zerogr_core.bench.llm` (default: --shapes 1000x1,1000x8 --no-hf
# --agreement-requests 0 --budget-s 100).
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: bash runs/ab_llm.sh BASE OUT [BENCH_ARGS...]" >&2; exit 2; }
BASE=$(cd "$1" && pwd) || { echo "error: $1: base folder not found" >&2; exit 2; }
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
shift 2
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(--shapes 1000x1,1000x8 --no-hf --agreement-requests 0 --budget-s 100)
for part in kernels zerogr_core; do
  [ -d "$BASE/$part" ] || { echo "error: $BASE/$part: missing (BASE needs kernels/ and zerogr_core/)" >&2; exit 2; }
done
NEW=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}

run() {  # run LABEL ROOT: the bench with ROOT's packages first on the path
  local label=$1 root=$2
  mkdir -p "$OUT/$label"
  (
    cd "$root" || exit 2
    ROOT=$root
    # shellcheck source=runs/checkout_env.sh
    source "$NEW/runs/checkout_env.sh"
    export PYTHONPATH="$root:${PYTHONPATH:-}"
    echo "== $label: $root ($(date -u +%H:%M:%S))"
    $PY -m zerogr_core.bench.llm --out "$OUT/$label" "${ARGS[@]}"
  ) > "$OUT/$label/run.log" 2>&1
  echo "$label exit $? ($(date -u +%H:%M:%S))"
}

for round in $(seq 1 "${ROUNDS:-2}"); do
  run "base$round" "$BASE"
  run "new$round" "$NEW"
done
grep -H '\] zerogr ' "$OUT"/{base,new}*/run.log | sed "s|$OUT/||" | sort -t: -k2,2 -s > "$OUT/ab.txt"
cat "$OUT/ab.txt"
