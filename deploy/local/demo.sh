#!/usr/bin/env bash
# The end-to-end demo on one machine: starts the local Spark Connect server,
# writes scikit-learn's bundled digits data set as CSV, runs the ETL in Spark,
# trains on 2 local agents with progress, prints test accuracy and predicts
# back into Spark (client/examples/train_digits.rs).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
export KINDLING_HOME="${KINDLING_HOME:-$HOME/.cache/kindling}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$KINDLING_HOME/target}"
"$HERE/setup.sh"
"$HERE/spark-connect.sh" start
DATA="$KINDLING_HOME/data/digits"
"$KINDLING_HOME/venv/bin/python" "$HERE/make_digits.py" "$DATA"
cd "$ROOT"
cargo run --quiet -p kindling --example train_digits -- "sc://127.0.0.1:${KINDLING_SPARK_PORT:-15002}" "$DATA"
