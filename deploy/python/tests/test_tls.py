"""Mutual TLS: the cluster of these tests accepts only TLS with a client
certificate of its CA (``KINDLING_TLS_CA``/``_CERT``/``_KEY``)."""

from __future__ import annotations

import json
import os
from typing import List

import pyarrow.flight as fl
import pytest

from kindling_client import AgentClient, KindlingError, Tls, check_plaintext_token, flight_location

needs_tls = pytest.mark.skipif(not os.environ.get("KINDLING_TLS_CA"), reason="the cluster speaks plaintext")


@needs_tls
def test_every_client_here_speaks_tls(addresses: List[str]) -> None:
    assert all(flight_location(a).startswith("grpc+tls://") for a in addresses)


@needs_tls
def test_pyarrow_flight_alone_over_mutual_tls(addresses: List[str], token: str) -> None:
    def read(name: str) -> bytes:
        with open(os.environ[name], "rb") as f:
            return f.read()

    client = fl.FlightClient(
        flight_location(addresses[0]),
        tls_root_certs=read("KINDLING_TLS_CA"),
        cert_chain=read("KINDLING_TLS_CERT"),
        private_key=read("KINDLING_TLS_KEY"),
    )
    options = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())], timeout=30)
    [reply] = list(client.do_action(fl.Action("list_jobs", b"{}"), options=options))
    assert "jobs" in json.loads(reply.body.to_pybytes())
    client.close()


@needs_tls
def test_a_client_without_its_certificate_is_refused(addresses: List[str], token: str) -> None:
    with AgentClient(addresses[0], token, timeout=10, tls=Tls(ca=os.environ["KINDLING_TLS_CA"])) as anonymous:
        with pytest.raises(KindlingError):
            anonymous.list_jobs()


@needs_tls
def test_a_client_trusting_no_ca_is_refused(addresses: List[str], token: str) -> None:
    # pyarrow falls back to the system's roots, which do not sign the cluster.
    with AgentClient(addresses[0], token, timeout=10, tls=Tls()) as unverified:
        with pytest.raises(KindlingError):
            unverified.list_jobs()


def test_a_token_is_never_sent_in_plaintext_off_loopback() -> None:
    with pytest.raises(ValueError, match="plaintext"):
        AgentClient("10.255.0.1:50051", token="s3cret")
    with pytest.raises(ValueError, match="plaintext"):
        check_plaintext_token("grpc://kindling-agent:50051", "s3cret")
    # Loopback, no token, TLS, or explicitly allowed: fine.
    check_plaintext_token("grpc://127.0.0.1:50051", "s3cret")
    check_plaintext_token("grpc://10.255.0.1:50051", None)
    check_plaintext_token("grpc+tls://10.255.0.1:50051", "s3cret")
    check_plaintext_token("grpc://10.255.0.1:50051", "s3cret", allow=True)
