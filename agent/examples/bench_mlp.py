"""PyTorch CPU baseline for `bench_mlp`: the same MLP, optimizer, loss and batch.

Trains an MLP 784-256-128-10 (ReLU) with Adam and cross-entropy on synthetic
data, `--threads` intra-op threads, and prints one JSON line with samples/s.

Needs PyTorch (CPU build), for example:
    python -m venv ~/.cache/kindling/torchvenv
    ~/.cache/kindling/torchvenv/bin/pip install torch==2.9.0 --index-url https://download.pytorch.org/whl/cpu
"""

import argparse
import json
import math
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument(
        "--tuned",
        action="store_true",
        help="AdamW (wd 0.01, biases exempt), warmup + cosine per step over 10 epochs, clip_grad_norm_ 1.0",
    )
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x = torch.randn(a.rows, 784)
    y = torch.randint(0, 10, (a.rows,))
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = a.rows // a.batch
    sched = None
    if a.tuned:
        decay = [p for n, p in model.named_parameters() if not n.endswith("bias")]
        no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3
        )
        # As the Rust run: 10 epochs over all steps, the first one warming up.
        total = a.steps + a.warmup
        per_epoch = max(1, -(-total // 10))

        def factor(step):
            if step < per_epoch:
                return step / per_epoch
            t = (step - per_epoch) / max(1, total - per_epoch)
            return 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(i):
        j = (i % batches) * a.batch
        xb, yb = x[j : j + a.batch], y[j : j + a.batch]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        if a.tuned:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if sched is not None:
            sched.step()
        return loss

    for i in range(a.warmup):
        step(i)
    t = time.perf_counter()
    for i in range(a.steps):
        loss = step(i)
    loss = float(loss.detach())
    elapsed = time.perf_counter() - t
    print(
        json.dumps(
            {
                "samples_per_sec": a.steps * a.batch / elapsed,
                "step_ms": elapsed / a.steps * 1e3,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "loss": loss,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
