#!/usr/bin/env bash
# Run the Entity Augmentation reproduction configs into runs/repro/ (add --quick for minutes).
# Then: python -m benchmarks.reproduce.entity_augmentation_report (writes docs/reproductions/entity-augmentation.md)
source "$(dirname "$0")/queue.sh"
ALL="ea_table3_parkinsons ea_table3_handwritten ea_table4_mnist ea_table3_credit ea_table4_fashion"
run_queue "$@"
