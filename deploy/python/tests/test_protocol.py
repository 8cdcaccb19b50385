"""docs/protocol.md's DoPut acks, end_of_data and errors as pyarrow sees them
(points 4, 5, 6 and 8 of the "any language" contract), against real agents."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any, Dict, List

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from conftest import final_of, linear_spec, rule_table
from kindling_client import (
    AgentClient,
    FailedPrecondition,
    InvalidArgument,
    KindlingError,
    NotFound,
    Unauthenticated,
    Unavailable,
    DeadlineExceeded,
    Unimplemented,
    flight_location,
    put_stream,
)

# The repository's docs/protocol.md (the suite may run from an installed copy).
PROTOCOL = Path(os.environ.get("KINDLING_PROTOCOL_MD") or Path(__file__).resolve().parents[3] / "docs" / "protocol.md")


def started(agent: AgentClient, job_id: str, epochs: int = 2) -> str:
    """A 1-agent job, created and started; returns its rendezvous."""
    rv = agent.create_job(job_id, 1)["rendezvous"]
    agent.start_job(job_id, linear_spec(epochs=epochs), rv)
    return rv


def test_final_acks_count_the_producer_and_the_stream(agents: List[AgentClient], job_id: str) -> None:
    """A producer split over two streams: each final ack's ``rows`` is the
    producer's total so far, ``stream_rows`` this stream's; summing ``rows``
    is refused by end_of_data, summing ``stream_rows`` is right."""
    agent = agents[0]
    started(agent, job_id)
    batches = rule_table(1000, 1).to_batches(max_chunksize=250)
    first = put_stream(agent, job_id, "train", "split", batches[:2])
    second = put_stream(agent, job_id, "train", "split", batches[2:], first_seq=first["next_seq"])
    assert [a["rows"] for a in first["acks"] + second["acks"]] == [250] * 4
    assert [a["seq"] for a in first["acks"] + second["acks"]] == [0, 1, 2, 3]
    f1, f2 = final_of(first), final_of(second)
    assert (f1["rows"], f1["stream_rows"], f1["seq"]) == (500, 500, 1)
    assert (f2["rows"], f2["stream_rows"], f2["seq"]) == (1000, 500, 3)
    assert "stream_rows" not in first["acks"][0]
    # The same two streams again (a retried task): duplicates, nothing stored.
    again = put_stream(agent, job_id, "train", "split", batches[:2])
    assert all(a["duplicate"] for a in again["acks"])
    assert (final_of(again)["duplicate"], final_of(again)["rows"], final_of(again)["stream_rows"]) == (True, 1000, 0)
    assert final_of(again)["bytes"] == 0

    # Adding up the final acks' rows counts the first stream twice: refused,
    # and nothing changes, so end_of_data can be sent again.
    with pytest.raises(FailedPrecondition) as err:
        agent.end_of_data(job_id, "train", expected_rows=f1["rows"] + f2["rows"])
    assert isinstance(err.value.flight_error, pa.ArrowInvalid)
    assert "1000" in str(err.value) and "1500" in str(err.value)
    status = agent.job_status(job_id)
    assert status["rows_train"] == 1000 and status["state"] not in ("failed", "cancelled")
    # More rows may still come after a refused end_of_data; then the retry.
    third = put_stream(agent, job_id, "train", "split", rule_table(100, 2), first_seq=second["next_seq"])
    expected = sum(final_of(r)["stream_rows"] for r in (first, second, again, third))
    assert expected == 1100
    assert agent.end_of_data(job_id, "train", expected_rows=expected)["rows"] == 1100
    # A successful end_of_data is idempotent.
    assert agent.end_of_data(job_id, "train", expected_rows=1100)["rows"] == 1100
    final = agent.wait(job_id, timeout=300)
    assert final["state"] == "succeeded", final["error"]
    assert final["rows_trained_per_epoch"] == [1100, 1100]


def test_keep_rows_writes_a_fed_jobs_rows_once_its_split_ended(agents: List[AgentClient], job_id: str) -> None:
    """``keep_rows`` before the train split ended is refused and keeps
    nothing; after it, it counts the split's rows, and a repeat answers the same."""
    agent = agents[0]
    started(agent, job_id)
    put_stream(agent, job_id, "train", "kept", rule_table(600, 3).to_batches(max_chunksize=200))
    with pytest.raises(FailedPrecondition, match="train split has not ended"):
        agent.keep_rows(job_id)
    assert agent.end_of_data(job_id, "train", expected_rows=600)["rows"] == 600
    kept = agent.keep_rows(job_id)
    assert (kept["job_id"], kept["rows"]) == (job_id, 600)
    assert kept["bytes"] > 0
    assert kept["train"] == {"producers": {"kept": 600}, "ended": True}
    assert kept["eval"] == {"producers": {}, "ended": False}
    assert kept["start"]["job_id"] == job_id
    assert agent.keep_rows(job_id) == kept
    final = agent.wait(job_id, timeout=300)
    assert final["state"] == "succeeded", final["error"]


