"""Executor push: Spark executors stream their partitions straight into Kindling agents.

Use with ``DataFrame.mapInArrow``::

    from kindling_client.push import push_partition_fn, SUMMARY_DDL
    fn = push_partition_fn("my-job", token=TOKEN)          # agent from KINDLING_AGENT_ADDRESS
    summary = df.select("x1", "x2", "y").mapInArrow(fn, SUMMARY_DDL).collect()

Each Spark partition is one producer, ``partition-<partition id>``, so a retried
or speculative task attempt cannot add its rows twice: the agent commits a
producer's stream only when it completes cleanly, and acknowledges a later stream
of a committed producer as a duplicate (docs/protocol.md, "DoPut"). This relies
on the partition yielding the same batches on every attempt (a deterministic
plan and the same ``spark.sql.execution.arrow.maxRecordsPerBatch``).

The stream itself is :func:`kindling_client.put_stream` (one implementation of
the exactly-once protocol for every Python producer). Needs only pyarrow (and
pyspark's ``TaskContext`` when run inside Spark): ship the ``kindling_client``
package to the executors as a zip with ``spark.addArtifacts(path, pyfile=True)``
(Spark Connect) or ``--py-files``; the Rust client does so itself.
"""

import json
import os
import socket

import pyarrow as pa

from .agent import AgentClient, put_stream
from .errors import KindlingError

__all__ = [
    "SUMMARY_SCHEMA", "SUMMARY_DDL", "PushError", "agent_id", "node_name", "push_batches", "push_partition_fn",
    "udf_command",
]

#: One row per partition pushed.
SUMMARY_SCHEMA = pa.schema([
    pa.field("partition_id", pa.int32(), nullable=False),
    pa.field("attempt", pa.int32(), nullable=False),
    pa.field("agent", pa.string(), nullable=False),
    pa.field("agent_id", pa.string(), nullable=True),
    pa.field("producer", pa.string(), nullable=False),
    pa.field("batches", pa.int64(), nullable=False),
    pa.field("rows", pa.int64(), nullable=False),
    pa.field("committed_rows", pa.int64(), nullable=False),
    pa.field("duplicate", pa.bool_(), nullable=False),
    pa.field("node", pa.string(), nullable=False),
    pa.field("node_local", pa.bool_(), nullable=False),
])

#: The same schema as a Spark DDL string, for ``mapInArrow(fn, SUMMARY_DDL)``.
SUMMARY_DDL = (
    "partition_id int, attempt int, agent string, agent_id string, producer string, batches long, "
    "rows long, committed_rows long, duplicate boolean, node string, node_local boolean"
)


class PushError(RuntimeError):
    """A partition could not be pushed; the task fails and Spark may retry it."""


def node_name():
    """The node this task runs on: ``KINDLING_NODE_NAME`` (set on executors by
    the pod template or the worker), else the host name."""
    return os.environ.get("KINDLING_NODE_NAME") or socket.gethostname()


def _task_info():
    """(partition id, attempt number) of the running Spark task."""
    try:
        from pyspark import TaskContext
    except ImportError as e:  # pragma: no cover - only outside Spark
        raise PushError("push_partition runs inside a Spark task (pyspark not importable)") from e
    ctx = TaskContext.get()
    if ctx is None:
        raise PushError("push_partition runs inside a Spark task: no TaskContext")
    return ctx.partitionId(), ctx.attemptNumber()


def _choose_agent(partition_id, agents, *, node_local=False, job_id=None, token=None, timeout=60.0):
    """The Flight address partition ``partition_id`` goes to.

    - ``node_local``: the agent at ``KINDLING_AGENT_ADDRESS`` (the executor's
      node) when it runs the job; otherwise ``agents[partition_id % len(agents)]``.
    - ``agents`` alone: ``agents[partition_id % len(agents)]``.
    - neither: ``KINDLING_AGENT_ADDRESS``.
    """
    local = os.environ.get("KINDLING_AGENT_ADDRESS")
    if agents and node_local and local:
        try:
            agent_id(local, job_id, token, timeout)
            return local
        except PushError:
            pass  # the node's agent is not part of this job (or unreachable): spread by partition
    if agents:
        return agents[partition_id % len(agents)]
    if not local:
        raise PushError(
            "no agent address: set KINDLING_AGENT_ADDRESS on the executors "
            "(pod template: the node's agent) or pass agents=[...]"
        )
    return local


