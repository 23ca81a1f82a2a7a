#!/usr/bin/env bash
# Run the VFL-ASP reproduction configs and the Table 4 ablation into runs/repro/ (add --quick for minutes).
# Then: python -m benchmarks.reproduce.vfl_asp_report (writes docs/reproductions/vfl-asp.md)
source "$(dirname "$0")/queue.sh"
ALL="vfl_asp_table2_breast vfl_asp_table2_breast_raw vfl_asp_table2_breast_authors vfl_asp_table2_breast_authors_scaled vfl_asp_table3_breast vfl_asp_ablation_breast vfl_asp_fig5_breast vfl_asp_fig6_breast
     vfl_asp_table2_credit vfl_asp_table3_credit vfl_asp_ablation_credit
     vfl_asp_table2_mimic_standin vfl_asp_table3_mimic_standin vfl_asp_ablation_mimic_standin"
# The ablation entries are a script over the matching Table 2 config, not a config of their own.
run_one() {
  local name="$1"
  shift
  case "$name" in
    vfl_asp_ablation_*)
      "$PYTHON" -m benchmarks.reproduce.vfl_asp_ablation "configs/papers/${name/ablation/table2}.toml" \
        --data-dir "$DATA_DIR" --out "$OUT_ROOT/$name" "$@" 2> "$OUT_ROOT/$name.log" ;;
    *) run_config "$name" "$@" ;;
  esac
}
run_queue "$@"
