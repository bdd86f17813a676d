"""The collector client over real HTTP on loopback: a dead collector and malformed answers are
CollectorErrors (retried by the agent), never an exception that kills a thread; the transport
keeps its connection, survives the collector closing it, and sends the token and parameters."""

from __future__ import annotations

import http.server
import itertools
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from fleetlens.client import PAGE, CollectorClient, CollectorError

BAD = [
    b'{"clock": 5}',  # a plan whose clock is not an object
    b'{"clock": {}, "dport": 1, "period_ns": 1, "window_ns": 1, "entries": [{"src_nic": 1}]}',
    b"[1, 2]",  # not an object
    b"not json",
]


@contextmanager
def _serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """An HTTP server on loopback in a thread, for the ``with`` body; its URL."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}"
    finally:
        srv.shutdown()
        th.join(5)


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

    with _serving(Handler) as url:
        yield url, answers


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


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[dict[str, object]]]]:
    """A server that records each request (path, token, connection) and answers ``status``
    (default 200) with ``n`` rows, or with the page ``offset``/``limit`` of ``total`` rows."""
    seen: list[dict[str, object]] = []
    connections = itertools.count()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def setup(self) -> None:  # once per connection
            super().setup()
            self.conn_no = next(connections)

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            params = dict(p.split("=", 1) for p in query.split("&") if p)
            seen.append({"path": path, "params": params, "conn": self.conn_no,
                         "auth": self.headers.get("authorization")})  # fmt: skip
            status = int(params.get("status", 200))
            offset = int(params.get("offset", 0))
            page = min(int(params.get("limit", 0)), int(params.get("total", 0)) - offset)
            n = int(params.get("n", page))
            body = json.dumps([{"i": offset + i} for i in range(n)]).encode()
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            if params.get("close"):  # the server drops the idle connection after answering
                self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    with _serving(Handler) as url:
        yield url, seen


def test_one_connection_token_and_parameters(recorder) -> None:  # type: ignore[no-untyped-def]
    url, seen = recorder
    with CollectorClient(url + "/", "tok") as c:
        assert c.get("/v1/x", n=2, state=None) == [{"i": 0}, {"i": 1}]
        assert c.get("/v1/x", n=1) == [{"i": 0}]
    assert seen[0]["params"] == {"n": "2"}  # None parameters are left out
    assert [s["auth"] for s in seen] == ["Bearer tok"] * 2
    assert seen[0]["conn"] == seen[1]["conn"]  # kept alive


def test_a_closed_idle_connection_is_retried_once_fresh(recorder) -> None:  # type: ignore[no-untyped-def]
    url, seen = recorder
    c = CollectorClient(url, None)
    c.get("/v1/x", n=1, close=1)  # the server answers, then closes the connection
    assert c.get("/v1/x", n=1) == [{"i": 0}]
    assert seen[0]["conn"] != seen[1]["conn"] and seen[1]["auth"] is None
    c.close()


def test_an_error_status_is_a_collector_error_with_the_status(recorder) -> None:  # type: ignore[no-untyped-def]
    url, _ = recorder
    c = CollectorClient(url, "tok")
    with pytest.raises(CollectorError, match="GET /v1/x: 401") as e:
        c.get("/v1/x", status=401)
    assert e.value.status == 401
    assert c.request("GET", "/v1/x", status=429).status_code == 429  # raw: the caller judges
    c.close()


def test_paged_reads_every_page(recorder) -> None:  # type: ignore[no-untyped-def]
    url, seen = recorder
    c = CollectorClient(url, None)
    rows = c.paged("/v1/x", total=2 * PAGE + 5)
    c.close()
    assert [r["i"] for r in rows] == list(range(2 * PAGE + 5))
    assert [s["params"]["offset"] for s in seen] == ["0", str(PAGE), str(2 * PAGE)]


def test_the_client_imports_no_httpx() -> None:
    """The agent's install has no httpx (nor the collector's or the audit's libraries)."""
    code = (
        "import sys, fleetlens.client; "
        "bad = {'httpx', 'duckdb', 'fastapi', 'scipy'} & set(sys.modules); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
