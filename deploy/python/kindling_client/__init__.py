"""Kindling's Python client: a job created, fed, followed and read with
``pyarrow.flight`` alone (the contract is docs/protocol.md).

>>> from kindling_client import Job
>>> job = Job("demo", ["127.0.0.1:50051", "127.0.0.1:50052"], token="s3cret")  # doctest: +SKIP
>>> job.create()                                                              # doctest: +SKIP
>>> job.start(spec)                                                           # doctest: +SKIP
>>> job.feed([shard0, shard1]); job.wait()                                   # doctest: +SKIP
>>> job.model(); job.predict(features)                                       # doctest: +SKIP

Only depends on pyarrow.
"""

from .agent import ABANDON_SEQ, TERMINAL_STATES, AgentClient, Tls, check_plaintext_token, flight_location, put_stream
from .errors import (
    Aborted,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    JobFailed,
    KindlingError,
    NotFound,
    PermissionDenied,
    ProtocolError,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    from_flight,
    grpc_code,
)
from .job import Job
from .messages import (
    CreateJobReply,
    EndOfDataReply,
    KeepRowsReply,
    KeptSplitRows,
    EpochMetrics,
    JobStatus,
    PutAck,
    PutResult,
    StartJobReply,
)

__version__ = "0.1.0"

__all__ = [
    "ABANDON_SEQ",
    "TERMINAL_STATES",
    "AgentClient",
    "Job",
    "Tls",
    "check_plaintext_token",
    "flight_location",
    "put_stream",
    "KindlingError",
    "InvalidArgument",
    "NotFound",
    "FailedPrecondition",
    "Unauthenticated",
    "PermissionDenied",
    "Unavailable",
    "Cancelled",
    "Aborted",
    "DeadlineExceeded",
    "Unimplemented",
    "Internal",
    "ProtocolError",
    "JobFailed",
    "from_flight",
    "grpc_code",
    "CreateJobReply",
    "StartJobReply",
    "EndOfDataReply",
    "KeepRowsReply",
    "KeptSplitRows",
    "EpochMetrics",
    "JobStatus",
    "PutAck",
    "PutResult",
]
