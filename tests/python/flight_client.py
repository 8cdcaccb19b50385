"""A Kindling client written from docs/protocol.md alone: ``pyarrow.flight``
calls only (no grpcio, no import from this repository).

Usage: flight_client.py '<json>' with keys agents (Flight URLs), token,
rendezvous, job_id (created here through the first agent's `create_job`),
rows_per_agent, eval_rows_per_agent. Prints one JSON object with what it observed.
"""

import json
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl


class FlightAgent:
    """One agent: a Flight client and the bearer token on every call."""

    def __init__(self, url, token):
        self.client = fl.FlightClient(url.replace("http://", "grpc://"))
        headers = [(b"authorization", f"Bearer {token}".encode())]
        self.options = fl.FlightCallOptions(headers=headers, timeout=60)

    def action(self, name, body):
        [result] = list(self.client.do_action(fl.Action(name, json.dumps(body).encode()), options=self.options))
        return json.loads(result.body.to_pybytes())

    def create_job(self, job_id, num_slots, max_attempts=0):
        return self.action("create_job", {"job_id": job_id, "num_slots": num_slots, "max_attempts": max_attempts})

    def start_job(self, job_id, spec, rendezvous):
        return self.action("start_job", {"job_id": job_id, "spec": spec, "rendezvous": rendezvous})

    def job_status(self, job_id):
        return self.action("job_status", {"job_id": job_id})

    def end_of_data(self, job_id, split, expected_rows):
        return self.action("end_of_data", {"job_id": job_id, "split": split, "expected_rows": expected_rows})

    def wait_done(self, job_id, timeout):
        deadline = time.monotonic() + timeout
        while (status := self.job_status(job_id))["state"] not in ("succeeded", "failed", "cancelled"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not done within {timeout}s: {status}")
            time.sleep(0.05)
        return status

    def model(self, job_id):
        info = self.client.get_flight_info(fl.FlightDescriptor.for_path(job_id, "model"), options=self.options)
        return self.client.do_get(info.endpoints[0].ticket, options=self.options).read_all()

    def predict(self, job_id, table):
        writer, reader = self.client.do_exchange(fl.FlightDescriptor.for_path(job_id, "predict"), options=self.options)
        writer.begin(table.schema)
        writer.write_table(table)
        writer.done_writing()
        out = reader.read_all()
        writer.close()
        return out

    def close(self):
        self.client.close()


class InjectedFailure(Exception):
    """A producer failing mid-stream, as a failed Spark task would."""


def exchange_refusal(url, token, job_id, table):
    """A DoExchange the agent refuses: where pyarrow raised (the call, begin,
    a write or the read: which one is a race between the call's opening and
    the agent's answer) and the exception's type, as docs/protocol.md says."""
    client = fl.FlightClient(url.replace("http://", "grpc://"))
    options = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())], timeout=60)
    where = "call"
    try:
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_path(job_id, "predict"), options=options)
        where = "begin"
        writer.begin(table.schema)
        where = "write"
        writer.write_table(table)
        writer.done_writing()
        where = "read"
        predicted = reader.read_all()
        return {"where": None, "type": None, "predicted_rows": predicted.num_rows}
    except Exception as e:  # noqa: BLE001 - the type is what is observed
        return {"where": where, "type": type(e).__name__, "message": str(e)}
    finally:
        client.close()


def put_stream(agent, job_id, split, producer, batches, fail_after=None):
    """One stream of ``producer`` (seq from 0): per-batch acks, then the final ack.

    A refused stream gives no more acks (``read()`` is None) and ``close()``
    raises the agent's error. With ``fail_after``, the producer fails after
    that many batches and abandons the stream: one more batch with an
    impossible seq makes the agent refuse it and drop its rows.
    """
    schema = batches[0].schema
    writer, reader = agent.client.do_put(fl.FlightDescriptor.for_path(job_id, split), schema, options=agent.options)
    acks = []
    try:
        for seq, batch in enumerate(batches):
            if fail_after is not None and seq >= fail_after:
                raise InjectedFailure(f"injected failure after {seq} batches of {producer}")
            writer.write_with_metadata(batch, pa.py_buffer(json.dumps({"producer": producer, "seq": seq}).encode()))
            ack = reader.read()
            if ack is None:
                break
            acks.append(json.loads(ack.to_pybytes()))
        else:
            writer.done_writing()
            final = json.loads(reader.read().to_pybytes())
    except InjectedFailure:
        abandon = json.dumps({"producer": producer, "seq": 2**63 - 1}).encode()
        writer.write_with_metadata(pa.RecordBatch.from_pylist([], schema=schema), pa.py_buffer(abandon))
        writer.done_writing()
        while reader.read() is not None:
            pass
        try:
            writer.close()
        except pa.ArrowInvalid:
            pass  # the refusal we asked for
        raise
    writer.close()  # raises the agent's error for a refused stream
    return {"acks": acks, "final": final}


def rule_table(rows, seed, with_id=False):
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(-1, 1, rows)
    x2 = rng.uniform(-1, 1, rows).astype(np.float32)
    y = (x1 + 2 * x2.astype(np.float64) > 0.1).astype(np.int32)
    cols = {"x1": x1, "x2": x2, "y": y}
    if with_id:
        cols = {"id": np.arange(rows, dtype=np.int64), **cols}
    return pa.table(cols)


