#!/usr/bin/env bash
# The end-to-end demo on one machine: starts the local Spark Connect server,
# writes scikit-learn's bundled digits data set as CSV, runs the ETL in Spark,
# trains on 2 local agents with progress, prints test accuracy and predicts
# back into Spark (examples/digits/src/main.rs).
#
# The example compiles while the rest is set up: only what the build needs
# (protoc, a C compiler) is installed before cargo starts; Java, the Spark
# virtualenv, the Spark server and the data follow beside the build, whose
# output goes to $KINDLING_HOME/demo-build.log (shown if it fails).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
export KINDLING_HOME="${KINDLING_HOME:-$HOME/.cache/kindling}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$KINDLING_HOME/target}"
"$HERE/setup.sh" build
mkdir -p "$KINDLING_HOME"
BUILD_LOG="$KINDLING_HOME/demo-build.log"
echo "[demo] compiling the example in the background (log: $BUILD_LOG)" >&2
(cd "$ROOT" && cargo build -p kindling-example-digits) > "$BUILD_LOG" 2>&1 &
build=$!
# A failed set-up stops the build too.
trap 'kill "$build" 2>/dev/null || true' EXIT
"$HERE/setup.sh" demo
"$HERE/spark-connect.sh" start
DATA="$KINDLING_HOME/data/digits"
"$KINDLING_HOME/venv/bin/python" "$HERE/make_digits.py" "$DATA"
if ! wait "$build"; then
  tail -40 "$BUILD_LOG" >&2
  echo "[demo] the build failed (whole log: $BUILD_LOG)" >&2
  exit 1
fi
trap - EXIT
cd "$ROOT"
cargo run --quiet -p kindling-example-digits -- "sc://127.0.0.1:${KINDLING_SPARK_PORT:-15002}" "$DATA"
