"""A gang job through ``Job``: create, start, feed both shards (split into
several streams), follow to the end with the history, model table, predict."""

from __future__ import annotations

from typing import List

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from conftest import linear_spec, rule_table
from kindling_client import AgentClient, InvalidArgument, Job, JobFailed, NotFound


def test_a_gang_job_runs_from_creation_to_predictions(addresses: List[str], token: str, job_id: str) -> None:
    with Job(job_id, addresses, token=token) as job:
        created = job.create(max_attempts=2)
        assert created["job_id"] == job_id and created["attempt"] == 1
        assert job.create(max_attempts=2) == created  # idempotent
        started = job.start(linear_spec(epochs=6))
        assert len({s["agent_id"] for s in started}) == len(addresses)

        evals = job.feed([rule_table(300, 100 + i) for i in range(len(addresses))], split="eval")
        assert evals == [300] * len(addresses)
        # 2000 rows per agent in batches of 250, two batches per stream: four
        # streams per producer with seq continued, expected_rows summed from
        # the final acks' stream_rows.
        shards = [rule_table(2000, i).to_batches(max_chunksize=250) for i in range(len(addresses))]
        assert job.feed(shards, batches_per_stream=2) == [2000] * len(addresses)

        seen = [(i, s["state"], len(s["history"])) for i, s in job.follow()]
        last = {i: state for i, state, _ in seen}
        assert last == {i: "succeeded" for i in range(len(addresses))}
        statuses = job.wait()
        assert [s["state"] for s in statuses] == ["succeeded"] * len(addresses)
        assert [s["rows_train"] for s in statuses] == [2000] * len(addresses)
        ranks = [s["rank"] for s in statuses]
        assert sorted(r for r in ranks if r is not None) == list(range(len(addresses)))
        history = job.history()
        assert [h["epoch"] for h in history] == list(range(1, 7))
        assert all(h["rows"] == 2000 for h in history)
        assert (history[-1]["eval_accuracy"] or 0.0) > 0.9
        # follow() saw the history grow to one entry per epoch on every agent.
        for i in range(len(addresses)):
            counts = [n for a, _, n in seen if a == i]
            assert counts == sorted(counts) and counts[-1] == 6

        model = job.model()
        assert model.column_names == ["name", "shape", "values"]
        params = {n: np.asarray(v, np.float64).reshape(s) for n, s, v in zip(*[model[c].to_pylist() for c in model.column_names])}
        assert sorted(p.shape for p in params.values()) == [(2,), (2, 2)]

        test = rule_table(500, 4242, with_id=True)
        pred = job.predict(test.select(["id", "x1", "x2"]), agent=len(addresses) - 1)
        assert pred.column_names == ["id", "x1", "x2", "prediction", "probabilities"]
        assert pred["id"].to_pylist() == test["id"].to_pylist()
        accuracy = float((pred["prediction"].to_numpy() == test["y"].to_numpy()).mean())
        assert accuracy > 0.9
        x = np.stack([test["x1"].to_numpy(), test["x2"].to_numpy().astype(np.float64)], axis=1)
        logits = x @ params["dense.0.weight"] + params["dense.0.bias"]
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        assert np.abs(probs - np.asarray(pred["probabilities"].to_pylist())).max() < 1e-5

        # A dictionary-encoded column, even one only passed through, is
        # refused at the schema: no dictionary (nor its deltas) is kept.
        passthrough = test.select(["id", "x1", "x2"])
        coded = passthrough.set_column(0, "id", pc.dictionary_encode(passthrough["id"].cast(pa.string())))
        with pytest.raises(InvalidArgument, match="dictionary-encoded"):
            job.predict(coded, agent=0)

        listed = {j["job_id"]: j["state"] for j in job.agents[0].list_jobs()}
        assert listed[job_id] == "succeeded"


def test_a_cancelled_job_fails_wait_with_its_reason(addresses: List[str], token: str, job_id: str) -> None:
    with Job(job_id, addresses[:1], token=token) as job:
        job.create()
        job.start(linear_spec())
        [cancelled] = job.cancel("no longer needed")
        assert cancelled["state"] == "cancelled"
        with pytest.raises(JobFailed) as err:
            job.wait(timeout=60)
        assert "cancelled" in str(err.value) and err.value.agent == addresses[0]
        assert job.wait(check=False)[0]["state"] == "cancelled"


def test_start_before_create_is_not_found(addresses: List[str], token: str, rendezvous: str, job_id: str) -> None:
    with AgentClient(addresses[0], token) as agent:
        with pytest.raises(NotFound) as err:
            agent.start_job(job_id, linear_spec(), rendezvous)
    assert err.value.action == "start_job" and err.value.agent == addresses[0]
    assert job_id in str(err.value)