def test_ack_bytes_are_the_batch_arrow_bytes(agents: List[AgentClient], job_id: str) -> None:
    """Per batch, ``bytes`` is pyarrow's ``RecordBatch.nbytes`` of the batch
    sent; the final ack's is the sum this stream committed."""
    agent = agents[0]
    started(agent, job_id)
    table = rule_table(1000, 3)
    batches = table.to_batches(max_chunksize=300)  # 300, 300, 300, 100 rows
    result = put_stream(agent, job_id, "train", "bytes", batches)
    assert [a["bytes"] for a in result["acks"]] == [b.nbytes for b in batches]
    assert [a["bytes"] for a in result["acks"]] == [300 * 16, 300 * 16, 300 * 16, 100 * 16]
    assert final_of(result)["bytes"] == sum(b.nbytes for b in batches)
    dup = put_stream(agent, job_id, "train", "bytes", batches)
    assert [a["bytes"] for a in dup["acks"]] == [b.nbytes for b in batches]
    agent.cancel_job(job_id, "done")


def test_data_in_flight_bounded_by_the_acks_bytes(agents: List[AgentClient], job_id: str) -> None:
    """The protocol's recipe: send while the unacknowledged bytes are under a
    window, subtract each ack's ``bytes``. Acks come in ``seq`` order, one
    per batch, once the agent stored it."""
    agent = agents[0]
    started(agent, job_id)
    batches = rule_table(4000, 4).to_batches(max_chunksize=200)
    window = 3 * batches[0].nbytes
    writer, reader = agent.client.do_put(fl.FlightDescriptor.for_path(job_id, "train"), batches[0].schema, options=agent.options)
    in_flight, peak, acked = 0, 0, []
    for seq, batch in enumerate(batches):
        while in_flight + batch.nbytes > window:
            ack = json.loads(reader.read().to_pybytes())
            in_flight -= ack["bytes"]
            acked.append(ack["seq"])
        writer.write_with_metadata(batch, pa.py_buffer(json.dumps({"producer": "w", "seq": seq}).encode()))
        in_flight += batch.nbytes
        peak = max(peak, in_flight)
    writer.done_writing()
    while True:
        buf = reader.read()
        if buf is None:
            break
        ack = json.loads(buf.to_pybytes())
        if ack["committed"]:
            final = ack
        else:
            in_flight -= ack["bytes"]
            acked.append(ack["seq"])
    writer.close()
    assert peak <= window and in_flight == 0
    assert acked == list(range(len(batches)))
    assert final["stream_rows"] == 4000
    agent.cancel_job(job_id, "done")


