#!/usr/bin/env bash
# Installs what Kindling needs on a fresh Debian/Ubuntu machine: protoc (the
# Spark Connect crates generate code at build time), Java 17 for Spark, the
# pinned pyspark/pyarrow virtualenv. Idempotent; quiet when all is present.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v flock >/dev/null 2>&1 || missing+=(util-linux)
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
# The GPU tests run burn-wgpu on Mesa's software Vulkan device (lavapipe).
if [ "${KINDLING_GPU_TESTS:-0}" = 1 ]; then
  compgen -G '/usr/share/vulkan/icd.d/lvp_icd.*.json' >/dev/null || missing+=(mesa-vulkan-drivers)
  compgen -G '/usr/lib/*/libvulkan.so.1' >/dev/null || missing+=(libvulkan1)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "[setup] Rust (cargo) is required: https://rustup.rs" >&2; exit 1; }
"$HERE/spark-connect.sh" install
