"""Task retries without Spark: the same kindling_client.push function run as several
attempts of one partition, as Spark would run them.

The Spark Connect test server runs `local[2]`, where spark.task.maxFailures is 1
(a failed task fails the job), so retries are driven here with an explicit
(partition id, attempt) instead of TaskContext.

Usage: push_retry.py '<json>' with agents, token, job_id, partitions,
rows_per_partition, batch_rows. Prints one JSON object.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pyarrow as pa

from kindling_client import AgentClient
from kindling_client.push import PushError, push_partition_fn, udf_command


def partition(pid, rows, batch_rows):
    rng = np.random.default_rng(pid)
    x1 = rng.uniform(-1, 1, rows)
    x2 = rng.uniform(-1, 1, rows)
    y = (x1 + 2 * x2 > 0.1).astype(np.int32)
    return pa.table({"x1": x1, "x2": x2, "y": y}).to_batches(max_chunksize=batch_rows)


def attempt(args, pid, att, fail=None):
    hook = None
    if fail is not None:
        def hook(partition_id, attempt_no, acked):
            if (partition_id, attempt_no, acked) == (fail["partition"], fail["attempt"], fail["after_batches"]):
                raise PushError(f"injected failure: partition-{partition_id} attempt {attempt_no} after {acked} batches")
    fn = push_partition_fn(args["job_id"], token=args["token"], agents=args["agents"], after_batch=hook,
                           task_info=lambda: (pid, att))
    batches = partition(pid, args["rows_per_partition"], args["batch_rows"])
    [summary] = list(fn(iter(batches)))
    return summary.to_pylist()[0]


def rows_train(args):
    return [AgentClient(a, args["token"]).job_status(args["job_id"])["rows_train"] for a in args["agents"]]


def die_mid_stream(args, pid, after):
    """Child process: push `after` batches of partition `pid`, then exit abruptly."""
    fn = push_partition_fn(args["job_id"], token=args["token"], agents=args["agents"],
                           task_info=lambda: (pid, 0))
    batches = partition(pid, args["rows_per_partition"], args["batch_rows"])

    def source():
        import os
        for i, b in enumerate(batches):
            if i == after:
                sys.stdout.flush()
                os._exit(17)  # the executor dies: no clean close, no exception handling
            yield b

    list(fn(source()))


def main():
    if sys.argv[1] == "--die":
        die_mid_stream(json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        raise SystemExit("unreachable: the child should have exited mid-stream")
    args = json.loads(sys.argv[1])
    out = {"events": []}

    # Partition 0, attempt 0: the task raises after 2 of its batches went out.
    try:
        attempt(args, 0, 0, fail={"partition": 0, "attempt": 0, "after_batches": 2})
        out["events"].append({"what": "raise", "error": None})
    except PushError as e:
        out["events"].append({"what": "raise", "error": str(e)})
    out["rows_after_raise"] = rows_train(args)

    # Partition 1, attempt 0: the executor process dies after 2 batches.
    child = subprocess.run([sys.executable, __file__, "--die", sys.argv[1], "1", "2"], check=False)
    out["events"].append({"what": "die", "exit_code": child.returncode})
    out["rows_after_die"] = rows_train(args)

    # Retries of partitions 0 and 1, first attempts of the others.
    summaries = []
    for pid in range(args["partitions"] - 1):
        summaries.append(attempt(args, pid, 1 if pid in (0, 1) else 0))
    # The last partition through udf_command and the executor's KINDLING_AGENT_ADDRESS.
    last = args["partitions"] - 1
    os.environ["KINDLING_AGENT_ADDRESS"] = args["agents"][last % len(args["agents"])]
    os.environ["KINDLING_NODE_NAME"] = "node-a"
    fn, ddl = udf_command(json.dumps({"job_id": args["job_id"], "token": args["token"]}))
    out["udf_ddl"] = ddl
    fn = push_partition_fn(args["job_id"], token=args["token"], task_info=lambda: (last, 0))
    [row] = list(fn(iter(partition(last, args["rows_per_partition"], args["batch_rows"]))))
    summaries.append(row.to_pylist()[0])
    try:
        udf_command({"job_id": args["job_id"], "agent": "typo"})
        out["udf_unknown_option"] = None
    except PushError as e:
        out["udf_unknown_option"] = str(e)
    out["rows_after_retries"] = rows_train(args)
    # A speculative copy of partition 2 that finishes after the original committed.
    out["speculative"] = attempt(args, 2, 1)
    # A third attempt of partition 0 that dies mid-stream after the commit.
    try:
        attempt(args, 0, 2, fail={"partition": 0, "attempt": 2, "after_batches": 1})
    except PushError:
        pass
    out["summaries"] = summaries
    out["hostname"] = socket.gethostname()
    out["rows_final"] = rows_train(args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
