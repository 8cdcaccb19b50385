"""Fixtures: a real cluster (a rendezvous and its agents) named by the environment.

``KINDLING_AGENTS`` (comma-separated Flight addresses), ``KINDLING_TOKEN`` and
``KINDLING_RENDEZVOUS``, as ``tests/tests/python_package.rs`` sets them after
starting the cluster. Without them every test is skipped.
"""

from __future__ import annotations

import itertools
import os
from typing import Iterator, List

import numpy as np
import pyarrow as pa
import pytest

from kindling_client import AgentClient, PutAck, PutResult

_ids = itertools.count()


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if os.environ.get("KINDLING_AGENTS"):
        return
    skip = pytest.mark.skip(reason="no cluster: set KINDLING_AGENTS, KINDLING_TOKEN, KINDLING_RENDEZVOUS")
    for item in items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def addresses() -> List[str]:
    return os.environ["KINDLING_AGENTS"].split(",")


@pytest.fixture(scope="session")
def token() -> str:
    return os.environ["KINDLING_TOKEN"]


@pytest.fixture(scope="session")
def rendezvous() -> str:
    return os.environ["KINDLING_RENDEZVOUS"]


@pytest.fixture
def agents(addresses: List[str], token: str) -> Iterator[List[AgentClient]]:
    clients = [AgentClient(a, token, timeout=60) for a in addresses]
    yield clients
    for c in clients:
        c.close()


@pytest.fixture
def job_id(request: pytest.FixtureRequest) -> str:
    """A job id of its own for each test (the cluster is shared)."""
    return f"pkg-{request.node.name.replace('_', '-')[:80]}-{next(_ids)}"


def rule_table(rows: int, seed: int, with_id: bool = False) -> pa.Table:
    """``y = x1 + 2 x2 > 0.1``: linearly separable, so a linear model learns it."""
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(-1, 1, rows)
    x2 = rng.uniform(-1, 1, rows).astype(np.float32)
    y = (x1 + 2 * x2.astype(np.float64) > 0.1).astype(np.int32)
    cols = {"x1": x1, "x2": x2, "y": y}
    if with_id:
        cols = {"id": np.arange(rows, dtype=np.int64), **cols}
    return pa.table(cols)


def linear_spec(epochs: int = 4, num_slots: int = 1) -> dict:
    return {
        "model": {"kind": "linear"},
        "task": {"kind": "classification", "num_classes": 2},
        "loss": "cross_entropy",
        "optimizer": {"kind": "adam", "learning_rate": 0.05},
        "epochs": epochs,
        "batch_size": 32,
        "num_slots": num_slots,
        "seed": 5,
        "features": ["x1", "x2"],
        "label": "y",
    }


def final_of(result: PutResult) -> PutAck:
    """The final ack of a stream that carried batches."""
    final = result["final"]
    assert final is not None, f"no final ack: {result}"
    return final
