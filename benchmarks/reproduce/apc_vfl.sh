#!/usr/bin/env bash
# Run every APC-VFL reproduction config into runs/repro/ (hours on 2 cores; pass --quick for minutes).
# Then: python benchmarks/reproduce/apc_vfl_report.py  (writes docs/reproductions/apc-vfl.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
VFLO="${VFLO:-.venv/bin/vflo}"
DATA_DIR="${VFLO_DATA_DIR:-../shared/datasets}"
EXTRA=("$@")
for name in apc_vfl_table2_breast apc_vfl_fig5_breast apc_vfl_heldout_breast apc_vfl_table2_credit \
            apc_vfl_fig5_credit apc_vfl_heldout_credit apc_vfl_fig16_credit apc_vfl_table2_mimic_standin \
            apc_vfl_fig5_mimic_standin; do
  echo "== $name $(date -u +%H:%M:%S)"
  "$VFLO" run "configs/papers/$name.toml" --data-dir "$DATA_DIR" --out "runs/repro/$name" --overwrite \
    --no-progress "${EXTRA[@]}"
done
echo "== done $(date -u +%H:%M:%S)"
