"""A tiny pyarrow.flight helper for Kindling agents (see docs/protocol.md).

Only depends on pyarrow. Used by the tests and by ``kindling_push``; it is also
a readable reference of the Flight contract for other languages.
"""

import json
import time

import pyarrow as pa
import pyarrow.flight as fl

__all__ = ["AgentClient", "KindlingError", "flight_location", "put_stream"]


class KindlingError(RuntimeError):
    """A Kindling call that failed in a way the caller must see."""


def flight_location(address):
    """``host:port``, ``http://…`` or ``grpc://…`` -> a pyarrow Flight location."""
    if address.startswith(("grpc://", "grpc+tcp://", "grpc+tls://")):
        return address
    if address.startswith("http://"):
        return "grpc://" + address[len("http://"):]
    if address.startswith("https://"):
        return "grpc+tls://" + address[len("https://"):]
    return "grpc://" + address


class AgentClient:
    """Flight client for one agent with the bearer token on every call."""

    def __init__(self, address, token=None, timeout=None):
        self.address = address
        self.client = fl.FlightClient(flight_location(address))
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self.options = fl.FlightCallOptions(headers=headers, timeout=timeout)

    def close(self):
        self.client.close()

    def action(self, name, body):
        results = list(
            self.client.do_action(fl.Action(name, json.dumps(body).encode()), options=self.options)
        )
        if len(results) != 1:
            raise KindlingError(f"action {name}: expected one result, got {len(results)}")
        return json.loads(results[0].body.to_pybytes())

    def create_job(self, job_id, num_slots, max_attempts=0, rendezvous=None):
        """Creates the job at the rendezvous (this agent's own unless named);
        returns ``{"job_id", "attempt", "rendezvous"}``."""
        body = {"job_id": job_id, "num_slots": num_slots, "max_attempts": max_attempts}
        if rendezvous is not None:
            body["rendezvous"] = rendezvous
        return self.action("create_job", body)

    def start_job(self, job_id, spec, rendezvous):
        return self.action("start_job", {"job_id": job_id, "spec": spec, "rendezvous": rendezvous})

    def job_status(self, job_id):
        return self.action("job_status", {"job_id": job_id})

    def end_of_data(self, job_id, split, expected_rows=None):
        body = {"job_id": job_id, "split": split}
        if expected_rows is not None:
            body["expected_rows"] = expected_rows
        return self.action("end_of_data", body)

    def wait_done(self, job_id, timeout=300.0, poll=0.05):
        """Polls ``job_status`` until a terminal state; raises after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.job_status(job_id)
            if status["state"] in ("succeeded", "failed", "cancelled"):
                return status
            if time.monotonic() > deadline:
                raise KindlingError(f"job {job_id} not done within {timeout}s: {status}")
            time.sleep(poll)

    def put(self, job_id, split, producer, batches, schema=None, attempt=0):
        """One producer's DoPut stream; returns ``{"acks": [...], "final": {...}}``."""
        return put_stream(self, job_id, split, producer, batches, schema=schema, attempt=attempt)

    def model(self, job_id):
        info = self.client.get_flight_info(fl.FlightDescriptor.for_path(job_id, "model"), options=self.options)
        return self.client.do_get(info.endpoints[0].ticket, options=self.options).read_all()

    def predict(self, job_id, table):
        writer, reader = self.client.do_exchange(
            fl.FlightDescriptor.for_path(job_id, "predict"), options=self.options
        )
        writer.begin(table.schema)
        for batch in table.to_batches():
            writer.write_batch(batch)
        writer.done_writing()
        out = reader.read_all()
        writer.close()
        return out


def put_stream(agent, job_id, split, producer, batches, schema=None, attempt=0, fail_after=None):
    """Streams ``batches`` as ``producer`` (seq 0, 1, …) and commits them.

    Reads one ack per batch, then the final ack (``committed: true``; ``duplicate:
    true`` when another stream of this producer committed first). ``fail_after``
    (tests only) raises after that many batches, as a failing task would; the
    stream is then abandoned and the agent keeps none of its rows.
    """
    batches = iter(batches)
    first = next(batches, None)
    if schema is None:
        if first is None:
            raise KindlingError("put_stream: no batches and no schema")
        schema = first.schema
    writer, reader = agent.client.do_put(
        fl.FlightDescriptor.for_path(job_id, split), schema, options=agent.options
    )
    acks = []
    seq = 0
    try:
        for batch in _chain(first, batches) if first is not None else ():
            if fail_after is not None and seq >= fail_after:
                raise KindlingError(f"injected failure after {seq} batches of {producer}")
            meta = json.dumps({"producer": producer, "seq": seq, "attempt": attempt}).encode()
            writer.write_with_metadata(batch, pa.py_buffer(meta))
            ack = reader.read()
            if ack is None:
                raise KindlingError(f"{producer}: stream closed before the ack of batch {seq}")
            acks.append(json.loads(ack.to_pybytes()))
            seq += 1
        writer.done_writing()
        final = reader.read()
        if final is None:
            raise KindlingError(f"{producer}: no final ack")
        final = json.loads(final.to_pybytes())
    except BaseException:
        # Abandon the stream so that the agent drops its rows. close() alone would
        # end the stream cleanly and commit them (docs/protocol.md, "Abandoning a
        # stream"): first send an empty batch with an impossible seq.
        try:
            meta = json.dumps({"producer": producer, "seq": 2**63 - 1, "attempt": -1}).encode()
            writer.write_with_metadata(pa.RecordBatch.from_pylist([], schema=schema), pa.py_buffer(meta))
            writer.done_writing()
            while reader.read() is not None:
                pass
        except (fl.FlightError, pa.ArrowException, OSError):
            pass
        try:
            writer.close()
        except (fl.FlightError, pa.ArrowException, OSError):
            pass
        raise
    writer.close()
    if not final.get("committed") and not final.get("duplicate"):
        raise KindlingError(f"{producer}: final ack is not a commit: {final}")
    return {"acks": acks, "final": final}


def _chain(first, rest):
    yield first
    yield from rest
