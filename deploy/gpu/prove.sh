#!/usr/bin/env bash
# On a machine with a GPU (no Rust needed), from the repository root, after
# deploy/gpu/bundle.sh built deploy/gpu/bundle/ here and it travelled along:
# unpacks the binaries, makes sure a Vulkan loader and the GPU's Vulkan driver
# are found, prints the adapter and what it offers (`kindling-agent
# --check-gpu`), then runs deploy/gpu/prove.py: the digits MLP and CNN on 1
# and 2 agents sharing the GPU against the CPU run, then the training step
# against PyTorch eager, then (PROVE_NCU=1) profiles the batch-4096 MLP step
# kernel by kernel with NVIDIA's ncu. Results: prove.md and prove.json
# (and check-gpu.txt, ncu.csv, kernels.md; logs.txt when a run failed) in $OUT
# (the device tool's folder) or deploy/gpu/out/.
# Rehearsed on Mesa's software Vulkan device (lavapipe) with a WGSL bundle
# (see bundle.sh); run on an NVIDIA H200 on 2026-11-26 (docs/benchmarks.md#gpu).
#
# PROVE_AB=1 runs instead `bench_gpu --ab` (the MLP step's paths in
# alternating rounds, one agent and a data-parallel pair of ranks sharing the
# GPU, batches uploaded each step, kept, or half kept; PROVE_AB_ARGS its
# options) and PyTorch eager's MLP rows, and prints one table of both
# (deploy/gpu/ab_table.py: × PyTorch eager, × its pinned-copy path, the
# all-reduce's share, the upload's share): ab.md.
# PROVE_EMBEDDING=1 also runs the embedding model against PyTorch on CUDA
# (bench_gpu --embedding: bench_embedding.rs's model; PROVE_EMBEDDING_ARGS its options).
# PROVE_ARGS passes options to prove.py (e.g. "--steps 5" for a rehearsal);
# PROVE_PYTHON names a Python with pyarrow, numpy, scikit-learn and torch
# (PROVE_TORCH_PYTHON another for torch alone).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bundle=deploy/gpu/bundle
out="${OUT:-deploy/gpu/out}"
python="${PROVE_PYTHON:-python3}"
torch_python="${PROVE_TORCH_PYTHON:-$python}"
started=$(date +%s)
if [ ! -f "$bundle/bin.tar.xz" ]; then
  echo "no $bundle/bin.tar.xz: run deploy/gpu/bundle.sh first (where cargo is)" >&2
  exit 1
fi
unpacked=$(mktemp -d)
mkdir -p "$out"
tar -C "$unpacked" -xJf "$bundle/bin.tar.xz"
echo "bundle: $(tr '\n' ' ' <"$bundle/BUILD")"

# The Vulkan loader and the GL vendor-neutral dispatch libraries that NVIDIA's
# Vulkan driver (libGLX_nvidia.so.0) loads: the image's own, else the bundled
# packages.
if ! ldconfig -p | grep -q 'libvulkan.so.1' || ! ldconfig -p | grep -q 'libGLdispatch.so.0'; then
  echo "no Vulkan loader or GL dispatch library on this machine: unpacking the bundled packages"
  for f in "$bundle"/deb/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
# NVIDIA's driver mounted into a container: its Vulkan ICD and EGL vendor
# files, wherever the image puts them (the loader's own search may miss them).
if [ -z "${VK_DRIVER_FILES:-}" ]; then
  for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json \
    /etc/vulkan/icd.d/nvidia_icd.json /usr/local/nvidia/etc/vulkan/icd.d/nvidia_icd.json; do
    if [ -f "$icd" ]; then export VK_DRIVER_FILES="$icd"; break; fi
  done
fi
nv=/usr/local/nvidia/share
if [ -z "${__EGL_VENDOR_LIBRARY_FILENAMES:-}" ] && [ -f "$nv/glvnd/egl_vendor.d/10_nvidia.json" ]; then
  export __EGL_VENDOR_LIBRARY_FILENAMES="$nv/glvnd/egl_vendor.d/10_nvidia.json"
