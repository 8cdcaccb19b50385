"""A Kindling step's device time kernel by kernel, from NVIDIA's profiler.

Reads the CSV that ``ncu --csv --metrics gpu__time_duration.sum`` printed
(``deploy/gpu/prove.sh`` profiles the batch-4096 MLP step of ``bench_gpu``)
and prints a Markdown table: the kernels grouped by name, grid and block
(cubecl's Vulkan kernels may all share one entry-point name), with their count,
total and mean time and share of the profiled time, largest first.

    python3 deploy/gpu/kernels.py ncu.csv
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from typing import Dict, List, Tuple

TO_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}


def rows(path: str) -> List[Dict[str, str]]:
    """The profiler's CSV rows (its own lines and the program's are skipped)."""
    with open(path, errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]
    return list(csv.DictReader(lines))


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 1
    groups: Dict[Tuple[str, str, str], List[float]] = defaultdict(list)
    for r in rows(sys.argv[1]):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        us = value * TO_US.get(r.get("Metric Unit", "nsecond"), 1e-3)
        groups[(r.get("Kernel Name", "?")[:60], r.get("Grid Size", ""), r.get("Block Size", ""))].append(us)
    total = sum(sum(v) for v in groups.values())
    if not total:
        print(f"no kernel times in {sys.argv[1]}", file=sys.stderr)
        return 1
    launches = sum(len(v) for v in groups.values())
    print(f"{launches} kernel launches profiled, {total / 1e3:.3f} ms of device time in all.\n")
    print("| kernel | grid | block | launches | total µs | mean µs | share |")
    print("|---|---|---|---:|---:|---:|---:|")
    for (name, grid, block), times in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:25]:
        t = sum(times)
        print(f"| `{name}` | {grid} | {block} | {len(times)} | {t:.1f} | {t / len(times):.1f} | {100 * t / total:.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
