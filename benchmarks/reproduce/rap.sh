#!/usr/bin/env bash
# Run the RAP reproduction configs into runs/repro/ (add --quick for minutes).
# Then: python -m benchmarks.reproduce.rap_report (writes docs/reproductions/rap.md)
source "$(dirname "$0")/queue.sh"
ALL="rap_table3_breast rap_table3_credit rap_table3_woc rap_table3_susy rap_table3_higgs rap_table3_covertype
     rap_table3_houseprice rap_table3_yearprediction rap_clients_susy rap_clients_yearprediction
     rap_onefeature_susy rap_onefeature_yearprediction"
run_queue "$@"
