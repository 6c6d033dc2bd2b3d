#!/usr/bin/env bash
# The one script to run on the lent GPU (NVIDIA H200): GPU tests, then the benchmark suites in
# priority order, each under its own time budget, results written as they come.
#
#   bash runs/gpu_run.sh                      # every group, in priority order, within BENCH_BUDGET_S
#   bash runs/gpu_run.sh tests headline detail
#   bash runs/gpu_run.sh watch beams codebooks scale
#
# Groups (priority order; each is one `python3 -m zerogr_core bench` call unless noted):
#   tests     GPU-marked tests and the whole kernel/engine suite on CUDA (pytest), log with GPU + versions
#   headline  search-like 19,269,255 SIDs (docs/design.md §8 anchor, "2e7"): index memory, then every method, batches 1..32,
#             FP16/H1024 and FP32/H4096, checks, plans
#   coldstart search-like 19,269,255: first decode of FP16/H1024 and FP32/H4096 at batches 1 and 32 in fresh
#             processes, with empty then warm plan store + Triton cache (targets: cold <= 30 s, warm <= 10 s)
#   contract  search-like 19,269,255: step-2 ablation and per-step GEMMs in fp16/bf16/fp32 (the numeric contract)
#   constraints search-like 2e7: allow/deny lists per request and live catalog versions (constraints, live)
#   detail    search-like 19,269,255: stages, step-2 ablation, per-step latency, index construction, interference
#   watch     watch-like 2e7: memory + headline
#   beams     synthetic-7 1e7: beam-width sweep (64,128,256), batches SWEEP_BATCHES
#   codebooks synthetic-7 1e7: codebook sweep (V 2048..16384), batches CODEBOOK_BATCHES
#   scale     search-like 1e8 (BENCH_BIG_SCALE): memory, headline at batches 1,8,32, build
#   llm       Qwen3-1.7B-shaped recommender (zerogr_core.bench.llm): its CUDA tests, then the SID-GR matrix
#             (context 1,000/5,000 x batch 1-8, beam 256; beams 128/512), Hugging Face generate, bf16 agreement
#             (LLM_ARGS: extra arguments, e.g. "--shapes 1000x1,5000x8 --profile --no-hf")
#   serve_llm the Qwen3 server in-process (zerogr_core.serve.llm_load_test): context 5,000, beam 256,
#             64 requests at concurrency 4, through the Ray deployment's batching code
#   quality   the constraint tests on CUDA, then the Beauty quality study's clock (history denied per request)
#   e2e       end to end with a model (bench-e2e): TIGER-size T5 and decoder-only, on the 4x256 1e6 and
#             search-like 2e7 catalogs, batches E2E_BATCHES (1,8,32), beams E2E_BEAMS (32,128,256),
#             models E2E_MODELS (t5,decoder-only), catalogs E2E_CATALOGS (tiger,search)
#
# Exit status: 1 when a test run or a benchmark command exited non-zero (or was stopped by its hard time
# limit), after every group has had its turn and the results are packed; the log's last line names them.
#
# Environment:
#   OUT             folder whose files come back (default ./gpu_out). At most 4 files land there:
#                   gpu_run.log, gpu_tests.log, summary.txt, bench_results.tar.gz (re-packed after every
#                   group; it holds results/<group>/*.json|jsonl|csv and results/logs/; unpack it with
#                   `tar xzf bench_results.tar.gz -C runs/` to land in runs/results/)
#   BENCH_BUDGET_S  total seconds for the whole script (default 540); groups stop starting new work when it
#                   is spent, and each group is capped by BUDGET_<GROUP> (e.g. BUDGET_HEADLINE=200);
#                   the CUDA tests of the llm, serve_llm and quality groups take a third of it, or
#                   BUDGET_<GROUP>_TESTS seconds (e.g. BUDGET_LLM_TESTS=200: their kernels compile per case)
#   BENCH_BIG_SCALE SIDs of the scale group (default 1e8)
#   SWEEP_BATCHES   batches of the beam-width sweep (default 1,32); CODEBOOK_BATCHES: of the codebook sweep (32)
#   SWEEP_BEAMS     beam widths of the beam-width sweep (default 64,128,256)
#   SWEEP_CODEBOOKS codebook sizes of the codebook sweep (default 2048,4096,8192,16384)
#   BENCH_WORK      where results collect before packing (default /tmp/zerogr_gpu_run)
#   RESULTS_TAG     suffix of the bench groups' result folders and logs (results/<group>-<tag>/), so a
#                   partial rerun (e.g. SWEEP_BEAMS=256 RESULTS_TAG=b256) unpacks beside earlier results
#   BENCH_ARGS      extra arguments for every bench call (e.g. "--repeats 20")
#   PYTHON          interpreter (default python3)
#   TEST_WORKERS    pytest-xdist workers of the tests group when xdist is installed (default 8)
#   BENCH_QUICK=1   dry run of this script on a CPU: every bench call in --quick mode (tiny catalogs),
#                   and only tests/test_bench.py in the tests group
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/gpu_out}
WORK=${BENCH_WORK:-/tmp/zerogr_gpu_run}
TOTAL=${BENCH_BUDGET_S:-540}
BIG=${BENCH_BIG_SCALE:-1e8}
EXTRA=${BENCH_ARGS:-}
mkdir -p "$OUT" "$WORK/results/logs"
LOG="$OUT/gpu_run.log"
export PYTHONUNBUFFERED=1
source "$ROOT/runs/checkout_env.sh"   # zerogr_kernels from this checkout, Triton cache
START=$(date +%s)

