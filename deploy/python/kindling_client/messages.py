"""The JSON bodies of docs/protocol.md as ``TypedDict`` s (what the agent sends)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict

__all__ = [
    "CreateJobReply",
    "StartJobReply",
    "EndOfDataReply",
    "KeepRowsReply",
    "EpochMetrics",
    "JobStatus",
    "PutAck",
    "PutResult",
]


class CreateJobReply(TypedDict):
    """``create_job``'s reply."""

    job_id: str
    attempt: int
    rendezvous: str


class StartJobReply(TypedDict):
    """``start_job``'s reply."""

    job_id: str
    agent_id: str


class EndOfDataReply(TypedDict):
    """``end_of_data``'s reply: ``rows`` committed for the split on this agent."""

    job_id: str
    split: str
    rows: int


class KeptSplitRows(TypedDict):
    """One split in ``keep_rows``' reply: committed rows by producer, and whether the split ended."""

    producers: Dict[str, int]
    ended: bool


class KeepRowsReply(TypedDict):
    """``keep_rows``'s reply: the ``rows`` (both splits) and ``bytes`` the agent kept on its disk,
    each split's rows by producer, and the job's ``start`` (``start_job``'s body)."""

    job_id: str
    rows: int
    bytes: int
    train: KeptSplitRows
    eval: KeptSplitRows
    start: Dict[str, Any]


class EpochMetrics(TypedDict):
    """One finished epoch in a status' ``history``."""

    epoch: int
    train_loss: float
    rows: int
    eval_loss: Optional[float]
    eval_accuracy: Optional[float]
    samples_per_sec: float
    wall_secs: Optional[float]


class FailedAttempt(TypedDict):
    """An attempt that failed on the agent, in a status' ``failed_attempts``."""

    attempt: int
    cause: str


class StepLoss(TypedDict):
    """One sampled step's loss, in a status' ``step_losses``."""

    epoch: int
    step: int
    loss: float


class JobEvent(TypedDict):
    """A warning or error the agent logged for the job (``events``): show those
    whose ``seq`` is past the last one shown."""

    seq: int
    at_ms: int
    level: str
    agent_id: str
    rank: Optional[int]
    attempt: int
    message: str


class JobStatus(TypedDict):
    """``job_status``: the job as one agent sees it."""

    job_id: str
    agent_id: str
    state: str
    attempt: int
    rank: Optional[int]
    world_size: int
    epoch: int
    epochs: int
    step: int
    steps_per_epoch: int
    loss: Optional[float]
    rows_train: int
    rows_eval: int
    rows_trained_per_epoch: List[int]
    samples_per_sec: float
    cache_bytes_memory: int
    cache_bytes_disk: int
    history: List[EpochMetrics]
    resumed_from_epoch: Optional[int]
    resumed_from_step: Optional[int]
    error: Optional[str]
    device: str
    failed_attempts: List[FailedAttempt]
    step_losses: List[StepLoss]
    events: List[JobEvent]


class _PutAckBase(TypedDict):
    producer: str
    seq: int
    rows: int
    duplicate: bool
    committed: bool
    bytes: int


class PutAck(_PutAckBase, total=False):
    """A ``DoPut`` ack. Per batch: that batch's ``rows`` and ``bytes``. Final
    (``committed``): ``rows`` is the producer's total on the agent,
    ``stream_rows`` and ``bytes`` what this stream committed."""

    stream_rows: int


class PutResult(TypedDict):
    """What :func:`~kindling_client.put_stream` observed: every ack, the
    final one (None for a stream without batches) and the next ``seq``."""

    acks: List[PutAck]
    final: Optional[PutAck]
    next_seq: int
