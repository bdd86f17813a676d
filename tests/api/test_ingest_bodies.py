"""How an ingest body reaches the app (``api/serving.py``): whole when small, streamed past
``WHOLE_BODY_MAX``, chunked or not, on a keep-alive connection shared with other requests, and
a refused request's unread body not leaking into the next one."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from collector_helpers import INGEST, Server, make_windows, metric
from fleetlens.api.serving import WHOLE_BODY_MAX

from fleetlens.batch import encode_batch
from fleetlens.topology import Topology


def _stored(server: Server) -> int:
    with server.client() as c:
        return int(metric(c.get("/metrics").text, "fleetlens_ingest_windows_total"))


def _pieces(body: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(body), size):
        yield body[i : i + size]


@pytest.fixture
def start_ns() -> int:
    return (time.time_ns() // 10**9 - 60) * 10**9


def test_chunked_and_large_bodies_are_stored(server: Server, topo: Topology, start_ns: int) -> None:
    """A batch sent in small chunks without Content-Length, and one whose body is past
    WHOLE_BODY_MAX (streamed to the app), are both stored whole."""
    small = make_windows(topo, "h00", start_ns, n_windows=2, seed=1)
    body, ctype = encode_batch("h00", small, "chunked-1")
    large = make_windows(topo, "h01", start_ns, n_windows=40, sports=8, seed=2)
    big, big_type = encode_batch("h01", large, "large-1", fmt="json")
    assert len(big) > WHOLE_BODY_MAX
    before = _stored(server)
    with server.client(INGEST) as c:
        r = c.post("/v1/ingest", content=_pieces(body, 1000), headers={"Content-Type": ctype})
        assert r.status_code == 200, r.text
        assert r.json()["windows"] == small.num_rows
        assert "content-length" not in r.request.headers  # really chunked
        r = c.post("/v1/ingest", content=big, headers={"Content-Type": big_type})
        assert r.status_code == 200, r.text
        assert r.json()["windows"] == large.num_rows
    assert _stored(server) == before + small.num_rows + large.num_rows


def test_keep_alive_connection_after_a_refusal(
    server: Server, topo: Topology, start_ns: int
) -> None:
    """On one connection: a batch refused before its body is read (no token), a malformed
    one, a read, then a good batch: each answered as alone, the last one stored."""
    t = make_windows(topo, "h02", start_ns, n_windows=1, seed=3)
    body, ctype = encode_batch("h02", t, "keepalive-1")
    before = _stored(server)
    with server.client(None) as c:
        r = c.post("/v1/ingest", content=body, headers={"Content-Type": ctype})
        assert r.status_code == 401, r.text
        auth = {"Authorization": f"Bearer {INGEST}", "Content-Type": ctype}
        r = c.post("/v1/ingest", content=body[: len(body) // 2], headers=auth)
        assert r.status_code == 400, r.text
        assert r.json()["field"] == "body"
        assert c.get("/healthz").status_code == 200
        r = c.post("/v1/ingest", content=body, headers=auth)
        assert r.status_code == 200, r.text
        assert r.json() == {"batch_id": "keepalive-1", "host_id": "h02",
                            "windows": t.num_rows, "stored": True}  # fmt: skip
    assert _stored(server) == before + t.num_rows
