#!/usr/bin/env bash
# Run the Entity Augmentation reproduction configs into runs/repro/ (add --quick for minutes).
# Then: python benchmarks/reproduce/entity_augmentation_report.py (writes docs/reproductions/entity-augmentation.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
# One thread per process: two processes with two threads each on two cores run many times slower.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
mkdir -p runs/repro
VFLO="${VFLO:-.venv/bin/vflo}"
DATA_DIR="${VFLO_DATA_DIR:-../shared/datasets}"
ALL="ea_table3_parkinsons ea_table3_handwritten ea_table4_mnist ea_table3_credit ea_table4_fashion"
for name in ${QUEUE:-$ALL}; do
  echo "== $name $(date -u +%H:%M:%S)"
  "$VFLO" -v run "configs/papers/$name.toml" --data-dir "$DATA_DIR" --out "runs/repro/$name" --overwrite \
    --no-progress "$@" 2> "runs/repro/$name.log"
done
echo "== done $(date -u +%H:%M:%S)"
