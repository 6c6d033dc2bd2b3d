#!/usr/bin/env bash
# The catalog-validity ablation on Amazon Beauty, cpu preset, on the CPU (run from the repository root).
# Trains the cpu recipe with the validity term and, as a plain reference under the same conditions, once
# more without it; decodes 2,000 evenly spread test users with the shipped plain model-cpu.pt and both
# new checkpoints in both orders; writes bench/results/beauty-ablation.md from the three reports.
set -euo pipefail
PY=${PYTHON:-python}
D=sample_catalogs/amazon-beauty
R=bench/results/beauty-ablation
$PY -m zerogr_core train --dataset amazon-beauty --preset cpu --validity-weight 0.625 --device cpu --out $D/model-cpu-validity.pt
$PY -m zerogr_core train --dataset amazon-beauty --preset cpu --device cpu --out $D/model-cpu-rerun.pt
$PY -m zerogr_core quality --dataset amazon-beauty --checkpoint $D/model-cpu.pt --users 2000 --results $R
$PY -m zerogr_core quality --dataset amazon-beauty --checkpoint $D/model-cpu-rerun.pt --users 2000 --results $R/rerun
$PY -m zerogr_core quality --dataset amazon-beauty --checkpoint $D/model-cpu-validity.pt --users 2000 --results $R
$PY -m zerogr_core.recsys.ablation
