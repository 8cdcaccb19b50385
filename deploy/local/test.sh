#!/usr/bin/env bash
# Runs every test against real parts: installs prerequisites, starts the local
# Spark Connect server (reused if running), runs the workspace's tests.
# Extra arguments go to cargo test.
# --under-load (first argument) builds first, then runs every test while a
# busy loop per core keeps the machine's cores taken (deploy/local/load.sh):
# a test that waits on time rather than on its event fails there. Run it
# for a new test before it lands.
# KINDLING_GPU_TESTS=1 also builds the agent with the `gpu-wgsl` feature
# (burn's wgpu runtime with WGSL kernels, ~7 more minutes of build on 2 cores) and trains
# on the wgpu device: a real GPU, or Mesa's software Vulkan device (lavapipe),
# which setup.sh then installs and which crashes on the SPIR-V kernels of
# `gpu` (.ci/run lints that build).
set -euo pipefail
under_load=0
if [ "${1:-}" = "--under-load" ]; then
  under_load=1
  shift
fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
export KINDLING_HOME="${KINDLING_HOME:-$HOME/.cache/kindling}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$KINDLING_HOME/target}"
export KINDLING_PYTHON_BIN="$KINDLING_HOME/venv/bin/python"
# The tracking test runs a real MLflow server: setup.sh installs it.
KINDLING_MLFLOW=1 "$HERE/setup.sh"
"$HERE/spark-connect.sh" start
cd "$ROOT"
# Every library, binary and test target, then the doc tests. The examples
# are linted (`.ci/run`: clippy --all-targets) but not linked here: each
# links burn, arrow and tonic again (~40 s apiece on 2 cores) and none is a
# test. The tests are gathered in a few test binaries (tests/tests/main.rs,
# client/tests/main.rs, examples/custom-agent/tests/main.rs) for the same
# reason.
run=()
if [ "$under_load" = 1 ]; then
  cargo test --workspace --lib --bins --tests --no-run "$@"
  run=("$HERE/load.sh")
fi
"${run[@]}" cargo test --workspace --lib --bins --tests "$@"
"${run[@]}" cargo test --workspace --doc "$@"
if [ "${KINDLING_GPU_TESTS:-0}" = 1 ]; then
  # The test checks accuracy, not speed: cubecl's autotune at its minimal
  # level compiles and times fewer kernel variants, which on Mesa's software
  # Vulkan device (no shader cache yet on a new machine) took minutes.
  CUBECL_AUTOTUNE_LEVEL="${CUBECL_AUTOTUNE_LEVEL:-minimal}" \
    "${run[@]}" cargo test -p kindling-agent --features gpu-wgsl --test gpu_training
fi