log() { echo "[gpu_run $(date +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
FAILED=()
outcome() {  # outcome WHAT STATUS: a step that exited non-zero fails the run (after every group has had its turn)
  if (( $2 != 0 )); then FAILED+=("$1 (exit $2)"); log "$1 exited with status $2"; fi
}
left() { echo $(( TOTAL - ($(date +%s) - START) )); }
budget() {  # budget GROUP DEFAULT -> min(BUDGET_GROUP or DEFAULT, time left - 15 s for packing)
  local var="BUDGET_$(echo "$1" | tr 'a-z-' 'A-Z_')"
  local want=${!var:-$2}
  local rest=$(( $(left) - 15 ))
  (( want < rest )) && echo "$want" || echo "$rest"
}
pack() {
  tar -czf "$OUT/bench_results.tar.gz.tmp" -C "$WORK" results 2>/dev/null \
    && mv -f "$OUT/bench_results.tar.gz.tmp" "$OUT/bench_results.tar.gz"
  $PY -m zerogr_core bench --summarize "$WORK/results" > "$OUT/summary.txt" 2>&1 || true
}
bench() {  # bench GROUP BUDGET ARGS...
  local group=$1 b=$2; shift 2
  if (( b < 20 )); then log "skip $group: time budget spent"; return; fi
  local dir="$group${RESULTS_TAG:+-$RESULTS_TAG}"
  mkdir -p "$WORK/results/$dir"
  if [[ "${BENCH_QUICK:-0}" == 1 ]]; then  # drop the size options, add --quick
    local args=() skip=0
    for a in "$@"; do
      if (( skip )); then skip=0; continue; fi
      if [[ "$a" == --scale || "$a" == --batch || "$a" == --beam || "$a" == --codebook ]]; then skip=1; continue; fi
      args+=("$a")
    done
    set -- "${args[@]}" --quick
  fi
  log "group $group: budget ${b}s: bench $*"
  # --budget-s stops new measurements; timeout is the hard stop for a hung process
  timeout --signal=INT --kill-after=20 $(( b + 45 )) \
    $PY -m zerogr_core bench --out "$WORK/results/$dir" --budget-s "$b" "$@" $EXTRA 2>&1 \
    | tee "$WORK/results/logs/$dir.log" | tee -a "$LOG" | grep -E "^\[|^===|^bench:|error"
  outcome "$group" "${PIPESTATUS[0]}"
  pack
  log "group $group done"
}

header() {
  echo "# zerogr GPU run $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || echo "nvidia-smi: n/a"
  $PY - <<'EOF' 2>&1
import os, platform, torch
try:
    import triton; tv = triton.__version__
except Exception as exc:  # noqa: BLE001
    tv = f"n/a ({exc})"
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(f"gpu: {gpu} | torch {torch.__version__} (CUDA {torch.version.cuda}) | triton {tv} | "
      f"python {platform.python_version()} | cpus {os.cpu_count()}")
EOF
}

group_tests() {
  local b; b=$(budget tests 320)
  if (( b < 30 )); then log "skip tests: time budget spent"; return; fi
  local tl="$OUT/gpu_tests.log"
  { header; echo; } > "$tl"
  log "group tests: budget ${b}s"
  # the whole kernel suite (and engine/decoder/index) on CUDA, then the other GPU-marked tests
  local suite=(tests/test_kernels_filter.py tests/test_kernels_normalize.py tests/test_kernels_selection.py
               tests/test_kernels_selective.py tests/test_kernels_shared_selective.py
               tests/test_kernels_full_projection.py tests/test_kernels_filter_lists.py tests/test_kernels_list_spans.py
               tests/test_kernels_model.py tests/test_kernels_row_sums.py tests/test_kernels_qk_norm_rope.py
               tests/test_kernels_swiglu.py tests/test_kernels_beam_context_attention.py tests/test_kernels_fp8_rows.py
               tests/test_contract.py
               tests/test_engine.py tests/test_decode.py tests/test_index.py tests/test_crosscheck.py)
  # GPU-marked tests of the modules that import without polars/streamlit (absent on the
  # lent machine's image; tests/test_app_gpu.py needs streamlit wheels carried in)
  local marked=(tests/test_kernels_gpu.py tests/test_bench.py tests/test_plan_store.py tests/test_constraints.py
                tests/test_models_gpu.py tests/test_allow_nodes.py tests/test_deny_ids.py tests/test_device_lists.py
                tests/test_constraint_api.py tests/test_graphed_step.py tests/test_qwen3.py tests/test_qwen3_fp8.py)
  [[ "${BENCH_QUICK:-0}" == 1 ]] && suite=(tests/test_bench.py) && marked=(tests/test_bench.py)
  # Triton compiles every specialisation on first use (CPU-bound): spread the tests over
  # pytest-xdist workers when it is installed (they share the Triton cache)
  local par=()
  $PY -c "import xdist" 2>/dev/null && par=(-n "${TEST_WORKERS:-8}")
  timeout --kill-after=15 $(( b * 3 / 5 )) $PY -m pytest -rs -p no:cacheprovider "${par[@]}" "${suite[@]}" \
    >> "$tl" 2>&1
  local rc=$?
  echo "kernel/engine suite exit status: $rc" >> "$tl"
  outcome "tests: kernel/engine suite" "$rc"
  echo >> "$tl"
  timeout --kill-after=15 $(( b * 2 / 5 )) $PY -m pytest -rs -p no:cacheprovider "${par[@]}" \
    --continue-on-collection-errors -m gpu "${marked[@]}" >> "$tl" 2>&1
  rc=$?
  echo "gpu-marked tests exit status: $rc" >> "$tl"
  outcome "tests: gpu-marked" "$rc"
  tail -n 25 "$tl" | tee -a "$LOG"
  cp "$tl" "$WORK/results/logs/gpu_tests.log"
  pack
}

group_headline() {
  bench headline "$(budget headline 200)" --suite memory,headline --catalog search-like --scale 19269255 \
    --suite-budgets memory=40
}
group_coldstart() {  # each shape: two fresh processes (cold, warm) with their own cache folder
  bench coldstart "$(budget coldstart 420)" --suite coldstart --catalog search-like --scale 19269255
}
group_contract() {  # numeric contract at scale: step-2 logits of full vs selective, and the band GEMM's cost
  bench contract "$(budget contract 150)" --suite ablation,steps --catalog search-like --scale 19269255 \
    --batch 1,32 --dtype fp16,bf16,fp32 --hidden 1024,1024,4096 --methods zerogr --suite-budgets ablation=60,steps=80
}
group_constraints() {  # per-request allow/deny lists and live catalog versions on 2e7 SIDs
  bench constraints "$(budget constraints 200)" --suite constraints,live --catalog search-like --scale 2e7
}
group_detail() {
  bench detail "$(budget detail 180)" --suite stages,ablation,steps,build,interference --catalog search-like \
    --scale 19269255 --build-repeats 1 --suite-budgets stages=30,ablation=25,steps=50,build=45,interference=30
}
group_watch() {
  bench watch "$(budget watch 120)" --suite memory,headline --catalog watch-like --scale 2e7 \
    --suite-budgets memory=40
}
group_beams() {
  bench beams "$(budget beams 180)" --suite beam-sweep --catalog synthetic-7 --scale 1e7 \
    --batch "${SWEEP_BATCHES:-1,32}" --beam "${SWEEP_BEAMS:-64,128,256}" --repeats 20
}
group_codebooks() {
  bench codebooks "$(budget codebooks 150)" --suite codebook-sweep --catalog synthetic-7 --scale 1e7 \
    --batch "${CODEBOOK_BATCHES:-32}" --codebook "${SWEEP_CODEBOOKS:-2048,4096,8192,16384}" --repeats 20
}
group_scale() {
  bench scale "$(budget scale 230)" --suite memory,headline,build --catalog search-like --scale "$BIG" \
    --batch 1,8,32 --build-repeats 1 --suite-budgets memory=120,build=60
}

group_e2e() {
  local b; b=$(budget e2e 300)
  if (( b < 30 )); then log "skip e2e: time budget spent"; return; fi
  local dir="e2e${RESULTS_TAG:+-$RESULTS_TAG}" q=()
  [[ "${BENCH_QUICK:-0}" == 1 ]] && q=(--quick)
  mkdir -p "$WORK/results/$dir"
  log "group e2e: budget ${b}s"
  timeout --signal=INT --kill-after=20 $(( b + 60 )) \
    $PY -m zerogr_core bench-e2e --out "$WORK/results/$dir" --budget-s "$b" "${q[@]}" \
      --model "${E2E_MODELS:-t5,decoder-only}" --catalog "${E2E_CATALOGS:-tiger,search}" \
      --batch "${E2E_BATCHES:-1,8,32}" --beam "${E2E_BEAMS:-32,128,256}" 2>&1 \
    | tee "$WORK/results/logs/$dir.log" | tee -a "$LOG" | tail -n 40
  outcome e2e "${PIPESTATUS[0]}"
  pack
  log "group e2e done"
}

module_group() {  # module_group GROUP DEFAULT_BUDGET TESTS -- COMMAND...: CUDA tests, then a python -m command
  local group=$1 b; b=$(budget "$1" "$2"); shift 2
  if (( b < 40 )); then log "skip $group: time budget spent"; return; fi
  local dir="$group${RESULTS_TAG:+-$RESULTS_TAG}" tests=()
  while [[ $# -gt 0 && "$1" != -- ]]; do tests+=("$1"); shift; done
  shift
  mkdir -p "$WORK/results/$dir"
  # the tests' share: a third of the group's budget unless BUDGET_<GROUP>_TESTS says otherwise
  local tvar="BUDGET_$(echo "$group" | tr 'a-z-' 'A-Z_')_TESTS"
  local tb=${!tvar:-$(( b / 3 ))}
  log "group $group: budget ${b}s (tests ${tb}s)"
  if (( ${#tests[@]} )); then
    { header; echo; } > "$WORK/results/$dir/tests.log"
    timeout --kill-after=15 "$tb" $PY -m pytest -q -rs -p no:cacheprovider "${tests[@]}" \
      >> "$WORK/results/$dir/tests.log" 2>&1
    local rc=$?
    echo "tests exit status: $rc" >> "$WORK/results/$dir/tests.log"
    outcome "$group: tests" "$rc"
    tail -n 4 "$WORK/results/$dir/tests.log" | tee -a "$LOG"
  fi
  local rest; rest=$(budget "$group" $(( b - tb )))
  timeout --signal=INT --kill-after=20 $(( rest + 30 )) "$@" "${OUTFLAG:---out}" "$WORK/results/$dir" 2>&1 \
    | tee "$WORK/results/$dir/run.log" | tail -n 40 | tee -a "$LOG"
  outcome "$group" "${PIPESTATUS[0]}"
  pack
  log "group $group done"
}
group_llm() {  # Qwen3-1.7B-shaped recommender: the SID-GR matrix, Hugging Face generate, bf16 agreement
  module_group llm 330 tests/test_qwen3.py tests/test_kernels_qk_norm_rope.py tests/test_kernels_swiglu.py \
    tests/test_kernels_beam_context_attention.py tests/test_kernels_fp8_rows.py tests/test_qwen3_fp8.py \
    tests/test_partial_last_step.py -- \
    $PY -m zerogr_core.bench.llm --budget-s "$(( $(budget llm 330) * 2 / 3 - 40 ))" ${LLM_ARGS:-}
}
group_serve_llm() {  # the Qwen3 server in-process: context 5,000, beam 256, 64 requests at concurrency 4
  module_group serve-llm 150 tests/test_serve_llm.py -- $PY -m zerogr_core.serve.llm_load_test
}
group_quality() {  # the Beauty quality study's clock (filtering first against scoring first, history denied)
  OUTFLAG=--results module_group quality 200 -m gpu tests/test_device_lists.py tests/test_constraint_api.py tests/test_constraints.py \
    tests/test_allow_nodes.py tests/test_deny_ids.py -- \
    $PY -m zerogr_core quality --dataset amazon-beauty --device cuda --batch-size 256
}

GROUPS_ALL=(tests headline coldstart contract constraints detail watch beams codebooks scale e2e llm serve_llm quality)
if (( $# )); then GROUPS_RUN=("$@"); else GROUPS_RUN=("${GROUPS_ALL[@]}"); fi
header | tee -a "$LOG"
log "groups: ${GROUPS_RUN[*]} | total budget ${TOTAL}s | results under $WORK, packed into $OUT"
for g in "${GROUPS_RUN[@]}"; do
  if ! declare -F "group_$g" > /dev/null; then log "unknown group '$g' (choose from ${GROUPS_ALL[*]})"; continue; fi
  if (( $(left) < 35 )); then log "skip $g: time budget spent"; continue; fi
  "group_$g"
done
pack
log "finished; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
echo
cat "$OUT/summary.txt"
if (( ${#FAILED[@]} )); then
  log "failed: ${FAILED[*]}"
  exit 1
fi
