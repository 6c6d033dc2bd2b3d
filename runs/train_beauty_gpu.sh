#!/usr/bin/env bash
# The `tiger` recipe on Amazon Beauty, its whole schedule (200 epochs, early stopping), trained on the lent
# H200 across several device calls of at most 10 minutes each; then the quality report of the result.
#
# Each call trains for at most CALL_MINUTES (default 9) and saves the training state (`train --state`, the
# model, AdamW, RNG states, history, best weights; ~75 MB for this 4.6 M-parameter T5) in STATE_DIR; the
# next call resumes it (`--resume`). The learning rate is a function of the global step (and of the training
# time summed over calls when TOTAL_MINUTES is set), so the split run follows one uninterrupted run's
# schedule. Once training has ended (200 epochs, or patience 4), STATE_DIR/model.pt is the final checkpoint
# (best validation weights) and the script runs
#   quality --dataset amazon-beauty --checkpoint model.pt --device cuda --batch-size 256 --json
# when QUALITY_MIN_S seconds are still left in the call, else on the next call.
#
# Where the state lives between calls. STATE_DIR (default train_state/, ignored by git) is an ignored path
# of the working tree, which the device tool keeps on the device machine between calls while that machine
# stays warm (same session, not given back, idle less than its release time, held under 30 minutes). The
# state cannot travel back from this machine: the working tree that travels (tracked files, ~58 MiB with
# the bundled data and checkpoints, plus `carry`) is limited to 64 MiB, and files back from $OUT to 8 files
# of at most 16 MiB, 64 MiB together. So the schedule must finish on one warm machine, i.e. in one session
# (its 30 minutes of device time): at ~10 s per FP32 epoch 200 epochs take ~35 minutes, so count on
# early stopping, or set TOTAL_MINUTES (e.g. 24) to fit the cosine into a budget summed over the calls. What does come back in $OUT after every call (at most 6 files):
#   train.log                        the log of every call so far (the learning curve, epoch by epoch)
#   model.pt.part-aa, -ab            the final checkpoint in 12 MiB parts, once training has ended
#   SHA256SUMS                       sha256 of every whole file split into parts
#   quality-amazon-beauty-<preset>[-validity<W>].json  the quality report, once it has run
# Re-join the checkpoint here:  cat FILES_AT/model.pt.part-* > sample_catalogs/amazon-beauty/model.pt
# (and check it against SHA256SUMS). PARTS_DIR names a folder of such parts (`NAME.part-*` plus SHA256SUMS,
# e.g. state.pt or model.pt of a smaller preset) that is joined into STATE_DIR before anything else; it
# travels with `carry`, which shares the 64 MiB with the tracked tree: nothing of this model's size fits
# today (~6 MiB are left). If the machine is lost after training ended but before quality ran, run quality
# here on the re-joined checkpoint (the command below with --device cpu; the shipped report was decoded so).
#
# How the coordinator runs it (device tool `run`, kind nvidia-h200, timeout_s 600), one session, calls back
# to back so that the machine stays warm (no `carry` needed: the script and data are tracked):
#   call 1:  FRESH=1 OUT=$OUT bash runs/train_beauty_gpu.sh     # starts the schedule (discards a state)
#   call 2…: OUT=$OUT bash runs/train_beauty_gpu.sh              # resumes; refuses if the state is gone
# A session has 30 minutes of device time, machine start included. The `tiger` preset carries its own
# 12.5-minute budget (the cosine anneals within it); with GRAPH=1 an epoch takes ~5.8 s on the H200 (9.7 s
# eager FP32/TF32, 14.7 s under bf16 autocast: the steps of this 4.6 M-parameter model are bound by kernel
# launches), so the shipped model took two calls: GRAPH=1 FRESH=1 CALL_MINUTES=8.6, then GRAPH=1 (resume,
# 3.9 minutes of training, then quality). TOTAL_MINUTES overrides the budget; like every option it cannot
# change after call 1 (a state is refused by a call with other options).
# Repeat the second form until the output says "quality written" (a call that ends training may leave the
# quality run to the next call). Then, here: copy FILES_AT/train.log to runs/results/logs/beauty-train-tiger.log,
# re-join model.pt into sample_catalogs/amazon-beauty/model.pt, copy the report to runs/results/, and run
# `python -m zerogr_core.recsys.curves` for the learning curves.
#
# Environment:
#   OUT            folder whose files come back (default ./gpu_out)
#   STATE_DIR      where the state, the final checkpoint and the cumulative log live (default ./train_state)
#   PARTS_DIR      folder of `NAME.part-*` files (plus SHA256SUMS) to join into STATE_DIR first (optional)
#   FRESH=1        start the schedule afresh (discarding STATE_DIR's state and checkpoint); without it a
#                  call resumes and refuses to start when no state is there
#   CALL_MINUTES   training minutes of this call (default 9; the call limit is 10)
#   CALL_LIMIT_S   seconds this script may use in all (default 585): the quality run gets what is left
#   QUALITY_MIN_S  run quality only with at least this many seconds left (default 240)
#   TOTAL_MINUTES  wall-clock budget of the whole schedule over every call (--max-minutes; default: none,
#                  the preset's 200 epochs with early stopping)
#   AMP            autocast of the training passes: bf16, or empty (the default: FP32 with TF32 matmuls;
#                  on the H200 a bf16 epoch took 14.7 s against 9.7 s, runs/results/beauty-tiger-bf16/)
#   COMPILE=1      train with `--compile` (torch.compile of each batch at one static shape; not yet timed on
#                  a GPU: time it first, e.g. `train --preset tiger --max-minutes 1.5 --compile` against the same
#                  without it, and compare the epoch seconds in the two logs)
#   PRESET         training preset (default tiger; tiger-paper is TIGER's schedule, 390 epochs at batch 256)
#   GRAPH=1        train with `--cuda-graph` (each full batch's step captured once in a CUDA graph and
#                  replayed; the eager step launches ~2,600 operators from Python)
#   EXTRA_ARGS     more `train` arguments (e.g. "--validity-weight 0.625"); keep them the same on every call
#   PYTHON         interpreter (default python3)
#   PART_SIZE      size of the parts files are split into (default 12M, `split -b` syntax)
#   DRY_RUN=1      check this script on a CPU: the `tiny` preset on the sequence file DRY_DATA, no CUDA
#                  (tests/test_train_resume.py runs it so)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/gpu_out}
STATE_DIR=${STATE_DIR:-$ROOT/train_state}
CALL_MINUTES=${CALL_MINUTES:-9}
CALL_LIMIT_S=${CALL_LIMIT_S:-585}
QUALITY_MIN_S=${QUALITY_MIN_S:-240}
AMP=${AMP-}
PART_SIZE=${PART_SIZE:-12M}
mkdir -p "$OUT" "$STATE_DIR"
export PYTHONUNBUFFERED=1
source "$ROOT/runs/checkout_env.sh"   # zerogr_kernels from this checkout, Triton cache
LOG="$STATE_DIR/train.log"
log() { echo "[train_beauty_gpu $(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$LOG"; }

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  DATA=(--data "${DRY_DATA:?DRY_RUN=1 needs DRY_DATA, a sequence file}"); PRESET=tiny; DEVICE=cpu; AMP=""
  QUALITY_DATA=(--data "$DRY_DATA"); QUALITY_ARGS=(--beam 20 --users 20)
