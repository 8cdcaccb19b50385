"""``Job``: one training job on a gang of agents, from creation to predictions."""

from __future__ import annotations

import itertools
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import pyarrow as pa

from .agent import TERMINAL_STATES, AgentClient, Batches, Tls, _batches, put_stream
from .errors import JobFailed, KindlingError
from .messages import CreateJobReply, EndOfDataReply, EpochMetrics, JobStatus, StartJobReply

__all__ = ["Job"]


class Job:
    """A job trained by a gang of agents, one rank (and one shard) per agent.

    The sequence of docs/protocol.md: :meth:`create` once (through the first
    agent), :meth:`start` on every agent, :meth:`feed` one shard per agent
    (eval first, if any), :meth:`wait` or :meth:`follow` to the end, then
    :meth:`model` and :meth:`predict`.

    >>> job = Job("demo", ["127.0.0.1:50051", "127.0.0.1:50052"], token="s3cret")  # doctest: +SKIP
    >>> job.create(); job.start(spec)                                             # doctest: +SKIP
    >>> job.feed([shard0, shard1], split="eval")                                 # doctest: +SKIP
    >>> job.feed([shard0, shard1])                                               # doctest: +SKIP
    >>> [h["train_loss"] for h in job.wait()[0]["history"]]                      # doctest: +SKIP
    """

    def __init__(
        self,
        job_id: str,
        agents: Sequence[Union[str, AgentClient]],
        token: Optional[str] = None,
        timeout: Optional[float] = 60.0,
        rendezvous: Optional[str] = None,
        tls: Optional[Tls] = None,
    ) -> None:
        """``agents`` are addresses (``host:port``, ``grpc://…``) or clients;
        ``timeout`` bounds each call of an agent created here; ``rendezvous``
        defaults to the one the first agent is registered with; ``tls`` is the
        TLS material for ``https://`` agents (default: ``Tls.from_env()``)."""
        if not agents:
            raise ValueError("a job needs at least one agent")
        self.job_id = job_id
        self.agents: List[AgentClient] = [
            a if isinstance(a, AgentClient) else AgentClient(a, token, timeout=timeout, tls=tls) for a in agents
        ]
        self.rendezvous = rendezvous
        self.spec: Optional[Dict[str, Any]] = None

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, {[a.address for a in self.agents]!r})"

    def close(self) -> None:
        """Closes every agent's connection."""
        for a in self.agents:
            a.close()

    def create(self, max_attempts: int = 0, gang_timeout_ms: Optional[int] = None) -> CreateJobReply:
        """Creates the job at the rendezvous for ``len(agents)`` slots (idempotent)."""
        reply = self.agents[0].create_job(
            self.job_id,
            len(self.agents),
            max_attempts=max_attempts,
            gang_timeout_ms=gang_timeout_ms,
            rendezvous=self.rendezvous,
        )
        self.rendezvous = reply["rendezvous"]
        return reply

    def start(self, spec: Dict[str, Any]) -> List[StartJobReply]:
        """Starts ``spec`` on every agent; its ``num_slots`` is set to the gang's size."""
        if self.rendezvous is None:
            raise KindlingError(
                "create() the job first, or name its rendezvous", action="start_job", agent=self.agents[0].address
            )
        self.spec = {**spec, "num_slots": len(self.agents)}
        return [a.start_job(self.job_id, self.spec, self.rendezvous) for a in self.agents]

    def feed(
        self,
        shards: Sequence[Batches],
        split: str = "train",
        producer: str = "py",
        batches_per_stream: Optional[int] = None,
        end: bool = True,
    ) -> List[int]:
        """Streams ``shards[i]`` into agent ``i`` as producer ``<producer>-<i>``.

        With ``batches_per_stream``, each shard goes as several ``DoPut``
        streams of that many batches, ``seq`` continued across them, so the
        agent can train on the first rows while the rest arrive. With ``end``,
        finishes the split with ``end_of_data``, passing as ``expected_rows``
        the sum of the final acks' ``stream_rows``. Returns the rows each
        agent committed.
        """
        if len(shards) != len(self.agents):
            raise ValueError(f"{len(shards)} shards for {len(self.agents)} agents")
        committed = []
        for i, (agent, shard) in enumerate(zip(self.agents, shards)):
            name = f"{producer}-{i}"
            batches = _batches(shard)
            schema = shard.schema if isinstance(shard, (pa.Table, pa.RecordBatch)) else None
            seq, rows = 0, 0
            while True:
                chunk = list(itertools.islice(batches, batches_per_stream)) if batches_per_stream else list(batches)
                if not chunk and seq > 0:
                    break
                result = put_stream(agent, self.job_id, split, name, chunk, schema=schema, first_seq=seq)
                if result["final"] is not None:
                    rows += result["final"].get("stream_rows", 0)
                seq = result["next_seq"]
                if not batches_per_stream or not chunk:
                    break
            if end:
                agent.end_of_data(self.job_id, split, expected_rows=rows)
            committed.append(rows)
        return committed

    def end_of_data(self, split: str, expected_rows: Optional[Sequence[int]] = None) -> List[EndOfDataReply]:
        """Ends ``split`` on every agent (``expected_rows[i]`` checked on agent ``i``)."""
        return [
            a.end_of_data(self.job_id, split, None if expected_rows is None else expected_rows[i])
            for i, a in enumerate(self.agents)
        ]

    def status(self) -> List[JobStatus]:
        """Every agent's view of the job, in agent order."""
        return [a.job_status(self.job_id) for a in self.agents]

    def follow(self, timeout: float = 600.0, poll: float = 0.05) -> Iterator[Tuple[int, JobStatus]]:
        """Yields ``(agent index, status)`` whenever an agent's status changes,
        until every agent's is terminal."""
        deadline = time.monotonic() + timeout
        last: List[Optional[JobStatus]] = [None] * len(self.agents)
        while True:
            statuses = self.status()
            for i, s in enumerate(statuses):
                if s != last[i]:
                    last[i] = s
                    yield i, s
            if all(s["state"] in TERMINAL_STATES for s in statuses):
                return
            if time.monotonic() > deadline:
                raise KindlingError(
                    f"job {self.job_id} not done within {timeout}s: {[s['state'] for s in statuses]}",
                    action="job_status",
                    agent=", ".join(a.address for a in self.agents),
                )
            time.sleep(poll)

    def wait(self, timeout: float = 600.0, poll: float = 0.05, check: bool = True) -> List[JobStatus]:
        """Waits until every agent's job is terminal; returns the last statuses.

        With ``check``, raises :class:`~kindling_client.JobFailed` (naming
        the agent and its ``error``) unless every agent ``succeeded``.
        """
        last: Dict[int, JobStatus] = {}
        for i, s in self.follow(timeout=timeout, poll=poll):
            last[i] = s
        statuses = [last[i] for i in range(len(self.agents))]
        if check:
            for agent, s in zip(self.agents, statuses):
                if s["state"] != "succeeded":
                    raise JobFailed(
                        f"job {self.job_id} ended {s['state']}: {s['error']}",
                        action="job_status",
                        agent=agent.address,
                    )
        return statuses

    def history(self) -> List[EpochMetrics]:
        """Per-epoch metrics so far (the first agent's; training loss is the gang's mean)."""
        return self.agents[0].job_status(self.job_id)["history"]

    def cancel(self, reason: str = "") -> List[JobStatus]:
        """Cancels the job on every agent."""
        return [a.cancel_job(self.job_id, reason) for a in self.agents]

    def model(self) -> pa.Table:
        """The trained model's table (every rank holds the same weights)."""
        return self.agents[0].model(self.job_id)

    def predict(self, table: Union[pa.Table, pa.RecordBatch], agent: int = 0) -> pa.Table:
        """Predictions for ``table`` from one agent (any: they hold the same model)."""
        return self.agents[agent].predict(self.job_id, table)
