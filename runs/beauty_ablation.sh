#!/usr/bin/env bash
# The catalog-validity ablation on Amazon Beauty, cpu preset, on the CPU (run from the repository root).
# Trains the cpu recipe twice with the validity term and, as a plain reference under the same conditions,
# once more without it (CPU training is not bit-reproducible, so the repeats show the spread between runs);
# decodes 2,000 evenly spread test users with the shipped plain model-cpu.pt and the three new checkpoints
# (the committed results are of the previous cpu recipe, whose plain model is model-cpu-2epoch.pt; a rerun
# trains the current recipe, about 12 minutes per model)
# in both orders; writes runs/results/beauty-ablation.md from the four reports and the learning curves.
set -euo pipefail
PY=${PYTHON:-python}
D=sample_catalogs/amazon-beauty
R=runs/results/beauty-ablation
$PY -m zerogr_core train --dataset amazon-beauty --preset cpu --validity-weight 0.625 --device cpu --out $D/model-cpu-validity.pt
$PY -m zerogr_core train --dataset amazon-beauty --preset cpu --device cpu --out $D/model-cpu-rerun.pt
$PY -m zerogr_core train --dataset amazon-beauty --preset cpu --validity-weight 0.625 --device cpu --out $D/model-cpu-validity-rerun.pt
$PY -m zerogr_core quality --dataset amazon-beauty --checkpoint $D/model-cpu.pt --users 2000 --results $R
$PY -m zerogr_core quality --dataset amazon-beauty --checkpoint $D/model-cpu-rerun.pt --users 2000 --results $R/rerun
$PY -m zerogr_core quality --dataset amazon-beauty --checkpoint $D/model-cpu-validity.pt --users 2000 --results $R
$PY -m zerogr_core quality --dataset amazon-beauty --checkpoint $D/model-cpu-validity-rerun.pt --users 2000 --results $R/rerun
$PY -m zerogr_core.recsys.ablation
$PY -m zerogr_core.recsys.curves
