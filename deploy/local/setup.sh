#!/usr/bin/env bash
# Installs what Kindling needs on a fresh Debian/Ubuntu machine, in three
# levels (the argument; default `all`):
#   build  what `cargo build` needs: protoc (the Spark Connect crates generate
#          code at build time) and a C compiler (ring) — seconds, so a build
#          can start while the rest installs;
#   demo   + Java 17 for Spark and the pinned pyspark/pyarrow virtualenv;
#   all    + g++ (the C++ Flight contract check builds against the pyarrow
#          wheel's Arrow C++), Prometheus (the metrics test scrapes a local
#          cluster with it), Chromium (the status page test), etcd (the
#          replicated rendezvous' tests start a 3-member cluster), the Python
#          package deploy/python (kindling-client) into that venv, and with
#          KINDLING_MLFLOW=1 MLflow in a venv of its own (the tracking test
#          runs a real MLflow server).
# Idempotent; quiet when all is present.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

LEVEL="${1:-all}"
case "$LEVEL" in build|demo|all) ;; *) echo "usage: $0 [build|demo|all]" >&2; exit 2 ;; esac

missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
if [ "$LEVEL" != build ]; then
  command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
  command -v flock >/dev/null 2>&1 || missing+=(util-linux)
fi
if [ "$LEVEL" = all ]; then
  command -v g++ >/dev/null 2>&1 || missing+=(g++)
  # The metrics test scrapes a local cluster with a real Prometheus server.
  command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
  # The status page test renders the rendezvous' page in headless Chromium.
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  # The replicated rendezvous' tests run a real 3-member etcd cluster.
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
  # The GPU tests run burn-wgpu on Mesa's software Vulkan device (lavapipe).
  if [ "${KINDLING_GPU_TESTS:-0}" = 1 ]; then
    compgen -G '/usr/share/vulkan/icd.d/lvp_icd.*.json' >/dev/null || missing+=(mesa-vulkan-drivers)
    compgen -G '/usr/lib/*/libvulkan.so.1' >/dev/null || missing+=(libvulkan1)
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "[setup] Rust (cargo) is required: https://rustup.rs" >&2; exit 1; }
[ "$LEVEL" = build ] && exit 0
"$HERE/spark-connect.sh" install
[ "$LEVEL" = demo ] && exit 0

# The Python client package, from a copy of its sources (the build writes
# nothing into the work tree), without network or build isolation: pyarrow,
# setuptools and wheel come from the venv's requirements. Reinstalled only
# when its sources changed.
VENV="${KINDLING_HOME:-$HOME/.cache/kindling}/venv"
PKG="$(cd "$HERE/../python" && pwd)"
want="$(cd "$PKG" && find . -name build -prune -o -name '*.egg-info' -prune -o -name __pycache__ -prune \
  -o -type f -print | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
stamp="$VENV/.kindling-client"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$VENV/bin/python" -c 'import kindling_client' 2>/dev/null; then
  echo "[setup] installing deploy/python (kindling-client) into $VENV" >&2
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$PKG" && tar --exclude=build --exclude='*.egg-info' --exclude=__pycache__ -cf - .) | tar -xf - -C "$tmp"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation --no-index "$tmp"
  echo "$want" > "$stamp"
fi

# MLflow for the tracking test's real server (KINDLING_MLFLOW=1, as
# test.sh sets it; the demo needs none), in its own venv: MLflow pins a
# pyarrow of its own. Reinstalled only when its requirements change.
MLFLOW_VENV="${KINDLING_HOME:-$HOME/.cache/kindling}/mlflow"
if [ "${KINDLING_MLFLOW:-0}" = 1 ] && { [ ! -x "$MLFLOW_VENV/bin/mlflow" ] \
   || ! cmp -s "$HERE/mlflow-requirements.txt" "$MLFLOW_VENV/.kindling-requirements"; }; then
  echo "[setup] installing $(cat "$HERE/mlflow-requirements.txt") into $MLFLOW_VENV" >&2
  "${KINDLING_PYTHON:-python3}" -m venv "$MLFLOW_VENV"
  "$MLFLOW_VENV/bin/pip" install --quiet --disable-pip-version-check -r "$HERE/mlflow-requirements.txt"
  cp "$HERE/mlflow-requirements.txt" "$MLFLOW_VENV/.kindling-requirements"
fi
