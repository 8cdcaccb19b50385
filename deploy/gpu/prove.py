"""Kindling on a GPU in one run: accuracy next to the CPU, then speed next to PyTorch.

Run by ``deploy/gpu/prove.sh`` on a machine with the bundle that
``deploy/gpu/bundle.sh`` built (``--bin``): the GPU agent, the rendezvous and
the GPU benchmark, stripped release binaries. Needs only what a GPU machine
with PyTorch has: Python 3.9+, numpy, pyarrow (Flight) and scikit-learn (its
bundled digits data set); the agents are driven through their Flight endpoint
by ``kindling_client`` (``deploy/python``), as any language would drive them.

1. **Accuracy.** One rendezvous and two agent processes on loopback, the agents
   sharing the one GPU. scikit-learn's digits (1,797 8×8 images), a fixed
   train/test split; the demo's MLP and a small CNN, each trained on 1 agent
   and on 2, once on the CPU (``use_gpu: false``) and once on the GPU, with the
   same seed, batches and epochs. The test accuracy comes from the agents'
   predictions; each GPU run must be within ``--tolerance`` points (0.5) of the
   CPU run with the same number of agents.
2. **Speed.** ``bench_gpu`` (the trainer's own step: Arrow batch to tensors,
   forward, backward, the gradients to the host optimizer and the weights back;
   for the MLP also the step kept on the device, a one-agent job's default, and
   burn alone; every configuration run untimed once before any is timed) and ``bench_gpu.py`` (PyTorch eager, the
   same models, optimizer and batches, on CUDA when it has a GPU; for the MLP
   also with each batch copied from host memory as a data loader's is) for the
   MLP 784-256-128-10 and the CNN, batch 256 and 4096, f32 and bf16.

Writes ``prove.md`` (the tables) and ``prove.json`` (every figure, the device,
the driver and the commands) into ``--out``; exits non-zero when an accuracy
check fails or a step errs. Everything printed comes from the programs'
own output on the machine it runs on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy" / "python"))

from kindling_client import Job  # noqa: E402

FEATURES = [f"p{i}" for i in range(64)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, what: str, deadline_s: float = 60.0) -> None:
    """Polls a ``/readyz`` probe until it answers 200 or the process exits."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} was not ready at {url} within {deadline_s:.0f} s")


