#!/usr/bin/env bash
# Runs every test against real parts: installs prerequisites, starts the local
# Spark Connect server (reused if running), runs `cargo test --workspace`.
# Extra arguments go to cargo test.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
export KINDLING_HOME="${KINDLING_HOME:-$HOME/.cache/kindling}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$KINDLING_HOME/target}"
export KINDLING_PYTHON_BIN="$KINDLING_HOME/venv/bin/python"
"$HERE/setup.sh"
"$HERE/spark-connect.sh" start
cd "$ROOT"
cargo test --workspace "$@"
