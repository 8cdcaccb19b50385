"""Writes scikit-learn's bundled handwritten-digits data set (1,797 8x8 images,
shipped inside the package, nothing downloaded) as two CSV files for Spark:
digits.csv (id, label, p0..p63) and writers.csv (id, writer_group)."""
import csv
import os
import sys

from sklearn.datasets import load_digits

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
digits = load_digits()
with open(os.path.join(out, "digits.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["id", "label"] + [f"p{i}" for i in range(64)])
    for i, (pixels, label) in enumerate(zip(digits.data, digits.target)):
        w.writerow([i, int(label)] + [int(p) for p in pixels])
with open(os.path.join(out, "writers.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["id", "writer_group"])
    for i in range(len(digits.target)):
        w.writerow([i, f"group-{i % 13}"])
print(f"wrote {len(digits.target)} digits to {out}")