class Cluster:
    """A rendezvous and ``agents`` agent processes on loopback, stopped on exit."""

    def __init__(self, bin_dir: Path, agents: int, work: Path) -> None:
        self.bin_dir, self.work = bin_dir, work
        self.token = secrets.token_hex(16)
        token_file = work / "token"
        token_file.write_text(self.token)
        token_file.chmod(0o600)
        self.procs: List[subprocess.Popen] = []
        self.logs: List[Path] = []
        rv_port, rv_health = free_port(), free_port()
        self.rendezvous = f"http://127.0.0.1:{rv_port}"
        rv = self._spawn(
            "kindling-rendezvous",
            ["--listen", f"127.0.0.1:{rv_port}", "--health-listen", f"127.0.0.1:{rv_health}", "--token-file", str(token_file)],
            "rendezvous",
        )
        wait_ready(f"http://127.0.0.1:{rv_health}/readyz", rv, "the rendezvous")
        self.addresses = []
        for i in range(agents):
            port, health = free_port(), free_port()
            proc = self._spawn(
                "kindling-agent",
                [
                    "--agent-id", f"gpu-agent-{i}",
                    "--node-name", f"gpu-node-{i}",
                    "--listen", f"127.0.0.1:{port}",
                    "--health-listen", f"127.0.0.1:{health}",
                    "--rendezvous", self.rendezvous,
                    "--token-file", str(token_file),
                    "--work-dir", str(work / f"agent-{i}"),
                    "--memory-budget", "2GiB",
                ],
                f"agent-{i}",
            )
            wait_ready(f"http://127.0.0.1:{health}/readyz", proc, f"agent {i}")
            self.addresses.append(f"127.0.0.1:{port}")

    def _spawn(self, binary: str, args: List[str], name: str) -> subprocess.Popen:
        log = self.work / f"{name}.log"
        self.logs.append(log)
        out = open(log, "wb")
        # These jobs check accuracy, not speed: cubecl's autotune at its minimal
        # level compiles and times fewer kernel variants of each new shape (the
        # digits' shapes, not the speed part's).
        env = {**os.environ, "CUBECL_AUTOTUNE_LEVEL": os.environ.get("PROVE_ACCURACY_AUTOTUNE", "minimal")}
        proc = subprocess.Popen([str(self.bin_dir / binary), *args], stdout=out, stderr=subprocess.STDOUT, env=env)
        self.procs.append(proc)
        return proc

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: object) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def digits(model: str, seed: int = 0) -> Dict[str, pa.Table]:
    """scikit-learn's digits scaled to [0, 1], split 2/3 train, 1/3 test: 64
    float columns for the MLP, one 64-value image column for the CNN."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = len(y) * 2 // 3

    def table(rows: np.ndarray) -> pa.Table:
        if model == "cnn":
            values = pa.array(x[rows].reshape(-1), pa.float32())
            cols = {"image": pa.FixedSizeListArray.from_arrays(values, 64)}
        else:
            cols = {name: x[rows, i] for i, name in enumerate(FEATURES)}
        return pa.table({"id": np.asarray(rows, dtype=np.int64), **cols, "y": y[rows]})

    return {"train": table(order[:cut]), "test": table(order[cut:])}


MODELS: Dict[str, Dict[str, Any]] = {
    # The demo's MLP (examples/digits/src/main.rs).
    "mlp": {"kind": "mlp", "hidden": [64]},
    # Two 3×3 conv blocks (+ReLU +2×2 max-pool) over the 8×8 image, then 64 wide.
    "cnn": {"kind": "cnn", "channels": 1, "height": 8, "width": 8, "conv": [16, 32], "dense": 64},
}


def spec(model: str, use_gpu: bool, epochs: int) -> Dict[str, Any]:
    return {
        "model": MODELS[model],
        "task": {"kind": "classification", "num_classes": 10},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adamw", "learning_rate": 0.01, "weight_decay": 0.01},
        "epochs": epochs,
        "batch_size": 32,
        "num_slots": 1,
        "seed": 7,
        "use_gpu": use_gpu,
        "features": ["image"] if model == "cnn" else FEATURES,
        "label": "y",
    }


def train_once(cluster: Cluster, data: Dict[str, pa.Table], model: str, agents: int, use_gpu: bool, epochs: int) -> Dict[str, Any]:
    job_id = f"prove-{model}-{agents}-{'gpu' if use_gpu else 'cpu'}-{secrets.token_hex(3)}"
    train, test = data["train"], data["test"]
    shards = [train.slice(i * train.num_rows // agents, (i + 1) * train.num_rows // agents - i * train.num_rows // agents) for i in range(agents)]
    started = time.monotonic()
    with Job(job_id, cluster.addresses[:agents], token=cluster.token, timeout=120) as job:
        job.create(max_attempts=1)
        job.start(spec(model, use_gpu, epochs))
        job.feed([s.drop(["id"]).to_batches(max_chunksize=256) for s in shards])
        statuses = job.wait(timeout=600)
        seconds = time.monotonic() - started
        pred = job.predict(test.drop(["y"]))
    assert pred["id"].to_pylist() == test["id"].to_pylist(), "predictions out of order"
    accuracy = float((pred["prediction"].to_numpy() == test["y"].to_numpy()).mean()) * 100
    return {
        "model": model,
        "agents": agents,
        "device": statuses[0]["device"],
        "accuracy": accuracy,
        "final_loss": statuses[0]["history"][-1]["train_loss"],
        "seconds": seconds,
        "samples_per_sec": statuses[0]["samples_per_sec"],
    }


def accuracy_part(args: argparse.Namespace, work: Path) -> Dict[str, Any]:
    runs: List[Dict[str, Any]] = []
    with Cluster(args.bin, 2, work) as cluster:
        for model in ["mlp", "cnn"]:
            data = digits(model)
            for agents in [1, 2]:
                for use_gpu in [False, True]:
                    run = train_once(cluster, data, model, agents, use_gpu, args.epochs)
                    runs.append(run)
                    print(
                        f"  {model} on {agents} agent(s), {run['device']}: test accuracy {run['accuracy']:.2f} % "
                        f"({run['seconds']:.1f} s)",
                        flush=True,
                    )
    checks = []
    for model in ["mlp", "cnn"]:
        for agents in [1, 2]:
            cpu, gpu = (next(r for r in runs if r["model"] == model and r["agents"] == agents and r["device"].startswith(d)) for d in ["cpu", "gpu"])
            diff = gpu["accuracy"] - cpu["accuracy"]
            checks.append({"model": model, "agents": agents, "cpu": cpu["accuracy"], "gpu": gpu["accuracy"], "diff": diff, "ok": abs(diff) <= args.tolerance})
    return {"runs": runs, "checks": checks, "test_rows": data["test"].num_rows, "train_rows": data["train"].num_rows}


def run_json(cmd: List[str], what: str, env: Optional[Dict[str, str]] = None) -> Any:
    print(f"$ {' '.join(cmd)}", flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    sys.stderr.write(out.stderr[-4000:])
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed with status {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# bench_gpu's path of one agent's step on the device with its batches kept.
KEPT = "step on the device, batches kept"


def same_config(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    """Whether two rows measure the same model, batch and precision."""
    return all(a[f] == b[f] for f in ["model", "batch", "precision"])


def speed_part(args: argparse.Namespace) -> Dict[str, Any]:
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--batches", args.batches, "--models", args.models]
    kindling = run_json([str(args.bin / "bench_gpu"), *common, "--json"], "bench_gpu")
    torch = run_json([args.python, str(ROOT / "deploy" / "gpu" / "bench_gpu.py"), *common], "bench_gpu.py")
    rows = []
    for k in kindling["rows"]:
        t = next((t for t in torch["rows"] if same_config(t, k)), None)
        note = f"computed in {k['dtype']}: the adapter has no bf16" if k.get("dtype") not in (None, k["precision"]) else None
        rows.append({**k, "note": note, "torch_samples_per_sec": t and t["samples_per_sec"], "ratio": t and k["samples_per_sec"] / t["samples_per_sec"]})
    # One agent's step on the device with its batches kept (every model and
    # precision), set beside the same PyTorch row.
    kept = []
    for k in kindling.get("other_paths", []):
        if not k["path"].startswith(KEPT):
            continue
        t = next((t for t in torch["rows"] if same_config(t, k)), None)
        ratio = t and k["samples_per_sec"] and k["samples_per_sec"] / t["samples_per_sec"]
        kept.append({**k, "torch_samples_per_sec": t and t["samples_per_sec"], "ratio": ratio or None})
    for t in torch["rows"]:
        if not any(same_config(t, r) for r in rows):
            rows.append({"model": t["model"], "batch": t["batch"], "precision": t["precision"], "samples_per_sec": None, "note": "not measured: the adapter has neither bf16 nor f16", "torch_samples_per_sec": t["samples_per_sec"], "ratio": None})
    return {"kindling": kindling, "torch": torch, "rows": rows, "kept": kept}


def fmt(x: Optional[float], spec: str) -> str:
    return "—" if x is None else format(x, spec)


def report(result: Dict[str, Any]) -> str:
    lines = [f"Device: {result['device']}", ""]
    for error in result.get("errors", []):
        lines += [f"FAILED: {error}", ""]
    if "accuracy" in result:
        lines += accuracy_report(result)
    if "speed" in result:
        lines += speed_report(result["speed"])
    return "\n".join(lines) + "\n"


def accuracy_report(result: Dict[str, Any]) -> List[str]:
    acc = result["accuracy"]
    lines = [
        f"Accuracy on scikit-learn's digits ({acc['train_rows']} train rows, {acc['test_rows']} test rows, {result['epochs']} epochs, batch 32, AdamW):",
        "",
        "| model | agents | CPU accuracy % | GPU accuracy % | GPU − CPU (points) | within ±" + f"{result['tolerance']} |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for c in acc["checks"]:
        lines.append(f"| {c['model']} | {c['agents']} | {c['cpu']:.2f} | {c['gpu']:.2f} | {c['diff']:+.2f} | {'yes' if c['ok'] else 'NO'} |")
    lines += ["", "| model | agents | device | seconds to train | samples/s |", "|---|---:|---|---:|---:|"]
    for r in acc["runs"]:
        lines.append(f"| {r['model']} | {r['agents']} | {r['device']} | {r['seconds']:.1f} | {r['samples_per_sec']:.0f} |")
    return lines + [""]


def speed_report(speed: Dict[str, Any]) -> List[str]:
    lines = [
        f"Training step throughput ({speed['kindling']['steps']} timed steps after {speed['kindling']['warmup']} warm-up; "
        f"Kindling on {speed['kindling']['device']}, PyTorch {speed['torch']['torch']} eager on {speed['torch']['device']}):",
        "",
        "| model | batch | precision | Kindling samples/s | PyTorch samples/s | Kindling / PyTorch |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in speed["rows"]:
        note = f" ({r['note']})" if r.get("note") else ""
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['precision']} | {fmt(r['samples_per_sec'], '.0f')}{note} | "
            f"{fmt(r['torch_samples_per_sec'], '.0f')} | {fmt(r['ratio'], '.2f')}{'×' if r['ratio'] else ''} |"
        )
    if speed.get("kept"):
        lines += [
            "",
            "One agent's step on the device, batches kept (the trainer's epochs after the first), against PyTorch eager:",
            "",
            "| model | batch | precision (computed in) | Kindling samples/s | PyTorch samples/s | Kindling / PyTorch |",
            "|---|---:|---|---:|---:|---:|",
        ]
        for r in speed["kept"]:
            value = f"failed: {r['error']}" if r.get("error") else fmt(r["samples_per_sec"], ".0f")
            lines.append(
                f"| {r['model']} | {r['batch']} | {r['precision']} ({r.get('dtype', r['precision'])}) | {value} | "
                f"{fmt(r['torch_samples_per_sec'], '.0f')} | {fmt(r['ratio'], '.2f')}{'×' if r['ratio'] else ''} |"
            )
    others = [("Kindling", r) for r in speed["kindling"].get("other_paths", []) if not r["path"].startswith(KEPT)]
    others += [("PyTorch", r) for r in speed["torch"].get("other_paths", [])]
    if others:
        lines += ["", "Other paths of the step (MLP, f32):", "", "| batch | system | path | samples/s |", "|---:|---|---|---:|"]
        for system, r in others:
            lines.append(f"| {r['batch']} | {system} | {r['path']} | {r['samples_per_sec']:.0f} |")
    if speed["kindling"].get("phases"):
        lines += ["", "Where an MLP step goes (median ms):", "", "| batch | path | phase | ms |", "|---:|---|---|---:|"]
        for p in speed["kindling"]["phases"]:
            lines.append(f"| {p['batch']} | {p['path']} | {p['phase']} | {p['ms']:.3f} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", type=Path, required=True, help="the bundle's folder of binaries")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--python", default=sys.executable, help="a Python with torch for the PyTorch rows")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--tolerance", type=float, default=0.5, help="points of accuracy a GPU run may differ from the CPU run")
    p.add_argument("--steps", type=int, default=100, help="timed steps per benchmark row")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batches", default="256,4096", help="batch sizes of the speed rows")
    p.add_argument("--models", default="mlp,cnn", help="models of the speed rows")
    p.add_argument("--skip-speed", action="store_true")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    check = subprocess.run([str(args.bin / "kindling-agent"), "--check-gpu"], capture_output=True, text=True)
    if check.returncode != 0:
        print(f"no GPU for the agent:\n{check.stdout}{check.stderr}", file=sys.stderr)
        return 1
    result: Dict[str, Any] = {
        "device": check.stdout.strip(),
        "host": platform.node(),
        "epochs": args.epochs,
        "tolerance": args.tolerance,
        "command": " ".join(sys.argv),
    }
    work = Path(tempfile.mkdtemp(prefix="kindling-prove-"))
    errors: List[str] = []
    # Each part is kept when the other fails: one run on the device is all there is.
    try:
        print("== accuracy: CPU against GPU, 1 and 2 agents", flush=True)
        result["accuracy"] = accuracy_part(args, work)
        print(f"== accuracy done in {time.monotonic() - started:.0f} s", flush=True)
    except Exception as e:  # noqa: BLE001 - reported, and the speed part still runs
        errors.append(f"accuracy: {e!r}")
        print(f"accuracy part failed: {e!r}", file=sys.stderr, flush=True)
        # The processes' logs, their last 200 lines each, in one file.
        with open(args.out / "logs.txt", "w") as logs:
            for log in sorted(work.glob("*.log")):
                lines = log.read_text(errors="replace").splitlines()[-200:]
                logs.write(f"==== {log.name}\n" + "\n".join(lines) + "\n")
    write(args.out, result)
    if not args.skip_speed:
        try:
            print("== speed: Kindling against PyTorch eager", flush=True)
            result["speed"] = speed_part(args)
        except Exception as e:  # noqa: BLE001 - reported with what was measured
            errors.append(f"speed: {e!r}")
            print(f"speed part failed: {e!r}", file=sys.stderr, flush=True)
    result["seconds"] = time.monotonic() - started
    result["errors"] = errors
    md = write(args.out, result)
    shutil.rmtree(work, ignore_errors=True)
    print(md)
    print(f"== done in {result['seconds']:.0f} s", flush=True)
    failed = [c for c in result.get("accuracy", {}).get("checks", []) if not c["ok"]]
    if failed:
        print(f"accuracy check failed: {failed}", file=sys.stderr)
    return 2 if failed or errors else 0


def write(out: Path, result: Dict[str, Any]) -> str:
    """Writes prove.md and prove.json with what has been measured so far."""
    md = report(result)
    (out / "prove.md").write_text(md)
    (out / "prove.json").write_text(json.dumps(result, indent=1))
    return md


if __name__ == "__main__":
    sys.exit(main())