def _allow_plaintext():
    return os.environ.get("KINDLING_ALLOW_PLAINTEXT_TOKEN", "").lower() in ("1", "true", "yes")


def _agent(address, token, timeout, error=None):
    """An :class:`AgentClient` of ``address`` for an executor: TLS for
    ``https://`` / ``grpc+tls://`` with ``KINDLING_TLS_CA`` (and
    ``KINDLING_TLS_CERT``/``KINDLING_TLS_KEY`` for mutual TLS,
    ``KINDLING_TLS_SERVER_NAME`` when agents are dialled by IP); a token is
    never sent in plaintext off loopback unless
    ``KINDLING_ALLOW_PLAINTEXT_TOKEN`` is set. A refusal raises ``error``
    (:class:`PushError` unless given)."""
    try:
        return AgentClient(address, token=token, timeout=timeout, allow_plaintext_token=_allow_plaintext())
    except ValueError as e:
        raise (error or PushError)(f"{e} (or set KINDLING_ALLOW_PLAINTEXT_TOKEN=1)") from e


def push_batches(address, job_id, batches, *, producer, token=None, split="train", attempt=0,
                 columns=None, timeout=None, after_batch=None):
    """Streams ``batches`` to one agent as ``producer`` and commits them.

    Returns ``(batches, rows, final_ack)``; ``final_ack`` is ``None`` when there
    was nothing to send (no stream is opened for an empty partition). A failure
    abandons the stream so the agent keeps none of its rows, then raises
    :class:`PushError` (or what ``after_batch`` raised). ``after_batch(n)``
    runs once the agent acknowledged the ``n``-th batch.
    """
    def nonempty():
        for batch in batches:
            if columns is not None:
                batch = batch.select(columns)
            if batch.num_rows > 0:
                yield batch

    it = nonempty()
    first = next(it, None)
    if first is None:
        return 0, 0, None
    sent = {"batches": 0, "rows": 0}

    def counted():
        for batch in _chain(first, it):
            sent["rows"] += batch.num_rows
            yield batch

    def acked(n):
        sent["batches"] = n
        if after_batch is not None:
            after_batch(n)

    agent = _agent(address, token, timeout)
    try:
        result = put_stream(agent, job_id, split, producer, counted(), attempt=attempt, after_batch=acked)
    except KindlingError as e:
        raise PushError(f"{producer}: push to {address} failed: {e}") from e
    finally:
        agent.close()
    return sent["batches"], sent["rows"], result["final"]


def _chain(first, rest):
    yield first
    yield from rest


def agent_id(address, job_id, token=None, timeout=60.0):
    """The id of the agent serving ``address`` (from its ``job_status``).

    A node-local Service address names a different agent on every node; the id
    tells the driver which agent holds a partition's rows.
    """
    agent = _agent(address, token, timeout)
    try:
        return agent.job_status(job_id)["agent_id"]
    except KindlingError as e:
        raise PushError(f"job_status of `{job_id}` at {address} failed: {e}") from e
    finally:
        agent.close()