else
  DATA=(--dataset amazon-beauty); PRESET=${PRESET:-tiger}; DEVICE=cuda
  QUALITY_DATA=(--dataset amazon-beauty); QUALITY_ARGS=(--batch-size 256)
fi
STATE="$STATE_DIR/state.pt"
MODEL="$STATE_DIR/model.pt"

join_parts() {  # join_parts DIR: every NAME.part-* in DIR becomes STATE_DIR/NAME, checked against DIR/SHA256SUMS
  local dir=$1 first name
  for first in "$dir"/*.part-aa; do
    [[ -e "$first" ]] || continue
    name=$(basename "$first" .part-aa)
    cat "$dir/$name".part-* > "$STATE_DIR/$name.tmp" || return 1
    if [[ -f "$dir/SHA256SUMS" ]] && grep -q " $name\$" "$dir/SHA256SUMS"; then
      local want got
      want=$(grep " $name\$" "$dir/SHA256SUMS" | cut -d' ' -f1)
      got=$(sha256sum "$STATE_DIR/$name.tmp" | cut -d' ' -f1)
      if [[ "$want" != "$got" ]]; then
        log "error: $dir/$name.part-*: joined sha256 $got differs from SHA256SUMS ($want); parts missing or mixed"
        rm -f "$STATE_DIR/$name.tmp"; return 1
      fi
    fi
    mv -f "$STATE_DIR/$name.tmp" "$STATE_DIR/$name"
    log "joined $dir/$name.part-* into $STATE_DIR/$name"
  done
}
split_out() {  # split_out FILE: FILE in PART_SIZE parts under $OUT, its sha256 in $OUT/SHA256SUMS
  local file=$1 name
  name=$(basename "$file")
  rm -f "$OUT/$name".part-*
  split -b "$PART_SIZE" "$file" "$OUT/$name.part-"
  (cd "$(dirname "$file")" && sha256sum "$name") >> "$OUT/SHA256SUMS"
}

if [[ -n "${PARTS_DIR:-}" ]]; then join_parts "$PARTS_DIR" || exit 4; fi
if [[ "${FRESH:-0}" == 1 ]]; then
  rm -f "$STATE" "$MODEL" "$LOG" "$STATE_DIR"/quality-*.json
  log "starting the schedule afresh in $STATE_DIR"
fi
rm -f "$OUT/SHA256SUMS"

TRAIN_RC=0
if [[ ! -f "$MODEL" ]]; then
  RESUME=()
  if [[ -f "$STATE" ]]; then
    RESUME=(--resume)
  elif [[ "${FRESH:-0}" != 1 ]]; then
    log "error: no training state in $STATE (the device machine was given back, or this is the first call);" \
        "FRESH=1 starts the schedule afresh"
    cp -f "$LOG" "$OUT/train.log"
    exit 3
  fi
  ARGS=(train "${DATA[@]}" --preset "$PRESET" --device "$DEVICE" --out "$MODEL" --state "$STATE"
        --stop-after-minutes "$CALL_MINUTES")
  [[ -n "$AMP" ]] && ARGS+=(--amp "$AMP")
  [[ "${COMPILE:-0}" == 1 ]] && ARGS+=(--compile)
  [[ "${GRAPH:-0}" == 1 ]] && ARGS+=(--cuda-graph)
  [[ -n "${TOTAL_MINUTES:-}" ]] && ARGS+=(--max-minutes "$TOTAL_MINUTES")
  # shellcheck disable=SC2206
  [[ -n "${EXTRA_ARGS:-}" ]] && ARGS+=($EXTRA_ARGS)
  ARGS+=("${RESUME[@]}")
  log "python -m zerogr_core ${ARGS[*]}"
  $PY -m zerogr_core "${ARGS[@]}" 2>&1 | tee -a "$LOG"
  TRAIN_RC=${PIPESTATUS[0]}
  log "train exited with $TRAIN_RC"
fi

if [[ -f "$MODEL" ]]; then
  split_out "$MODEL"
  # quality names its report after the data, the preset and a validity weight (quality --help)
  report() { compgen -G "$STATE_DIR/quality-*.json" | head -n 1; }
  REPORT=$(report)
  if [[ -n "$REPORT" ]]; then
    log "quality already written: $REPORT"
  elif (( CALL_LIMIT_S - SECONDS >= QUALITY_MIN_S )); then
    log "quality on the final checkpoint ($(( CALL_LIMIT_S - SECONDS )) s left)"
    timeout $(( CALL_LIMIT_S - SECONDS )) $PY -m zerogr_core quality "${QUALITY_DATA[@]}" --checkpoint "$MODEL" \
      --device "$DEVICE" "${QUALITY_ARGS[@]}" --json --results "$STATE_DIR" > "$STATE_DIR/quality.stdout" 2>&1
    QRC=$?
    REPORT=$(report)
    if [[ $QRC == 0 && -n "$REPORT" ]]; then log "quality written: $(basename "$REPORT")"
    else
      tail -n 3 "$STATE_DIR/quality.stdout" | tee -a "$LOG"
      log "quality did not finish (exit $QRC); run this script again for it"; [[ -n "$REPORT" ]] && rm -f "$REPORT"
      REPORT=""
    fi
  else
    log "training has ended; $(( CALL_LIMIT_S - SECONDS )) s left, under QUALITY_MIN_S: run this script again for quality"
  fi
  [[ -n "$REPORT" ]] && cp -f "$REPORT" "$OUT/"
fi
cp -f "$LOG" "$OUT/train.log"
exit "$TRAIN_RC"
