#!/usr/bin/env bash
# Run the RAP reproduction configs into runs/repro/ (add --quick for minutes).
# Then: python -m benchmarks.reproduce.rap_report (writes docs/reproductions/rap.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
# One thread per process: two processes with two threads each on two cores run many times slower.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
mkdir -p runs/repro
VFLO="${VFLO:-.venv/bin/vflo}"
DATA_DIR="${VFLO_DATA_DIR:-../shared/datasets}"
ALL="rap_table3_breast rap_table3_credit rap_table3_woc rap_table3_susy rap_table3_higgs rap_table3_covertype
     rap_table3_houseprice rap_table3_yearprediction rap_clients_susy rap_clients_yearprediction
     rap_onefeature_susy rap_onefeature_yearprediction"
for name in ${QUEUE:-$ALL}; do
  echo "== $name $(date -u +%H:%M:%S)"
  "$VFLO" -v run "configs/papers/$name.toml" --data-dir "$DATA_DIR" --out "runs/repro/$name" --overwrite \
    --no-progress "$@" 2> "runs/repro/$name.log"
done
echo "== done $(date -u +%H:%M:%S)"
