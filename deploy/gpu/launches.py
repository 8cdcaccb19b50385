"""The kernels each path of ``bench_gpu --ab`` ran, from cubecl's own log.

With a ``cubecl.toml`` beside the program that turns on cubecl's profiling
logger (``[profiling.logger] level = "basic"``, ``stderr = true``), cubecl
writes one line per kernel it runs with its device time; ``bench_gpu --ab``
writes a line after each path's run. This splits the log at those lines and
prints, per path of the timed rounds: kernels and device time per step, and
the kernels that took the most. (``level = "minimal"`` logs the kernels
without their times: then only the counts.)

    python3 deploy/gpu/launches.py ab.txt [steps per run]
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict

UNIT = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3, "s": 1e6}
MARK = re.compile(r"batch (\d+) round (\d+): (.*) \d+ samples/s")
TIMED = re.compile(r"\|\s*([\d.]+)(ns|µs|us|ms|s)\s*\|\s*(.*)")


def label(kernel: str) -> str:
    """A kernel's name, short: its first part and its hash."""
    parts = [p.strip() for p in kernel.split("|")]
    return parts[0] if len(parts) == 1 else f"{parts[0]} … {parts[-1]}"


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    kernels: list = []
    runs = []
    with open(sys.argv[1], errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = MARK.match(line)
            if m:
                runs.append((m.group(1), int(m.group(2)), m.group(3), kernels))
                kernels = []
                continue
            t = TIMED.match(line)
            if t:
                kernels.append((label(t.group(3)), float(t.group(1)) * UNIT[t.group(2)]))
            elif line.startswith("Executing "):
                kernels.append((label(line[len("Executing "):]), 0.0))
    print("| batch | path | kernels/step | device µs/step | largest (µs/step, count/step) |")
    print("|---:|---|---:|---:|---|")
    for batch, rnd, path, ks in runs:
        if rnd == 0:
            continue  # untimed: compilation and autotuning
        by = defaultdict(lambda: [0.0, 0])
        for name, us in ks:
            by[name][0] += us
            by[name][1] += 1
        total = sum(us for _, us in ks)
        top = sorted(by.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))[:4]
        tops = "; ".join(f"{n} {v[0] / steps:.0f}, {v[1] / steps:.1f}" for n, v in top)
        print(f"| {batch} | {path} | {len(ks) / steps:.1f} | {total / steps:.0f} | {tops} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