fi
echo "Vulkan driver file: ${VK_DRIVER_FILES:-none named, the loader searches}"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
fi

"$unpacked/bin/kindling-agent" --check-gpu 2>&1 | tee "$out/check-gpu.txt"
if [ "${PIPESTATUS[0]}" != 0 ]; then
  echo "the agent has no GPU to train on (above); what the Vulkan loader saw:" >&2
  [ -n "${VK_DRIVER_FILES:-}" ] && cat "$VK_DRIVER_FILES" >&2
  ldconfig -p | grep -i -E 'vulkan|nvidia|GLdispatch|GLX' >&2 || true
  VK_LOADER_DEBUG=error,warn,driver "$unpacked/bin/kindling-agent" --check-gpu 2>&1 | head -60 >&2 || true
  exit 1
fi

export PYTHONUNBUFFERED=1
status=0
if [ "${PROVE_AB:-0}" = 1 ]; then
  # The MLP step's paths in alternating rounds and PyTorch eager beside
  # them, instead of prove.py's accuracy and speed parts (about 3 minutes).
  echo "== bench_gpu --ab ${PROVE_AB_ARGS:-}"
  # shellcheck disable=SC2086
  "$unpacked/bin/bench_gpu" --ab ${PROVE_AB_ARGS:---steps 100 --rounds 3 --batches 4096,256} 2>&1 \
    | tee "$out/ab.txt" || status=$?
  echo "== PyTorch eager, the MLP (deploy/gpu/bench_gpu.py)"
  "$torch_python" deploy/gpu/bench_gpu.py --models mlp | tee "$out/torch.json" || status=$?
  echo "== one table: each path against PyTorch eager and its pinned-copy path"
  "$python" deploy/gpu/ab_table.py "$out/ab.txt" "$out/torch.json" | tee "$out/ab.md" || status=$?
else
  # shellcheck disable=SC2086
  "$python" deploy/gpu/prove.py --bin "$unpacked/bin" --out "$out" --python "$torch_python" ${PROVE_ARGS:-} || status=$?
fi

# The embedding model (a user's KindlingModel) on the GPU against PyTorch
# eager on CUDA, batch 256 and 4096: only with PROVE_EMBEDDING=1.
if [ "${PROVE_EMBEDDING:-0}" = 1 ]; then
  echo "== the embedding model, one agent's step on the device (bench_gpu --embedding)"
  # shellcheck disable=SC2086
  KINDLING_TORCH_PYTHON="$torch_python" "$unpacked/bin/bench_gpu" --embedding ${PROVE_EMBEDDING_ARGS:---steps 100 --warmup 20} \
    2>&1 | tee "$out/embedding.md" || status=$?
fi

# Where a Kindling MLP step's device time goes, kernel by kernel (NVIDIA's
# profiler sees Vulkan compute kernels where the container lets it): only with
# PROVE_NCU=1, since on the H200 it was tried on it profiled none; bounded,
# since the profiler replays every kernel it measures.
if [ "${PROVE_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  echo "== kernels of the batch-4096 MLP step (ncu)"
  # The first steps (and cubecl's autotuning of each matmul) are skipped.
  timeout "${PROVE_NCU_TIMEOUT:-100}" ncu --target-processes all --launch-skip 600 --launch-count 200 \
    --metrics gpu__time_duration.sum --csv \
    "$unpacked/bin/bench_gpu" --models mlp --batches 4096 --steps 40 --warmup 20 --json >"$out/ncu.csv" \
    || echo "ncu ended with status $?"
  "$python" deploy/gpu/kernels.py "$out/ncu.csv" | tee "$out/kernels.md" || true
fi
echo "prove.sh: status $status, $(( $(date +%s) - started )) s"
exit "$status"
