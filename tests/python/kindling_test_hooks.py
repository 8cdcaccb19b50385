"""Faults injected into executor push from the tests (shipped to the Spark
session only by the Rust client's `test-hooks` feature, never with the
package): `after_batch(args, partition_id, attempt, acked)` as
`kindling_client.push` calls it after each acknowledged batch.

`args`: `{"fail": {"partition", "attempt", "after_batches"}, "stall":
{"partition", "attempt", "after_batches", "marker"}}`, each optional. A fail
raises after that many acknowledged batches (the task fails mid-stream); a
stall writes the Python worker's pid to `marker` and waits an hour, for the
test to SIGKILL its executor.
"""

import os
import time


def _is(rule, partition_id, attempt, acked):
    return (rule is not None and rule["partition"] == partition_id and rule.get("attempt", 0) == attempt
            and acked == rule["after_batches"])


def after_batch(args, partition_id, attempt, acked):
    args = args or {}
    if _is(args.get("fail"), partition_id, attempt, acked):
        raise RuntimeError(f"injected failure: partition-{partition_id} attempt {attempt} after {acked} batches")
    stall = args.get("stall")
    if _is(stall, partition_id, attempt, acked):
        marker = stall["marker"]
        with open(marker + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(marker + ".tmp", marker)
        time.sleep(3600)
