"""Errors of Kindling calls: one class per gRPC status code the agents use.

Every error names the action (``create_job``, ``DoPut``, …) and the agent it
was sent to, and keeps the pyarrow exception it came from as ``flight_error``
(also its ``__cause__``). pyarrow folds several gRPC codes into one exception
class (``ArrowInvalid`` is INVALID_ARGUMENT, FAILED_PRECONDITION,
RESOURCE_EXHAUSTED and OUT_OF_RANGE), so the code is read from the words
Arrow C++ starts the message with (``Flight returned invalid argument error,
with message: …``, ``gRPC returned precondition failed error, …``).
docs/protocol.md, "Errors in each client library", has the table.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Tuple, Type

import pyarrow as pa
import pyarrow.flight as fl

__all__ = [
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
    "grpc_code",
    "from_flight",
]


class KindlingError(RuntimeError):
    """A Kindling call that failed.

    Attributes:
        action: what was called (``start_job``, ``DoPut``, ``DoGet``, …).
        agent: the agent's address.
        code: the gRPC status code's name (``NOT_FOUND``, …), or None when
            the failure did not come from a status (a reply that breaks the
            contract, a job that failed).
        flight_error: the pyarrow exception, when there was one.
    """

    code: Optional[str] = None

    def __init__(
        self,
        message: str,
        *,
        action: str,
        agent: str,
        code: Optional[str] = None,
        flight_error: Optional[BaseException] = None,
    ) -> None:
        super().__init__(f"{action} on {agent}: {message}")
        self.action = action
        self.agent = agent
        if code is not None:
            self.code = code
        self.flight_error = flight_error


class InvalidArgument(KindlingError):
    """INVALID_ARGUMENT: a request, spec, path, schema or batch the agent refuses."""

    code = "INVALID_ARGUMENT"


class NotFound(KindlingError):
    """NOT_FOUND: an unknown job (on the agent or at its rendezvous) or checkpoint."""

    code = "NOT_FOUND"


class FailedPrecondition(KindlingError):
    """FAILED_PRECONDITION: the job is in the wrong state, or ``expected_rows`` differs."""

    code = "FAILED_PRECONDITION"


class Unauthenticated(KindlingError):
    """UNAUTHENTICATED: a missing, malformed or wrong bearer token."""

    code = "UNAUTHENTICATED"


class PermissionDenied(KindlingError):
    """PERMISSION_DENIED."""

    code = "PERMISSION_DENIED"


class Unavailable(KindlingError):
    """UNAVAILABLE: the agent, its rendezvous or a peer cannot be reached; retryable."""

    code = "UNAVAILABLE"


class Cancelled(KindlingError):
    """CANCELLED: the call or the job was cancelled."""

    code = "CANCELLED"


class Aborted(KindlingError):
    """ABORTED: the job's attempt failed under the call."""

    code = "ABORTED"


class DeadlineExceeded(KindlingError):
    """DEADLINE_EXCEEDED: the call's timeout passed."""

    code = "DEADLINE_EXCEEDED"


class Unimplemented(KindlingError):
    """UNIMPLEMENTED: a Flight call the agent does not serve (Handshake, PollFlightInfo)."""

    code = "UNIMPLEMENTED"


class Internal(KindlingError):
    """INTERNAL: the agent failed (an I/O error, a bug)."""

    code = "INTERNAL"


class ProtocolError(KindlingError):
    """The agent's reply does not follow docs/protocol.md."""


class JobFailed(KindlingError):
    """A job ended ``failed`` or ``cancelled`` where success was awaited."""


_BY_CODE: Dict[str, Type[KindlingError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        FailedPrecondition,
        Unauthenticated,
        PermissionDenied,
        Unavailable,
        Cancelled,
        Aborted,
        DeadlineExceeded,
        Unimplemented,
        Internal,
    )
    if cls.code is not None
}

# Arrow C++ prefixes the server's message with these words, one per code
# (arrow/flight/transport/grpc/util_internal.cc).
_MESSAGE_CODES: Tuple[Tuple[str, str], ...] = (
    ("invalid argument", "INVALID_ARGUMENT"),
    ("not found", "NOT_FOUND"),
    ("precondition failed", "FAILED_PRECONDITION"),
    ("unauthenticated", "UNAUTHENTICATED"),
    ("permission denied", "PERMISSION_DENIED"),
    ("unavailable", "UNAVAILABLE"),
    ("cancelled", "CANCELLED"),
    ("aborted", "ABORTED"),
    ("deadline exceeded", "DEADLINE_EXCEEDED"),
    ("unimplemented", "UNIMPLEMENTED"),
    ("internal", "INTERNAL"),
    ("resource exhausted", "RESOURCE_EXHAUSTED"),
    ("out-of-range", "OUT_OF_RANGE"),
    ("already exists", "ALREADY_EXISTS"),
    ("data loss", "DATA_LOSS"),
)
_PREFIX = re.compile(r"(?:gRPC|Flight) (?:returned )?(?P<what>[a-z -]+?) (?:error|call)")

_BY_TYPE: Tuple[Tuple[Type[BaseException], str], ...] = (
    (fl.FlightUnauthenticatedError, "UNAUTHENTICATED"),
    (fl.FlightUnauthorizedError, "PERMISSION_DENIED"),
    (fl.FlightUnavailableError, "UNAVAILABLE"),
    (fl.FlightTimedOutError, "DEADLINE_EXCEEDED"),
    (fl.FlightCancelledError, "CANCELLED"),
    (fl.FlightInternalError, "INTERNAL"),
    (pa.ArrowKeyError, "NOT_FOUND"),
    (pa.ArrowNotImplementedError, "UNIMPLEMENTED"),
)


def grpc_code(err: BaseException) -> Optional[str]:
    """The gRPC status code behind a pyarrow Flight exception, by name."""
    match = _PREFIX.search(str(err))
    if match:
        what = match.group("what")
        for words, code in _MESSAGE_CODES:
            if what.endswith(words):
                return code
    for cls, code in _BY_TYPE:
        if isinstance(err, cls):
            return code
    return None


def from_flight(err: BaseException, *, action: str, agent: str) -> KindlingError:
    """The :class:`KindlingError` for a pyarrow exception of ``action`` on ``agent``."""
    code = grpc_code(err)
    cls = _BY_CODE.get(code or "", KindlingError)
    return cls(str(err), action=action, agent=agent, code=code, flight_error=err)