def push_partition_fn(job_id, *, token=None, agents=None, split="train", columns=None, timeout=60.0,
                      node_local=False, routes=None, after_batch=None, task_info=None):
    """A ``mapInArrow`` function pushing each partition to its agent.

    - ``agents``: list of Flight addresses; partition ``p`` goes to
      ``agents[p % len(agents)]``. Without it, each executor pushes to
      ``KINDLING_AGENT_ADDRESS`` (its node-local agent).
    - ``node_local``: with ``agents``, push to ``KINDLING_AGENT_ADDRESS`` when
      that agent runs the job, else to ``agents[p % len(agents)]``.
    - ``routes``: ``{partition id: address}``; only these partitions are pushed,
      each to its address (re-sending the partitions of a lost agent). Other
      partitions yield no summary row.
    - ``token``: the cluster's bearer token (else env ``KINDLING_TOKEN``).
    - ``columns``: the columns to send (default: every column of the input).
    - ``after_batch``: ``after_batch(partition_id, attempt, acked)`` runs in
      the task each time the agent acknowledged a batch (progress, or a
      fault injected mid-stream: an exception it raises fails the task and
      the stream is abandoned, nothing of it kept).
    - ``task_info``: a callable returning ``(partition_id, attempt)`` instead
      of Spark's ``TaskContext`` (outside Spark).

    Yields one row of :data:`SUMMARY_SCHEMA` per partition.
    """
    agents = list(agents) if agents else None
    routes = {int(p): a for p, a in routes.items()} if routes is not None else None

    def push_partition(iterator):
        partition_id, attempt = (task_info or _task_info)()
        secret = token or os.environ.get("KINDLING_TOKEN")
        if routes is not None:
            if partition_id not in routes:
                for _ in iterator:  # not re-sent: only drain the input
                    pass
                return
            address = routes[partition_id]
        else:
            address = _choose_agent(partition_id, agents, node_local=node_local, job_id=job_id,
                                    token=secret, timeout=timeout)
        producer = f"partition-{partition_id}"
        acked = None
        if after_batch is not None:
            def acked(n):
                after_batch(partition_id, attempt, n)
        n_batches, rows, final = push_batches(
            address, job_id, iterator, producer=producer, token=secret, split=split, attempt=attempt,
            columns=columns, timeout=timeout, after_batch=acked,
        )
        duplicate = bool(final and final.get("duplicate"))
        committed = 0 if final is None or duplicate else int(final["rows"])
        holder = agent_id(address, job_id, secret, timeout) if final is not None else None
        yield pa.RecordBatch.from_pylist([{
            "partition_id": partition_id, "attempt": attempt, "agent": address, "agent_id": holder,
            "producer": producer,
            "batches": n_batches, "rows": rows, "committed_rows": committed, "duplicate": duplicate,
            "node": node_name(), "node_local": address == os.environ.get("KINDLING_AGENT_ADDRESS"),
        }], schema=SUMMARY_SCHEMA)

    return push_partition


def udf_command(config):
    """``(push_partition_fn, output_schema)`` from a JSON-able config dict; the
    schema is the Spark DDL string :data:`SUMMARY_DDL`.

    For a driver that builds the ``mapInArrow`` plan itself (the Rust client's
    MapPartitions relation pickles the call ``udf_command("<json>")``):
    ``config`` holds ``job_id`` and optionally ``token``, ``agents``, ``split``,
    ``columns``, ``timeout``, ``node_local``, ``routes`` (see
    :func:`push_partition_fn`) and ``after_batch``: ``{"function":
    "module:name", "args": <JSON>}``, a function importable in the task (a
    module the driver added to the session) called as ``name(args,
    partition_id, attempt, acked)`` after each acknowledged batch.
    """
    if isinstance(config, (str, bytes)):
        config = json.loads(config)
    allowed = {"job_id", "token", "agents", "split", "columns", "timeout", "node_local", "routes", "after_batch"}
    unknown = set(config) - allowed
    if unknown:
        raise PushError(f"udf_command: unknown option(s) {sorted(unknown)}; known: {sorted(allowed)}")
    if "job_id" not in config:
        raise PushError("udf_command: `job_id` is required")
    kwargs = {k: v for k, v in config.items() if k != "job_id"}
    if "after_batch" in kwargs:
        kwargs["after_batch"] = _imported_hook(kwargs["after_batch"])
    return push_partition_fn(config["job_id"], **kwargs), SUMMARY_DDL


def _imported_hook(spec):
    """``after_batch`` of :func:`udf_command`'s config as a callable."""
    try:
        module, name = spec["function"].split(":", 1)
        args = spec.get("args")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise PushError(f"udf_command: after_batch must be {{'function': 'module:name', 'args': ...}}, got {spec!r}") from e

    def hook(partition_id, attempt, acked):
        import importlib
        return getattr(importlib.import_module(module), name)(args, partition_id, attempt, acked)

    return hook