def test_a_refused_do_put_surfaces_at_close_in_pyarrow(agents: List[AgentClient], job_id: str) -> None:
    """The agent refuses the stream (a label of the wrong type): pyarrow's
    ``reader.read()`` returns None, ``writer.close()`` raises the status — or
    the write raises it, when the refusal arrives while the batch is being
    written."""
    agent = agents[0]
    started(agent, job_id)
    bad = pa.table({"x1": [0.5], "x2": pa.array([0.5], pa.float32()), "y": ["one"]})
    writer, reader = agent.client.do_put(fl.FlightDescriptor.for_path(job_id, "train"), bad.schema, options=agent.options)
    with pytest.raises(pa.ArrowInvalid, match="invalid argument.*`y`"):
        try:
            writer.write_with_metadata(bad.to_batches()[0], pa.py_buffer(b'{"producer": "p", "seq": 0}'))
        except pa.ArrowInvalid:
            raise
        else:
            assert reader.read() is None
            writer.close()
    # The package reads it there too and keeps it.
    with pytest.raises(InvalidArgument) as err:
        put_stream(agent, job_id, "train", "p", bad)
    assert isinstance(err.value.flight_error, pa.ArrowInvalid)
    assert err.value.action == f"DoPut {job_id}/train (p)" and err.value.agent == agent.address
    # A DoPut to a job the agent does not know: NOT_FOUND, also at close().
    with pytest.raises(NotFound):
        put_stream(agent, "no-such-job", "train", "p", rule_table(10, 1))
    agent.cancel_job(job_id, "done")


def test_a_producers_rows_are_read_back_in_order_and_dropped_as_a_growing_gang_hands_them_over(
    agents: List[AgentClient], job_id: str
) -> None:
    """docs/protocol.md, "DoGet: a shard's rows": the rows one producer
    committed, read back with DoGet in its order, put into another agent
    under the same producer, then dropped where they were (``reopen_split``
    with ``drop_producers``); the other producer's rows stay."""
    giver, taker = agents
    started(giver, job_id)
    other = f"{job_id}-taker"
    started(taker, other)
    kept, moved = rule_table(300, 1), rule_table(200, 2)
    put_stream(giver, job_id, "train", "kept", kept.to_batches(max_chunksize=100))
    put_stream(giver, job_id, "train", "moved", moved.to_batches(max_chunksize=50))
    ticket = fl.Ticket(f"{job_id}/train/moved".encode())
    back = giver.client.do_get(ticket, options=giver.options).read_all()
    assert back.column("x1").to_pylist() == moved.column("x1").to_pylist(), "in the producer's order"
    taken = put_stream(taker, other, "train", "moved", back.to_batches())
    assert final_of(taken)["rows"] == 200 and [a["seq"] for a in taken["acks"]][:1] == [0]
    reply = giver.action("reopen_split", {"job_id": job_id, "split": "train", "drop_producers": ["moved"]})
    assert reply["rows"] == 300, reply
    assert giver.end_of_data(job_id, "train", expected_rows=300)["rows"] == 300
    assert taker.end_of_data(other, "train", expected_rows=200)["rows"] == 200
    # A producer name outside the job id's alphabet is refused.
    with pytest.raises(pa.ArrowInvalid, match="invalid producer"):
        giver.client.do_get(fl.Ticket(f"{job_id}/train/a b".encode()), options=giver.options).read_all()
    giver.cancel_job(job_id, "done")
    taker.cancel_job(other, "done")


