#!/usr/bin/env bash
# Run the LASER-VFL reproduction configs into runs/repro/ (add --quick for minutes): Credit as the paper ran it,
# and digits and wine, which no paper here used. The authors' code on the same Credit splits is a separate step.
# Then: python -m benchmarks.reproduce.laser_vfl_report (writes docs/reproductions/laser-vfl.md)
source "$(dirname "$0")/queue.sh"
ALL="laser_vfl_wine laser_vfl_digits laser_vfl_credit"
run_queue "$@"
