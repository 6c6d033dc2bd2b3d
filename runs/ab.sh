#!/usr/bin/env bash
# An A/B of this checkout against a base copy of the code on one lent GPU: a bench command on the
# base, then on this checkout, in ROUNDS alternating rounds (default 2: base, new, base, new), so that
# a drift of the machine during the run shows as a difference between rounds rather than as a gain.
#
#   bash runs/ab.sh llm BASE OUT [BENCH_ARGS...]           the Qwen3 recommender's bench
#   bash runs/ab.sh constraints BASE OUT [BENCH_ARGS...]   the constraints suite (public API rows)
#
# BASE is a folder holding another version's kernels/ and zerogr_core/ (for example
# `git archive COMMIT kernels zerogr_core | tar x -C .wt_base`); OUT gets base1/, new1/, base2/, new2/, ...
# (the bench's result files and run.log each) and ab.txt, the summary lines of every round.
# BENCH_ARGS replace the defaults (llm: --shapes 1000x1,1000x8 --no-hf --agreement-requests 0
# --budget-s 100; constraints: --seed 0 --catalog search-like --scale 2e7 --budget-s 85). With PACK=1
# the round folders end up in OUT/ab.tgz instead (the device returns at most 8 files a call).
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: bash runs/ab.sh {llm|constraints} BASE OUT [BENCH_ARGS...]" >&2; exit 2; }
KIND=$1
case "$KIND" in
  llm) CMD=(-m zerogr_core.bench.llm); DEFAULTS=(--shapes 1000x1,1000x8 --no-hf --agreement-requests 0 --budget-s 100)
       SUMMARY='\] zerogr ' ;;
  constraints) CMD=(-m zerogr_core bench --suite constraints); DEFAULTS=(--seed 0 --catalog search-like --scale 2e7
       --budget-s 85); SUMMARY='\[constraints\] public API' ;;
  *) echo "error: $KIND: unknown bench (llm or constraints)" >&2; exit 2 ;;
esac
BASE=$(cd "$2" 2>/dev/null && pwd) || { echo "error: $2: base folder not found" >&2; exit 2; }
OUT=$(mkdir -p "$3" && cd "$3" && pwd)
shift 3
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=("${DEFAULTS[@]}")
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
    $PY "${CMD[@]}" --out "$OUT/$label" "${ARGS[@]}"
  ) > "$OUT/$label/run.log" 2>&1
  echo "$label exit $? ($(date -u +%H:%M:%S))"
}

for round in $(seq 1 "${ROUNDS:-2}"); do
  run "base$round" "$BASE"
  run "new$round" "$NEW"
done
grep -H "$SUMMARY" "$OUT"/{base,new}*/run.log | sed "s|$OUT/||" | sort -t: -k2,2 -s > "$OUT/ab.txt"
cat "$OUT/ab.txt"
if [[ "${PACK:-0}" == 1 ]]; then
  (cd "$OUT" && tar czf ab.tgz base* new* && rm -rf base* new*)
fi
