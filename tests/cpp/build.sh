#!/usr/bin/env bash
# Builds tests/cpp/flight_contract.cc against the Arrow C++ Flight client that
# the pyarrow wheel ships (its headers and libarrow/libarrow_flight), so no
# other download is needed.
#
#   tests/cpp/build.sh <python> <output binary>
#
# <python> is an interpreter with pyarrow (the venv of
# deploy/local/spark-connect.sh install). The binary's rpath points at the
# wheel's libraries. Rebuilds only when the source or pyarrow changed.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${1:?usage: build.sh <python> <output binary>}"
OUT="${2:?usage: build.sh <python> <output binary>}"
SRC="$HERE/flight_contract.cc"

read -r INCLUDE LIBDIR VERSION < <("$PY" -c '
import pyarrow as pa
print(pa.get_include(), pa.get_library_dirs()[0], pa.__version__)')

# The wheel ships versioned names only (libarrow.so.2600): link them by name.
lib() {
  local found
  # The shortest name: libarrow.so.2600 rather than libarrow.so.2600.1.0.
  found="$(cd "$LIBDIR" && ls "lib$1.so".* 2>/dev/null | awk '{ print length($0), $0 }' | sort -n | head -n 1 | cut -d' ' -f2)"
  [ -n "$found" ] || { echo "build.sh: no lib$1.so.* in $LIBDIR" >&2; exit 1; }
  echo "-l:$found"
}

STAMP="$OUT.stamp"
WANT="$(sha256sum "$SRC" "$0" | sha256sum | cut -d' ' -f1) $VERSION $LIBDIR"
if [ -x "$OUT" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi
mkdir -p "$(dirname "$OUT")"
CXX="${CXX:-g++}"
command -v "$CXX" >/dev/null || { echo "build.sh: $CXX not found (deploy/local/setup.sh installs g++)" >&2; exit 1; }
"$CXX" -std=c++20 -O1 -Wall -Wno-deprecated-declarations -I"$INCLUDE" "$SRC" -o "$OUT.tmp" \
  -L"$LIBDIR" "$(lib arrow_flight)" "$(lib arrow)" -Wl,-rpath,"$LIBDIR" -pthread
mv "$OUT.tmp" "$OUT"
echo "$WANT" > "$STAMP"