def _python_blocks(markdown: str) -> List[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def test_the_protocol_doc_do_put_example_runs_and_shows_the_real_error(
    agents: List[AgentClient], addresses: List[str], token: str, job_id: str
) -> None:
    blocks = _python_blocks(PROTOCOL.read_text())
    preamble = blocks[0]
    put_example = next(b for b in blocks if "def put(" in b)
    env: Dict[str, Any] = {}
    preamble = preamble.replace('"grpc+tls://127.0.0.1:50051"', repr(flight_location(addresses[0])))
    for name, var in (("ca.crt", "KINDLING_TLS_CA"), ("tls.crt", "KINDLING_TLS_CERT"), ("tls.key", "KINDLING_TLS_KEY")):
        preamble = preamble.replace(f'pem("{name}")', f"pem({os.environ[var]!r})")
    exec(preamble.replace('"s3cret"', repr(token)), env)
    agent = agents[0]
    started(agent, job_id)
    assert 'JOB = "demo"' in put_example
    exec(put_example.replace('JOB = "demo"', f"JOB = {job_id!r}"), env)
    acks, final = env["acks"], env["final"]
    assert [a["rows"] for a in acks] == [2] and final["committed"] and final["stream_rows"] == 2
    assert env["eod"]["rows"] == 2
    # The same function on a stream the agent refuses raises the agent's error.
    bad = pa.table({"x1": ["a", "b"], "x2": [1.0, 0.2], "y": pa.array([0, 1], pa.int32())})
    with pytest.raises(pa.ArrowInvalid, match="invalid argument.*`x1`"):
        env["put"](bad, "py-bad")
    agent.cancel_job(job_id, "done")


# ----- gRPC codes as pyarrow raises them ------------------------------------


def _raw(agent: AgentClient, name: str, body: Any, options: fl.FlightCallOptions = None) -> None:
    list(agent.client.do_action(fl.Action(name, json.dumps(body).encode()), options=options or agent.options))


def test_not_found_is_arrow_key_error(agents: List[AgentClient], rendezvous: str) -> None:
    agent = agents[0]
    with pytest.raises(pa.ArrowKeyError, match="not found"):
        _raw(agent, "job_status", {"job_id": "never-seen"})
    with pytest.raises(pa.ArrowKeyError):
        _raw(agent, "start_job", {"job_id": "never-created", "spec": linear_spec(), "rendezvous": rendezvous})
    with pytest.raises(NotFound) as err:
        agent.job_status("never-seen")
    assert err.value.code == "NOT_FOUND" and isinstance(err.value.flight_error, pa.ArrowKeyError)


def test_invalid_argument_is_arrow_invalid(agents: List[AgentClient]) -> None:
    agent = agents[0]
    with pytest.raises(pa.ArrowInvalid, match="invalid argument.*create_job"):
        _raw(agent, "train_now", {})
    with pytest.raises(InvalidArgument, match="batch_size") as err:
        agent.start_job("x", {**linear_spec(), "batch_size": 0}, "http://127.0.0.1:1")
    assert isinstance(err.value.flight_error, pa.ArrowInvalid)
    with pytest.raises(pa.ArrowInvalid, match="invalid argument"):
        agent.client.get_flight_info(fl.FlightDescriptor.for_command(b"x"), options=agent.options)


def test_failed_precondition_is_arrow_invalid(agents: List[AgentClient], job_id: str) -> None:
    agent = agents[0]
    started(agent, job_id)
    with pytest.raises(pa.ArrowInvalid, match="precondition failed"):
        agent.client.get_flight_info(fl.FlightDescriptor.for_path(job_id, "model"), options=agent.options)
    with pytest.raises(FailedPrecondition) as err:
        agent.model(job_id)
    assert err.value.action == f"DoGet {job_id}/model"
    agent.cancel_job(job_id, "done")
    with pytest.raises(FailedPrecondition, match="cancelled"):
        agent.end_of_data(job_id, "train")


def test_create_job_with_other_parameters_is_already_exists_not_unavailable(
    agents: List[AgentClient], job_id: str
) -> None:
    agent = agents[0]
    agent.create_job(job_id, 1)
    agent.create_job(job_id, 1)  # the same parameters: idempotent
    with pytest.raises(KindlingError, match="already exists") as err:
        agent.create_job(job_id, 2)
    assert err.value.code == "ALREADY_EXISTS", err.value
    assert not isinstance(err.value, Unavailable), "a client would retry UNAVAILABLE forever"


def test_start_job_with_another_world_size_is_invalid_argument(
    agents: List[AgentClient], job_id: str
) -> None:
    agent = agents[0]
    rv = agent.create_job(job_id, 2)["rendezvous"]
    for slots, says in ((1, "num_slots 1, but the job at the rendezvous has 2"), (3, "has not been resized")):
        with pytest.raises(InvalidArgument, match=says) as err:
            agent.start_job(job_id, linear_spec(num_slots=slots), rv)
        assert err.value.code == "INVALID_ARGUMENT", err.value
    agent.start_job(job_id, linear_spec(num_slots=2), rv)
    agent.cancel_job(job_id, "test over")


def test_a_ganging_job_reports_the_attempt_it_joins_from_1(agents: List[AgentClient], job_id: str) -> None:
    agent = agents[0]
    rv = agent.create_job(job_id, 2)["rendezvous"]  # one agent: it stays ganging
    agent.start_job(job_id, linear_spec(num_slots=2), rv)
    status = agent.job_status(job_id)
    assert (status["state"], status["attempt"], status["rank"]) == ("ganging", 1, None), status
    agent.cancel_job(job_id, "test over")


def test_unauthenticated_is_flight_unauthenticated_error(addresses: List[str]) -> None:
    for token in (None, "wrong"):
        with AgentClient(addresses[0], token) as anonymous:
            with pytest.raises(fl.FlightUnauthenticatedError):
                _raw(anonymous, "list_jobs", {})
            with pytest.raises(Unauthenticated):
                anonymous.list_jobs()


def test_unimplemented_is_arrow_not_implemented_error(agents: List[AgentClient]) -> None:
    with pytest.raises(pa.ArrowNotImplementedError, match="Bearer"):
        agents[0].client.authenticate_basic_token("user", "password", options=agents[0].options)


def test_unavailable_and_deadline_exceeded(agents: List[AgentClient]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with AgentClient(f"127.0.0.1:{port}", "t", timeout=10) as nobody:
        with pytest.raises(fl.FlightUnavailableError):
            _raw(nobody, "list_jobs", {})
        with pytest.raises(Unavailable):
            nobody.list_jobs()
    # A peer that accepts the connection and never answers: the call's
    # timeout passes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        with AgentClient(f"127.0.0.1:{silent.getsockname()[1]}", "t", timeout=0.3) as hasty:
            with pytest.raises(fl.FlightTimedOutError):
                _raw(hasty, "list_jobs", {})
            with pytest.raises(DeadlineExceeded):
                hasty.list_jobs()


def test_every_error_is_a_kindling_error_naming_action_and_agent(agents: List[AgentClient]) -> None:
    with pytest.raises(KindlingError) as err:
        agents[0].cancel_job("never-seen")
    assert str(err.value).startswith(f"cancel_job on {agents[0].address}: ")
    assert err.value.__cause__ is err.value.flight_error
    assert isinstance(err.value, NotFound) and not isinstance(err.value, Unimplemented)


def test_a_producer_failing_mid_stream_leaves_nothing_and_its_retry_commits(
    agents: List[AgentClient], job_id: str
) -> None:
    """``after_batch`` runs after each acknowledged batch; what it raises
    abandons the stream (docs/protocol.md, "Abandoning a stream"): the agent
    keeps none of its rows, and the producer's retry commits every row once."""
    agent = agents[0]
    started(agent, job_id)
    batches = rule_table(1000, 3).to_batches(max_chunksize=250)
    acked: List[int] = []

    def fail_after_two(n: int) -> None:
        acked.append(n)
        if n == 2:
            raise RuntimeError("the task failed")

    with pytest.raises(RuntimeError, match="the task failed"):
        put_stream(agent, job_id, "train", "p", batches, after_batch=fail_after_two)
    assert acked == [1, 2]
    assert agent.job_status(job_id)["rows_train"] == 0
    retry = put_stream(agent, job_id, "train", "p", batches, attempt=1, after_batch=acked.append)
    assert acked == [1, 2, 1, 2, 3, 4]
    assert final_of(retry)["stream_rows"] == 1000
    assert agent.job_status(job_id)["rows_train"] == 1000
