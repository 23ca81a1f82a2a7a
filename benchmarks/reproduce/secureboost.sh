#!/usr/bin/env bash
# Run the SecureBoost reproduction config into runs/repro/ (add --quick for minutes): Credit with the bureau
# holding 10 % or 50 % of the bank's people. The lossless check, the speed and the scoring figures are
# benchmarks/secureboost.py's (runs/bench/secureboost.json).
# Then: python -m benchmarks.reproduce.secureboost_report (writes docs/reproductions/secureboost.md)
source "$(dirname "$0")/queue.sh"
ALL="secureboost_credit"
run_queue "$@"
