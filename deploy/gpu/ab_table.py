#!/usr/bin/env python3
"""One table from a `bench_gpu --ab` run and PyTorch eager's MLP rows of the
same call (deploy/gpu/bench_gpu.py's JSON): each path's samples/s against
PyTorch eager and against PyTorch copying each batch from pinned memory, with
the all-reduce's share of the step for the data-parallel paths and the
upload's for the paths that upload batches (from the upload-alone path).

    ab_table.py ab.txt torch.json > ab.md
"""
import json
import sys
from typing import Dict, List, Tuple


def ab_rows(path: str) -> List[Tuple[int, str, float, str]]:
    """(batch, path, median samples/s, all-reduce share) of bench_gpu --ab's table."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 6 or not cells[0].isdigit() or "phase:" in cells[1]:
                continue
            try:
                sps = float(cells[2])
            except ValueError:
                continue
            rows.append((int(cells[0]), cells[1], sps, cells[5]))
    return rows


def torch_baselines(path: str) -> Dict[int, Dict[str, float]]:
    """Per batch: PyTorch eager's f32 MLP samples/s and its pinned-copy path's."""
    with open(path, encoding="utf-8") as f:
        text = f.read().strip().splitlines()
    result = json.loads(text[-1])
    out: Dict[int, Dict[str, float]] = {}
    for r in result["rows"]:
        if r["model"] == "mlp" and r["precision"] == "f32":
            out.setdefault(r["batch"], {})["eager"] = r["samples_per_sec"]
    for r in result.get("other_paths", []):
        if r["model"] == "mlp" and "pinned" in r["path"]:
            out.setdefault(r["batch"], {})["pinned"] = r["samples_per_sec"]
    return out


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rows = ab_rows(sys.argv[1])
    torch = torch_baselines(sys.argv[2])
    if not rows:
        print(f"no --ab rows in {sys.argv[1]}", file=sys.stderr)
        return 1
    print("| batch | path | samples/s | × PyTorch eager | × PyTorch, batch copied from pinned memory | the all-reduce's or the upload's share of the step |")
    print("|---:|---|---:|---:|---:|---:|")
    ratio = lambda x, base: f"{x / base:.2f}×" if base else "—"
    # Each batch's upload alone bounds a path that uploads every batch: its
    # share of such a step is the step's rate over the upload's.
    upload = {b: v for b, n, v, _ in rows if n.startswith("each batch's upload alone")}
    for batch, name, sps, share in rows:
        base = torch.get(batch, {})
        # The share of its batches a path uploads each step (room for half: half).
        uploaded = 0.5 if "half the batches" in name else 1.0 if "the trainer's" in name else 0.0
        if not share and uploaded and upload.get(batch):
            share = f"upload {100 * uploaded * sps / upload[batch]:.0f} %"
        elif share:
            share = f"all-reduce {share}"
        print(f"| {batch} | {name} | {sps:,.0f} | {ratio(sps, base.get('eager'))} | {ratio(sps, base.get('pinned'))} | {share} |")
    for batch in sorted(torch):
        base = torch[batch]
        print(f"| {batch} | PyTorch eager | {base.get('eager', 0):,.0f} | 1.00× | | |")
        if "pinned" in base:
            print(f"| {batch} | PyTorch eager, batch copied from pinned memory | {base['pinned']:,.0f} | | 1.00× | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
