"""A gang job driven by the ``kindling_client`` package against agents whose
rendezvous is several replicas on etcd (``rendezvous_replicas.rs``).

Usage: job_on_replicas.py '<json>' with keys agents (Flight URLs), token,
job_id, rows_per_agent, epochs. Creates, starts and feeds the job, then prints
``fed <json status of agent 0>`` and waits for one line on stdin (the test
SIGKILLs the rendezvous' leader meanwhile), prints ``resumed <json status>``,
follows the job to its end and prints one JSON object with what it observed.
"""

import json
import sys

import numpy as np
import pyarrow as pa

from kindling_client import Job


def rule_table(rows, seed):
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(-1, 1, rows)
    x2 = rng.uniform(-1, 1, rows)
    y = (x1 + x2 > 0).astype(np.int64)
    return pa.table({"x1": x1, "x2": x2, "y": y})


def main():
    args = json.loads(sys.argv[1])
    agents, rows, epochs = args["agents"], args["rows_per_agent"], args["epochs"]
    spec = {
        "model": {"kind": "linear"},
        "task": {"kind": "classification", "num_classes": 2},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "learning_rate": 0.05},
        "epochs": epochs,
        "batch_size": 32,
        "num_slots": len(agents),
        "seed": 5,
        "features": ["x1", "x2"],
        "label": "y",
    }
    with Job(args["job_id"], agents, token=args["token"], timeout=120) as job:
        created = job.create()
        job.start(spec)
        job.feed([rule_table(rows, i) for i in range(len(agents))])
        print("fed", json.dumps(job.agents[0].job_status(job.job_id)), flush=True)
        sys.stdin.readline()
        print("resumed", json.dumps(job.agents[0].job_status(job.job_id)), flush=True)
        statuses = job.wait(timeout=300)
        print(
            json.dumps(
                {
                    "created": created,
                    "rendezvous": job.rendezvous,
                    "states": [s["state"] for s in statuses],
                    "attempts": [s["attempt"] for s in statuses],
                    "rows_per_epoch": [h["rows"] for h in job.history()],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