def main():
    args = json.loads(sys.argv[1])
    job_id = args["job_id"]
    agents = [FlightAgent(url, args["token"]) for url in args["agents"]]
    spec = {
        "model": {"kind": "linear"},
        "task": {"kind": "classification", "num_classes": 2},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "learning_rate": 0.05},
        "epochs": 8, "batch_size": 32, "num_slots": len(agents), "seed": 7,
        "features": ["x1", "x2"], "label": "y",
    }
    created = agents[0].create_job(job_id, len(agents), max_attempts=2)
    # create_job is idempotent for the same parameters.
    created_again = agents[1].create_job(job_id, len(agents), max_attempts=2)
    rendezvous = created["rendezvous"]
    started = [a.start_job(job_id, spec, rendezvous) for a in agents]
    # start_job is idempotent for the same spec.
    again = agents[0].start_job(job_id, spec, args["rendezvous"])

    out = {
        "agent_ids": [s["agent_id"] for s in started],
        "restart_agent_id": again["agent_id"],
        "created": created,
        "created_again": created_again,
    }
    rows, eval_rows = args["rows_per_agent"], args["eval_rows_per_agent"]
    puts = []
    for i, agent in enumerate(agents):
        ev = rule_table(eval_rows, 1000 + i)
        e = put_stream(agent, job_id, "eval", f"py-eval-{i}", ev.to_batches(max_chunksize=250))
        agent.end_of_data(job_id, "eval", expected_rows=e["final"]["stream_rows"])
        train = rule_table(rows, i)
        # A stream that fails after 2 batches is abandoned and stores nothing.
        try:
            put_stream(agent, job_id, "train", f"py-{i}", train.to_batches(max_chunksize=500), fail_after=2)
            aborted = None
        except InjectedFailure as err:
            aborted = str(err)
        rows_after_abort = agent.job_status(job_id)["rows_train"]
        t = put_stream(agent, job_id, "train", f"py-{i}", train.to_batches(max_chunksize=500))
        # The same producer again, as a retried task would: every batch is a duplicate.
        d = put_stream(agent, job_id, "train", f"py-{i}", train.to_batches(max_chunksize=500))
        eod = agent.end_of_data(job_id, "train", expected_rows=t["final"]["stream_rows"])
        puts.append({
            "acks": [{k: a[k] for k in ("seq", "rows", "duplicate", "committed")} for a in t["acks"]],
            "final": {k: t["final"][k] for k in ("producer", "rows", "duplicate", "committed")},
            "retry_acks_duplicate": [a["duplicate"] for a in d["acks"]],
            "retry_final": {k: d["final"][k] for k in ("rows", "duplicate", "committed")},
            "eval_final_rows": e["final"]["rows"],
            "end_of_data_rows": eod["rows"],
            "aborted_error": aborted,
            "rows_after_abort": rows_after_abort,
        })
    out["puts"] = puts

    statuses = [a.wait_done(job_id, timeout=300) for a in agents]
    out["states"] = [s["state"] for s in statuses]
    out["rows_train"] = [s["rows_train"] for s in statuses]
    out["rows_eval"] = [s["rows_eval"] for s in statuses]
    out["world_sizes"] = [s["world_size"] for s in statuses]
    out["ranks"] = sorted(s["rank"] for s in statuses)
    out["history"] = statuses[0]["history"]
    out["errors"] = [s["error"] for s in statuses]

    model = agents[0].model(job_id)
    out["model_rows"] = model.num_rows
    out["model_columns"] = model.column_names
    out["model_params"] = [
        {"name": n, "shape": s, "len": len(v)}
        for n, s, v in zip(*[model[c].to_pylist() for c in ("name", "shape", "values")])
    ]

    test = rule_table(1000, 4242, with_id=True)
    pred = agents[1].predict(job_id, test.select(["id", "x1", "x2"]))
    out["predict_rows"] = pred.num_rows
    out["predict_columns"] = pred.column_names
    out["predict_types"] = {f.name: str(f.type) for f in pred.schema}
    out["predict_ids_in_order"] = pred["id"].to_pylist() == test["id"].to_pylist()
    correct = np.asarray(pred["prediction"].to_numpy()) == test["y"].to_numpy()
    out["predict_accuracy"] = float(correct.mean())
    probs = pred["probabilities"].to_pylist()
    out["probabilities_len"] = sorted({len(p) for p in probs})
    out["probabilities_sum_ok"] = all(abs(sum(p) - 1.0) < 1e-4 for p in probs)
    # The model table as docs/protocol.md lays it out: a dense layer's weight
    # is [in, out] row-major and computes x @ W + b; softmax gives the
    # probabilities DoExchange returned.
    params = {
        n: np.asarray(v, dtype=np.float64).reshape(s)
        for n, s, v in zip(*[model[c].to_pylist() for c in ("name", "shape", "values")])
    }
    x = np.stack([test["x1"].to_numpy(), test["x2"].to_numpy().astype(np.float64)], axis=1)
    logits = x @ params["dense.0.weight"] + params["dense.0.bias"]
    mine = np.exp(logits - logits.max(axis=1, keepdims=True))
    mine /= mine.sum(axis=1, keepdims=True)
    out["table_vs_exchange_max_diff"] = float(np.abs(mine - np.asarray(probs)).max())
    # Refused exchanges, as the doc says pyarrow shows them.
    features = test.select(["id", "x1", "x2"])
    out["exchange_wrong_token"] = exchange_refusal(args["agents"][0], "not-the-token", job_id, features)
    out["exchange_unknown_model"] = exchange_refusal(args["agents"][0], args["token"], "no-such-job", features)
    for a in agents:
        a.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
