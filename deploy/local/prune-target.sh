#!/usr/bin/env bash
# Keeps the shared cargo target dir to what the current tree builds.
#
# Cargo never deletes an artifact: every edit of a workspace crate, every
# dependency bump and every feature set leaves its old rlibs and test binaries
# behind, and with burn, arrow and tonic linked into ~60 test and example
# binaries the debug dir grows by gigabytes a day until the disk fills (the
# linker then dies with SIGBUS). This script asks cargo which artifacts the
# CI's builds use (`--message-format=json`: fresh units report their files
# too, so nothing is rebuilt when the tree is built), and deletes every other
# hashed entry under debug/{deps,examples,build,.fingerprint} and all of
# debug/incremental.
#
#   deploy/local/prune-target.sh          # prune (run after a full build)
#   deploy/local/prune-target.sh --dry    # only say what would go
#   deploy/local/prune-target.sh --guard N
#       # before a build: when fewer than N GiB are free on the target's disk,
#       # drop incremental and release, then the whole target if still short
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
export KINDLING_HOME="${KINDLING_HOME:-$HOME/.cache/kindling}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$KINDLING_HOME/target}"
TARGET="$CARGO_TARGET_DIR"

free_gib() {
  local dir="$TARGET"
  while [ ! -d "$dir" ]; do dir="$(dirname "$dir")"; done
  df -Pk "$dir" | awk 'NR==2 { print int($4 / 1048576) }'
}

if [ "${1:-}" = --guard ]; then
  need="${2:?--guard needs a size in GiB}"
  have="$(free_gib)"
  if [ "$have" -lt "$need" ]; then
    echo "[prune] ${have} GiB free, ${need} wanted: dropping incremental and release" >&2
    rm -rf "$TARGET/debug/incremental" "$TARGET/release"
    have="$(free_gib)"
    if [ "$have" -lt "$need" ]; then
      echo "[prune] still ${have} GiB free: dropping the whole target dir (cold build)" >&2
      rm -rf "$TARGET"
    fi
  fi
  exit 0
fi

dry=0
[ "${1:-}" = --dry ] && dry=1
cd "$ROOT"

builds=(
  "test --workspace --lib --bins --tests --no-run"
  "clippy --workspace --all-targets --features kindling/bench-parquet"
  "clippy -p kindling --no-default-features --lib"
  "build -p kindling-example-digits"
)
if [ "${KINDLING_GPU_TESTS:-0}" = 1 ]; then
  builds+=(
    "clippy -p kindling-agent --features gpu --all-targets"
    "test -p kindling-agent --features gpu-wgsl --test gpu_training --no-run"
  )
fi

messages="$(mktemp)"
trap 'rm -f "$messages"' EXIT
for b in "${builds[@]}"; do
  # shellcheck disable=SC2086 # the words of one build are meant to split
  cargo $b --quiet --message-format=json >>"$messages"
done

python3 - "$TARGET/debug" "$messages" "$dry" <<'PY'
import json, os, re, shutil, sys

debug, messages, dry = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
HASH = re.compile(r"-([0-9a-f]{16})(?:\.|$)")

def hash_of(name):
    m = HASH.search(name)
    return m.group(1) if m else None

keep = set()
with open(messages) as f:
    for line in f:
        line = line.strip()
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        paths = list(msg.get("filenames") or [])
        if msg.get("executable"):
            paths.append(msg["executable"])
        if msg.get("out_dir"):
            paths.append(msg["out_dir"])
        for p in paths:
            for part in p.split(os.sep):
                h = hash_of(part)
                if h:
                    keep.add(h)
if not keep:
    sys.exit("[prune] cargo reported no artifacts: nothing pruned")

freed, removed = 0, 0
def size(path):
    if os.path.isdir(path) and not os.path.islink(path):
        return sum(os.path.getsize(os.path.join(r, n))
                   for r, _, ns in os.walk(path) for n in ns
                   if not os.path.islink(os.path.join(r, n)))
    return os.path.getsize(path)

def drop(path):
    global freed, removed
    freed += size(path)
    removed += 1
    if dry:
        return
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)

for sub in ("deps", "examples", "build", ".fingerprint"):
    d = os.path.join(debug, sub)
    if not os.path.isdir(d):
        continue
    for name in os.listdir(d):
        h = hash_of(name)
        if h and h not in keep:
            drop(os.path.join(d, name))
inc = os.path.join(debug, "incremental")
if os.path.isdir(inc):
    drop(inc)
verb = "would free" if dry else "freed"
print(f"[prune] {verb} {freed / 2**30:.1f} GiB in {removed} entries; "
      f"{len(keep)} artifact hashes in use", file=sys.stderr)
PY
