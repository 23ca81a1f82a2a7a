#!/usr/bin/env bash
# Run the APC-VFL reproduction configs into runs/repro/ (hours on 2 cores; add --quick for minutes).
#   benchmarks/reproduce/apc_vfl.sh [--quick]          every config, one after another
#   QUEUE="name name ..." benchmarks/reproduce/apc_vfl.sh   only those configs (e.g. two queues side by side,
#                                                      each with OMP_NUM_THREADS=1)
# Then: python benchmarks/reproduce/apc_vfl_report.py  (writes docs/reproductions/apc-vfl.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
VFLO="${VFLO:-.venv/bin/vflo}"
DATA_DIR="${VFLO_DATA_DIR:-../shared/datasets}"
ALL="apc_vfl_table2_breast apc_vfl_fig5_breast apc_vfl_heldout_breast apc_vfl_table2_credit apc_vfl_fig5_credit
     apc_vfl_heldout_credit apc_vfl_fig16_credit apc_vfl_table2_mimic_standin apc_vfl_fig5_mimic_standin"
for name in ${QUEUE:-$ALL}; do
  echo "== $name $(date -u +%H:%M:%S)"
  "$VFLO" run "configs/papers/$name.toml" --data-dir "$DATA_DIR" --out "runs/repro/$name" --overwrite \
    --no-progress "$@"
done
echo "== done $(date -u +%H:%M:%S)"
