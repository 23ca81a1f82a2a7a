# Shared by the reproduction scripts: source it, set ALL, then call run_queue "$@".
# QUEUE="name name ..." runs only those configs. One thread per process by default: these networks are
# small, and two processes with two threads each on two cores run many times slower than with one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
VFLO="${VFLO:-.venv/bin/vflo}"
PYTHON="${PYTHON:-.venv/bin/python}"
DATA_DIR="${VFLO_DATA_DIR:-../shared/datasets}"
# OUT_ROOT=runs/repro_quick keeps a --quick check apart from the full runs the reports read.
OUT_ROOT="${OUT_ROOT:-runs/repro}"
mkdir -p "$OUT_ROOT"

# One config into OUT_ROOT/NAME, its log beside it in OUT_ROOT/NAME.log, and in OUT_ROOT/NAME.commit the commit
# of the code that ran it ("+changes" where src/ differed from it), for the page made from it.
run_config() {
  local name="$1"
  shift
  local ran
  ran="$("$PYTHON" -c 'from benchmarks.compare_all import commit; print(commit())')"
  "$VFLO" -v run "configs/papers/$name.toml" --data-dir "$DATA_DIR" --out "$OUT_ROOT/$name" --overwrite \
    --no-progress "$@" 2> "$OUT_ROOT/$name.log"
  echo "$ran" > "$OUT_ROOT/$name.commit"
}

# A script may redefine run_one for entries that are not plain configs.
run_one() { run_config "$@"; }

run_queue() {
  for name in ${QUEUE:-$ALL}; do
    echo "== $name $(date -u +%H:%M:%S)"
    run_one "$name" "$@"
  done
  echo "== done $(date -u +%H:%M:%S)"
}
