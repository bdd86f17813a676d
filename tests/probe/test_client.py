"""The agent's collector client over real HTTP on loopback: a dead collector and malformed
answers are CollectorErrors (retried by the agent), never an exception that kills a thread."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest
from fleetlens.probe.client import CollectorClient, CollectorError

BAD = [
    b'{"clock": 5}',  # a plan whose clock is not an object
    b'{"clock": {}, "dport": 1, "period_ns": 1, "window_ns": 1, "entries": [{"src_nic": 1}]}',
    b"[1, 2]",  # not an object
    b"not json",
]


@pytest.fixture
def garbage() -> Iterator[tuple[str, list[bytes]]]:
    answers: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answers.pop(0)
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}", answers
    finally:
        srv.shutdown()
        th.join(5)


@pytest.mark.parametrize("body", BAD)
def test_a_malformed_plan_is_a_collector_error(garbage, body: bytes) -> None:  # type: ignore[no-untyped-def]
    url, answers = garbage
    answers.append(body)
    c = CollectorClient(url, None)
    with pytest.raises(CollectorError):
        c.plan("h00")
    c.close()


def test_a_malformed_decision_is_a_collector_error(garbage) -> None:  # type: ignore[no-untyped-def]
    url, answers = garbage
    answers.append(json.dumps({"drain": [{"nic_id": "h00/eth0"}]}).encode())
    c = CollectorClient(url, None)
    with pytest.raises(CollectorError, match="malformed decision"):
        c.decision("h00")
    c.close()


def test_a_dead_collector_is_a_collector_error() -> None:
    c = CollectorClient("http://127.0.0.1:9", None, timeout_s=1.0)  # discard port: refused
    with pytest.raises(CollectorError, match="plan"):
        c.plan("h00")
    c.close()
