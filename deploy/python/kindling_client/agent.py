"""``AgentClient``: every Flight call of one Kindling agent (docs/protocol.md)."""

from __future__ import annotations

import ipaddress
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Union

import pyarrow as pa
import pyarrow.flight as fl

from .errors import KindlingError, ProtocolError, from_flight
from .messages import (
    CreateJobReply,
    EndOfDataReply,
    KeepRowsReply,
    JobStatus,
    PutAck,
    PutResult,
    StartJobReply,
)

__all__ = ["AgentClient", "Tls", "flight_location", "put_stream", "TERMINAL_STATES", "ABANDON_SEQ"]

#: The states a job never leaves.
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
#: A ``seq`` no producer reaches: a batch carrying it makes the agent refuse
#: the stream and drop what it staged ("Abandoning a stream").
ABANDON_SEQ = 2**63 - 1

Batches = Union[pa.Table, pa.RecordBatch, Iterable[pa.RecordBatch]]


def flight_location(address: str) -> str:
    """``host:port``, ``http://…`` or ``grpc://…`` as a pyarrow Flight location.

    >>> flight_location("127.0.0.1:50051")
    'grpc://127.0.0.1:50051'
    >>> flight_location("http://10.0.0.7:50051")
    'grpc://10.0.0.7:50051'
    """
    if address.startswith(("grpc://", "grpc+tcp://", "grpc+tls://")):
        return address
    if address.startswith("http://"):
        return "grpc://" + address[len("http://") :]
    if address.startswith("https://"):
        return "grpc+tls://" + address[len("https://") :]
    return "grpc://" + address


def _read(path: Optional[str]) -> Optional[bytes]:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


