"""PyTorch CPU baseline for `bench_embedding`: the same embedding model,
optimizer, loss, batch and data shapes.

Four categorical columns (vocabularies 1000, 500, 100, 50) each through an
embedding of 16, a numeric tower 16 → 32 (ReLU) over 16 float features, the
concatenation through 96 → 64 (ReLU) → 2, Adam (lr 1e-3), cross-entropy.
Prints one JSON line with samples/s. Needs PyTorch (CPU build), see
`bench_mlp.py`; `--device cuda` trains on the GPU with the data already
there (`bench_embedding --gpu`'s baseline).
"""

import argparse
import json
import time

import torch

VOCABULARIES = [1000, 500, 100, 50]
DIM = 16
FLOATS = 16


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = torch.nn.ModuleList(torch.nn.Embedding(v, DIM) for v in VOCABULARIES)
        self.tower = torch.nn.Linear(FLOATS, 32)
        self.hidden = torch.nn.Linear(DIM * len(VOCABULARIES) + 32, 64)
        self.head = torch.nn.Linear(64, 2)

    def forward(self, ids, x):
        parts = [e(ids[:, i]) for i, e in enumerate(self.embeddings)]
        parts.append(torch.relu(self.tower(x)))
        return self.head(torch.relu(self.hidden(torch.cat(parts, 1))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rows", type=int, default=32768)
    p.add_argument("--device", default="cpu", help="cpu, or cuda: the data and the model on the GPU")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    a.rows = max(a.rows, 8 * a.batch)
    ids = torch.stack([torch.randint(0, v, (a.rows,)) for v in VOCABULARIES], 1).to(dev)
    x = torch.randn(a.rows, FLOATS).to(dev)
    y = torch.randint(0, 2, (a.rows,)).to(dev)
    model = Net().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = a.rows // a.batch

    def step(i):
        j = (i % batches) * a.batch
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(ids[j : j + a.batch], x[j : j + a.batch]), y[j : j + a.batch])
        loss.backward()
        opt.step()
        return loss

    for i in range(a.warmup):
        step(i)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(a.steps):
        loss = step(i)
    loss = float(loss.detach())
    elapsed = time.perf_counter() - t
    print(
        json.dumps(
            {
                "samples_per_sec": a.steps * a.batch / elapsed,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "loss": loss,
                "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
