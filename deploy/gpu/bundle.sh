#!/usr/bin/env bash
# Builds, here, everything deploy/gpu/prove.sh needs on a GPU machine that has
# no Rust toolchain and no package registry: stripped binaries of the GPU agent,
# the GPU benchmark (agent/examples/bench_gpu, which also trains
# bench_embedding's model) and the rendezvous, packed
# with xz, and the Vulkan loader's Debian package for an image without
# libvulkan.so.1. Output: deploy/gpu/bundle/ (git-ignored), checked to be under
# 60 MiB (what travels to a GPU machine in one call is at most 64 MiB).
#
#   deploy/gpu/bundle.sh      # release, --features gpu (SPIR-V): ~25 min on 2 cores, cold
#   deploy/gpu/prove.sh       # then, on the GPU machine
#
# A rehearsal on Mesa's software Vulkan device, which crashes on SPIR-V
# kernels, bundles the WGSL build instead (the debug profile builds in minutes
# where the test build is warm):
#
#   KINDLING_GPU_FEATURE=gpu-wgsl KINDLING_BUNDLE_PROFILE=dev deploy/gpu/bundle.sh
#   PROVE_ARGS="--steps 5 --warmup 2" deploy/gpu/prove.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export KINDLING_HOME="${KINDLING_HOME:-$HOME/.cache/kindling}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$KINDLING_HOME/target}"
feature="${KINDLING_GPU_FEATURE:-gpu}"
profile="${KINDLING_BUNDLE_PROFILE:-release}"
out=deploy/gpu/bundle
limit_mib=60
case "$profile" in
  release) dir=release ;;
  dev) dir=debug ;;
  *) echo "KINDLING_BUNDLE_PROFILE must be release or dev, not $profile" >&2; exit 1 ;;
esac

echo "== $profile build: kindling-agent, kindling-rendezvous and bench_gpu with --features $feature"
cargo build --profile "$profile" -p kindling-agent --features "$feature" --bins --example bench_gpu
cargo build --profile "$profile" -p kindling-rendezvous --bins

rm -rf "$out"
mkdir -p "$out/bin" "$out/deb"
cp "$CARGO_TARGET_DIR/$dir/kindling-agent" "$CARGO_TARGET_DIR/$dir/kindling-rendezvous" \
  "$CARGO_TARGET_DIR/$dir/examples/bench_gpu" "$out/bin/"
strip "$out"/bin/*
# Linked only against the C library and friends: the machine's own are used.
ldd "$out/bin/kindling-agent" | awk '{print "   ", $1}'
XZ_OPT=-T0 tar -C "$out" -cJf "$out/bin.tar.xz" bin
rm -rf "$out/bin"

# NVIDIA's Vulkan driver is libGLX_nvidia.so.0, which needs glvnd's dispatch libraries.
echo "== the Vulkan loader (libvulkan1) and glvnd's libraries, for an image without them"
lists=$(mktemp -d)
apt_opts=(-o APT::Architecture=amd64 -o APT::Architectures=amd64 -o "Dir::State::Lists=$lists")
mkdir -p "$lists/partial"
apt-get "${apt_opts[@]}" update -qq
(cd "$out/deb" && apt-get "${apt_opts[@]}" download libvulkan1 libglvnd0 libgl1 libglx0 libegl1 libopengl0 libgles2 >/dev/null)
rm -rf "$lists"

printf '%s\n' "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')" \
  "features $feature" "profile $profile" >"$out/BUILD"
size=$(du -sm "$out" | cut -f1)
ls -l "$out" "$out/deb"
echo "bundle: $out, ${size} MiB (limit ${limit_mib} MiB)"
if [ "$size" -ge "$limit_mib" ]; then
  echo "the bundle is over ${limit_mib} MiB: it would not travel to the GPU machine" >&2
  exit 1
fi