@dataclass(frozen=True)
class Tls:
    """TLS material for ``https://`` / ``grpc+tls://`` agents (PEM file paths).

    ``ca`` signs the agents' certificates; ``cert``/``key`` are this client's
    certificate for agents that require one (mutual TLS); ``server_name`` is
    the name the agents' certificate carries when they are dialled by IP.
    ``Tls.from_env()`` reads ``KINDLING_TLS_CA``, ``KINDLING_TLS_CERT``,
    ``KINDLING_TLS_KEY`` and ``KINDLING_TLS_SERVER_NAME``.
    """

    ca: Optional[str] = None
    cert: Optional[str] = None
    key: Optional[str] = None
    server_name: Optional[str] = None

    @staticmethod
    def from_env() -> "Optional[Tls]":
        """The TLS material named by ``KINDLING_TLS_*``; ``None`` if none is."""
        env = {k: os.environ.get(f"KINDLING_TLS_{k.upper()}") or None for k in ("ca", "cert", "key", "server_name")}
        return Tls(**env) if any(env.values()) else None

    def client_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of ``pyarrow.flight.FlightClient`` (files read now)."""
        kwargs: Dict[str, Any] = {}
        if self.ca:
            kwargs["tls_root_certs"] = _read(self.ca)
        if self.cert or self.key:
            if not (self.cert and self.key):
                raise ValueError("a client certificate needs its key and a key its certificate")
            kwargs["cert_chain"] = _read(self.cert)
            kwargs["private_key"] = _read(self.key)
        if self.server_name:
            kwargs["override_hostname"] = self.server_name
        return kwargs


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_plaintext_token(location: str, token: Optional[str], allow: bool = False) -> None:
    """Refuses to send ``token`` over plaintext to a host that is not loopback.

    >>> check_plaintext_token("grpc://127.0.0.1:1", "t")
    >>> check_plaintext_token("grpc://10.0.0.7:1", "t")
    Traceback (most recent call last):
    ...
    ValueError: refusing to send the bearer token in plaintext to grpc://10.0.0.7:1 (not loopback): use https:// (grpc+tls://) with a CA, or allow_plaintext_token=True on a network you trust
    """
    if not token or allow or location.startswith("grpc+tls://"):
        return
    hostport = location.split("://", 1)[-1]
    host = hostport.rsplit(":", 1)[0] if hostport.count(":") <= 1 or hostport.startswith("[") else hostport
    if not _is_loopback(host):
        raise ValueError(
            f"refusing to send the bearer token in plaintext to {location} (not loopback): "
            "use https:// (grpc+tls://) with a CA, or allow_plaintext_token=True on a network you trust"
        )


class AgentClient:
    """Flight client of one agent, with the bearer token on every call.

    Every failed call raises a :class:`~kindling_client.KindlingError`
    subclass naming the action and this agent, with the pyarrow exception as
    ``flight_error``.

    >>> agent = AgentClient("127.0.0.1:50051", token="s3cret")   # doctest: +SKIP
    >>> agent.job_status("demo")["state"]                          # doctest: +SKIP
    'training'
    """

    def __init__(
        self,
        address: str,
        token: Optional[str] = None,
        timeout: Optional[float] = None,
        tls: Optional[Tls] = None,
        allow_plaintext_token: bool = False,
    ) -> None:
        """Connects lazily to ``address``; ``timeout`` (seconds) bounds every call.

        ``https://`` and ``grpc+tls://`` addresses use ``tls`` (default:
        ``Tls.from_env()``). A token is never sent in plaintext to a host that
        is not loopback unless ``allow_plaintext_token``.
        """
        self.address = address
        location = flight_location(address)
        check_plaintext_token(location, token, allow_plaintext_token)
        tls = tls if tls is not None else Tls.from_env()
        kwargs = tls.client_kwargs() if tls is not None and location.startswith("grpc+tls://") else {}
        self.client = fl.FlightClient(location, **kwargs)
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self.options = fl.FlightCallOptions(headers=headers, timeout=timeout)

    def __enter__(self) -> "AgentClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AgentClient({self.address!r})"

    def close(self) -> None:
        """Closes the connection."""
        self.client.close()

    # ----- actions -----------------------------------------------------------

    def action(self, name: str, body: Dict[str, Any]) -> Any:
        """One ``DoAction`` with a JSON body; returns its single JSON result."""
        try:
            results = list(
                self.client.do_action(fl.Action(name, json.dumps(body).encode()), options=self.options)
            )
        except (fl.FlightError, pa.ArrowException) as err:
            raise from_flight(err, action=name, agent=self.address) from err
        if len(results) != 1:
            raise ProtocolError(f"expected one result, got {len(results)}", action=name, agent=self.address)
        return json.loads(results[0].body.to_pybytes())

    def create_job(
        self,
        job_id: str,
        num_slots: int,
        max_attempts: int = 0,
        gang_timeout_ms: Optional[int] = None,
        rendezvous: Optional[str] = None,
    ) -> CreateJobReply:
        """Creates the job at a rendezvous (this agent's own unless named).

        Idempotent for the same parameters. ``max_attempts`` 0 and no
        ``gang_timeout_ms`` take the rendezvous' defaults. Pass the reply's
        ``rendezvous`` to :meth:`start_job`.
        """
        body: Dict[str, Any] = {"job_id": job_id, "num_slots": num_slots, "max_attempts": max_attempts}
        if gang_timeout_ms is not None:
            body["gang_timeout_ms"] = gang_timeout_ms
        if rendezvous is not None:
            body["rendezvous"] = rendezvous
        return self.action("create_job", body)  # type: ignore[no-any-return]

    def start_job(self, job_id: str, spec: Dict[str, Any], rendezvous: str) -> StartJobReply:
        """Joins this agent to the job's gang to train ``spec``; idempotent for the same spec.

        Raises :class:`~kindling_client.NotFound` when the rendezvous does not
        know the job, :class:`~kindling_client.InvalidArgument` for a spec the
        agent refuses.
        """
        return self.action(  # type: ignore[no-any-return]
            "start_job", {"job_id": job_id, "spec": spec, "rendezvous": rendezvous}
        )

    def job_status(self, job_id: str) -> JobStatus:
        """The job as this agent sees it, with the per-epoch ``history``."""
        return self.action("job_status", {"job_id": job_id})  # type: ignore[no-any-return]

    def cancel_job(self, job_id: str, reason: str = "") -> JobStatus:
        """Cancels the job (its gang fails for good) and drops its data here."""
        return self.action("cancel_job", {"job_id": job_id, "reason": reason})  # type: ignore[no-any-return]

    def end_of_data(self, job_id: str, split: str, expected_rows: Optional[int] = None) -> EndOfDataReply:
        """Says no more rows come for ``split`` (``train`` or ``eval``).

        With ``expected_rows``, the agent first checks it holds exactly that
        many committed rows for the split, and otherwise raises
        :class:`~kindling_client.FailedPrecondition` and changes nothing: the
        call can be made again (after more rows, or with the right count).
        """
        body: Dict[str, Any] = {"job_id": job_id, "split": split}
        if expected_rows is not None:
            body["expected_rows"] = expected_rows
        return self.action("end_of_data", body)  # type: ignore[no-any-return]

    def keep_rows(self, job_id: str) -> KeepRowsReply:
        """Has the agent keep the job's rows on its disk (operator token only).

        Once the train split ended (and the eval split, if it was fed): a
        job whose agent restarts on its node then takes its rows back and
        its place in the job with no client to feed it. Raises
        :class:`~kindling_client.FailedPrecondition` before the split ended;
        a repeated call answers what the first kept.
        """
        return self.action("keep_rows", {"job_id": job_id})  # type: ignore[no-any-return]

    def list_jobs(self) -> List[JobStatus]:
        """Every job this agent knows."""
        return self.action("list_jobs", {})["jobs"]  # type: ignore[no-any-return]

    def wait(self, job_id: str, timeout: float = 300.0, poll: float = 0.05) -> JobStatus:
        """Polls :meth:`job_status` until a terminal state; returns that status.

        Raises :class:`~kindling_client.KindlingError` after ``timeout`` seconds.
        """
        for status in self.follow(job_id, timeout=timeout, poll=poll):
            if status["state"] in TERMINAL_STATES:
                return status
        raise AssertionError("follow() ends on a terminal state")

    # Kept for scripts written against the single-module helper.
    wait_done = wait

    def follow(self, job_id: str, timeout: float = 300.0, poll: float = 0.05) -> Iterator[JobStatus]:
        """Yields the job's status each time it changes, the last one terminal."""
        deadline = time.monotonic() + timeout
        last: Optional[JobStatus] = None
        while True:
            status = self.job_status(job_id)
            if status != last:
                yield status
                last = status
            if status["state"] in TERMINAL_STATES:
                return
            if time.monotonic() > deadline:
                raise KindlingError(
                    f"job {job_id} not done within {timeout}s: {status}", action="job_status", agent=self.address
                )
            time.sleep(poll)

    # ----- data --------------------------------------------------------------

    def put(
        self,
        job_id: str,
        split: str,
        producer: str,
        batches: Batches,
        schema: Optional[pa.Schema] = None,
        attempt: int = 0,
        first_seq: int = 0,
    ) -> PutResult:
        """One producer's ``DoPut`` stream; see :func:`put_stream`."""
        return put_stream(
            self, job_id, split, producer, batches, schema=schema, attempt=attempt, first_seq=first_seq
        )

    def model(self, job_id: str, checkpoint: bool = False) -> pa.Table:
        """The trained model's table (``name``, ``shape``, ``values``), or the latest checkpoint's."""
        kind = "checkpoint" if checkpoint else "model"
        try:
            info = self.client.get_flight_info(fl.FlightDescriptor.for_path(job_id, kind), options=self.options)
            return self.client.do_get(info.endpoints[0].ticket, options=self.options).read_all()
        except (fl.FlightError, pa.ArrowException) as err:
            raise from_flight(err, action=f"DoGet {job_id}/{kind}", agent=self.address) from err

    def predict(self, job_id: str, table: Union[pa.Table, pa.RecordBatch]) -> pa.Table:
        """``DoExchange``: ``table``'s rows with ``prediction`` (and ``probabilities``) appended."""
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        action = f"DoExchange {job_id}/predict"
        try:
            writer, reader = self.client.do_exchange(
                fl.FlightDescriptor.for_path(job_id, "predict"), options=self.options
            )
            with writer:
                writer.begin(table.schema)
                for batch in table.to_batches():
                    writer.write_batch(batch)
                writer.done_writing()
                return reader.read_all()
        except (fl.FlightError, pa.ArrowException) as err:
            raise from_flight(err, action=action, agent=self.address) from err


def _batches(data: Batches) -> Iterator[pa.RecordBatch]:
    if isinstance(data, pa.Table):
        return iter(data.to_batches())
    if isinstance(data, pa.RecordBatch):
        return iter([data])
    return iter(data)


def put_stream(
    agent: AgentClient,
    job_id: str,
    split: str,
    producer: str,
    batches: Batches,
    schema: Optional[pa.Schema] = None,
    attempt: int = 0,
    first_seq: int = 0,
    after_batch: Optional[Callable[[int], None]] = None,
) -> PutResult:
    """Streams ``batches`` as ``producer`` with ``seq`` from ``first_seq`` and commits them.

    Reads one ack per batch, then the final ack (``committed: true``;
    ``duplicate: true`` when another stream of this producer committed
    first). A producer split over several streams passes the next stream the
    ``next_seq`` of the previous result. A refused stream raises the
    agent's error: pyarrow reports it only at ``writer.close()``, after
    ``reader.read()`` returned None, so this reads it there.
    ``after_batch(n)`` runs once the agent acknowledged the ``n``-th batch
    (progress; an exception it raises, as a failing task's would, abandons
    the stream and the agent keeps none of its rows).

    Returns ``{"acks", "final", "next_seq"}``.
    """
    action = f"DoPut {job_id}/{split} ({producer})"
    it = _batches(batches)
    first = next(it, None)
    if schema is None:
        if first is None:
            raise KindlingError("no batches and no schema", action=action, agent=agent.address)
        schema = first.schema
    try:
        writer, reader = agent.client.do_put(
            fl.FlightDescriptor.for_path(job_id, split), schema, options=agent.options
        )
    except (fl.FlightError, pa.ArrowException) as err:
        raise from_flight(err, action=action, agent=agent.address) from err
    acks: List[PutAck] = []
    seq = first_seq
    final: Optional[PutAck] = None
    try:
        for batch in _chain(first, it):
            meta = json.dumps({"producer": producer, "seq": seq, "attempt": attempt}).encode()
            writer.write_with_metadata(batch, pa.py_buffer(meta))
            ack = reader.read()
            if ack is None:
                break
            acks.append(json.loads(ack.to_pybytes()))
            seq += 1
            if after_batch is not None:
                after_batch(seq - first_seq)
        else:
            writer.done_writing()
            buf = reader.read()
            if buf is not None:
                final = json.loads(buf.to_pybytes())
    except KindlingError:
        _abandon(writer, reader, producer, schema, attempt)
        raise
    except (fl.FlightError, pa.ArrowException, OSError) as err:
        # A write into a refused stream may fail with a transport error; the
        # agent's own status comes with close().
        real = _close_error(writer) or err
        raise from_flight(real, action=action, agent=agent.address) from real
    except BaseException:
        _abandon(writer, reader, producer, schema, attempt)
        raise
    # A refused stream ends the reader early (read() gives None); close()
    # raises the agent's status.
    try:
        writer.close()
    except (fl.FlightError, pa.ArrowException, OSError) as err:
        raise from_flight(err, action=action, agent=agent.address) from err
    if final is None:
        if seq == first_seq and not acks:
            # A stream without batches commits nothing and gets no final ack.
            return {"acks": acks, "final": None, "next_seq": seq}
        raise ProtocolError(
            f"the stream ended without a final ack after {len(acks)} acks", action=action, agent=agent.address
        )
    if not final.get("committed"):
        raise ProtocolError(f"final ack is not a commit: {final}", action=action, agent=agent.address)
    return {"acks": acks, "final": final, "next_seq": seq}


def _abandon(writer: Any, reader: Any, producer: str, schema: pa.Schema, attempt: int) -> None:
    # close() alone would end the stream cleanly and commit its rows
    # (docs/protocol.md, "Abandoning a stream"): first break the sequence.
    try:
        meta = json.dumps({"producer": producer, "seq": ABANDON_SEQ, "attempt": attempt}).encode()
        writer.write_with_metadata(pa.RecordBatch.from_pylist([], schema=schema), pa.py_buffer(meta))
        writer.done_writing()
        while reader.read() is not None:
            pass
    except (fl.FlightError, pa.ArrowException, OSError):
        pass
    _close_quietly(writer)


def _close_quietly(writer: Any) -> None:
    _close_error(writer)


def _close_error(writer: Any) -> Optional[BaseException]:
    try:
        writer.close()
    except (fl.FlightError, pa.ArrowException, OSError) as err:
        return err
    return None


def _chain(first: Optional[pa.RecordBatch], rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    if first is not None:
        yield first
    yield from rest
