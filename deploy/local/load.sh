#!/usr/bin/env bash
# A CPU load generator for testing under load: one busy loop per core (or
# KINDLING_LOAD_PROCS), so that the test suite runs on a machine whose cores
# are all taken, as CI's are when other work runs beside it. It runs the
# command given and stops its loops when the command ends, whatever way:
#   deploy/local/load.sh cargo test -p kindling-tests
# exits with the command's status. test.sh --under-load uses it.
set -euo pipefail
procs="${KINDLING_LOAD_PROCS:-$(nproc)}"
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
}
trap stop EXIT
for _ in $(seq "$procs"); do
  # At nice 0: each loop takes a core's fair share, as another job would.
  ( exec bash -c 'while :; do :; done' ) &
  pids+=("$!")
done
echo "load: $procs busy loop(s) (pids ${pids[*]}) while: $*" >&2
rc=0
"$@" || rc=$?
exit "$rc"
