#!/usr/bin/env bash
# Run the APC-VFL reproduction configs into runs/repro/ (hours on 2 cores; add --quick for minutes).
#   benchmarks/reproduce/apc_vfl.sh [--quick]          every config, one after another
#   QUEUE="name name ..." benchmarks/reproduce/apc_vfl.sh   only those configs (e.g. two queues side by side)
# Then: python -m benchmarks.reproduce.apc_vfl_report  (writes docs/reproductions/apc-vfl.md)
source "$(dirname "$0")/queue.sh"
ALL="apc_vfl_table2_breast apc_vfl_fig5_breast apc_vfl_heldout_breast apc_vfl_table2_credit apc_vfl_fig5_credit
     apc_vfl_heldout_credit apc_vfl_fig16_credit apc_vfl_table2_mimic_standin apc_vfl_fig5_mimic_standin"
run_queue "$@"
