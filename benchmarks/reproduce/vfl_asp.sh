#!/usr/bin/env bash
# Run the VFL-ASP reproduction configs and the Table 4 ablation into runs/repro/ (add --quick for minutes).
# One thread per process by default: these networks are small, and two processes with two threads each on
# two cores run many times slower than with one.
# Then: python -m benchmarks.reproduce.vfl_asp_report (writes docs/reproductions/vfl-asp.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
VFLO="${VFLO:-.venv/bin/vflo}"
PYTHON="${PYTHON:-.venv/bin/python}"
DATA_DIR="${VFLO_DATA_DIR:-../shared/datasets}"
ALL="vfl_asp_table2_breast vfl_asp_table2_breast_raw vfl_asp_table3_breast vfl_asp_ablation_breast vfl_asp_fig5_breast vfl_asp_fig6_breast
     vfl_asp_table2_credit vfl_asp_table3_credit vfl_asp_ablation_credit
     vfl_asp_table2_mimic_standin vfl_asp_table3_mimic_standin vfl_asp_ablation_mimic_standin"
mkdir -p runs/repro
for name in ${QUEUE:-$ALL}; do
  echo "== $name $(date -u +%H:%M:%S)"
  case "$name" in
    vfl_asp_ablation_*)
      "$PYTHON" -m benchmarks.reproduce.vfl_asp_ablation "configs/papers/${name/ablation/table2}.toml" \
        --data-dir "$DATA_DIR" --out "runs/repro/$name" "$@" 2> "runs/repro/$name.log" ;;
    *)
      "$VFLO" -v run "configs/papers/$name.toml" --data-dir "$DATA_DIR" --out "runs/repro/$name" --overwrite \
        --no-progress "$@" 2> "runs/repro/$name.log" ;;
  esac
done
echo "== done $(date -u +%H:%M:%S)"
