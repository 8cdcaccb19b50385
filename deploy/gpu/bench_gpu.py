"""PyTorch eager baseline for ``bench_gpu``: the same models, optimizer, loss and batches.

MLP 784-256-128-10 (ReLU) and the CNN of ``bench_gpu`` (1×28×28, two 3×3
conv blocks of 32 and 64 channels with ReLU and 2×2 max-pool, dense 128,
10 classes), Adam (lr 1e-3), cross-entropy, on synthetic data already on the
device; batch 256 and 4096; f32, and bf16 autocast with f32 master weights
(where the device has bf16). On CUDA when torch sees a GPU, else the CPU
(a rehearsal). Also, for the MLP in f32 (``other_paths``), each step's batch
copied from pinned host memory (``non_blocking``, as a data loader's is), as
Kindling's batches come from Arrow on the host, and each step's loss read
back (``loss.item()``, as Kindling's trainer reads its loss). Prints one JSON line: the
device, torch's version and one row per model × batch × precision with
samples/s.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    )


def cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 28, 28)),
        torch.nn.Conv2d(1, 32, 3, padding="same"), torch.nn.ReLU(), torch.nn.MaxPool2d(2, 2),
        torch.nn.Conv2d(32, 64, 3, padding="same"), torch.nn.ReLU(), torch.nn.MaxPool2d(2, 2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 7 * 7, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10),
    )


def bench(
    model_name: str,
    batch: int,
    precision: str,
    steps: int,
    warmup: int,
    device: torch.device,
    from_host: bool = False,
    read_each: bool = False,
) -> float:
    torch.manual_seed(0)
    model = (mlp if model_name == "mlp" else cnn)().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    n_batches = 8
    x = torch.rand(n_batches, batch, 784, device=device) * 2 - 1
    y = torch.randint(0, 10, (n_batches, batch), device=device)
    if from_host and device.type == "cuda":
        x, y = x.cpu().pin_memory(), y.cpu().pin_memory()
    autocast = precision == "bf16"

    def step(i: int) -> None:
        opt.zero_grad(set_to_none=True)
        xi, yi = x[i % n_batches], y[i % n_batches]
        if from_host:
            xi, yi = xi.to(device, non_blocking=True), yi.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(model(xi), yi)
        loss.backward()
        opt.step()
        if read_each:
            loss.item()

    for i in range(warmup):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(steps):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - t)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batches", default="256,4096")
    p.add_argument("--models", default="mlp,cnn")
    a = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    precisions = ["f32"]
    if device.type == "cpu" or torch.cuda.is_bf16_supported():
        precisions.append("bf16")
    rows, other = [], []
    for model in a.models.split(","):
        for batch in [int(b) for b in a.batches.split(",")]:
            for precision in precisions:
                sps = bench(model, batch, precision, a.steps, a.warmup, device)
                rows.append({"model": model, "batch": batch, "precision": precision, "samples_per_sec": sps})
            if model == "mlp":
                sps = bench(model, batch, "f32", a.steps, a.warmup, device, from_host=True)
                other.append({"model": model, "batch": batch, "precision": "f32", "path": "batch copied from pinned host memory each step", "samples_per_sec": sps})
                sps = bench(model, batch, "f32", a.steps, a.warmup, device, read_each=True)
                other.append({"model": model, "batch": batch, "precision": "f32", "path": "loss read back each step", "samples_per_sec": sps})
    print(json.dumps({"device": name, "torch": torch.__version__, "steps": a.steps, "warmup": a.warmup, "rows": rows, "other_paths": other}))


if __name__ == "__main__":
    main()
