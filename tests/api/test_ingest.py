"""Ingest over real HTTP into a real collector subprocess and DuckDB file: round trip, retries,
malformed batches, auth and registration."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from collector_helpers import (
    FLEETLENS,
    INGEST,
    READ,
    Server,
    make_windows,
    metric,
    start_server,
)
from fleetlens.api.store import Store

from fleetlens.batch import encode_batch
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import Topology


def post(
    server: Server, host: str, table: pa.Table, fmt: str = "arrow", batch_id=None, token=INGEST
):
    body, ctype = encode_batch(host, table, batch_id, fmt)
    with server.client(token) as c:
        return c.post("/v1/ingest", content=body, headers={"Content-Type": ctype})


def stored_windows(server: Server) -> int:
    with server.client(READ) as c:
        return int(metric(c.get("/metrics").text, "fleetlens_ingest_windows_total"))


def test_round_trip_all_formats(topo: Topology, inventory: Path, tmp_path: Path) -> None:
    """What goes in through every encoding comes back out of the DuckDB file bit for bit, and
    the pair history endpoint reports the same counts and delays."""
    server = start_server(tmp_path, inventory)
    start = (time.time_ns() // 10**9 - 120) * 10**9
    sent: list[pa.Table] = []
    try:
        for i, (host, fmt) in enumerate([("h00", "arrow"), ("h01", "msgpack"), ("h02", "json")]):
            t = make_windows(topo, host, start, n_windows=3, seed=i)
            r = post(server, host, t, fmt)
            assert r.status_code == 200, r.text
            assert r.json() == {"batch_id": r.json()["batch_id"], "host_id": host,
                                "windows": t.num_rows, "stored": True}  # fmt: skip
            sent.append(t)
        every = pa.concat_tables(sent)
        src, dst = every["src_nic"][0].as_py(), every["dst_nic"][0].as_py()
        mine = every.filter(
            pc.and_(pc.equal(every["src_nic"], src), pc.equal(every["dst_nic"], dst))
        )
        with server.client(READ) as c:
            url = f"/v1/pairs/{src.replace('/', '%2F')}/{dst.replace('/', '%2F')}/owd"
            r = c.get(url, params={"since": start, "until": start + 3 * 10**9, "step": "1s"})
        assert r.status_code == 200, r.text
        points = r.json()["points"]
        assert [p["t"] for p in points] == [start, start + 10**9, start + 2 * 10**9]
        for k, p in enumerate(points):
            w = mine.filter(pc.equal(mine["start_ns"], start + k * 10**9))
            assert p["windows"] == w.num_rows == 2  # two source ports
            assert p["sent"] == pc.sum(w["sent"]).as_py()
            assert p["received"] == pc.sum(w["received"]).as_py()
            assert p["owd_min_ns"] == pytest.approx(pc.min(w["owd_min_ns"]).as_py())
            assert p["owd_max_ns"] == pytest.approx(pc.max(w["owd_max_ns"]).as_py())
    finally:
        server.stop()
    store = Store(server.db)  # the collector's own decoding of its storage layout
    got = store.read_windows()
    store.close()
    order = [("src_nic", "ascending"), ("dst_nic", "ascending"), ("sport", "ascending"),
             ("start_ns", "ascending")]  # fmt: skip
    assert got.cast(WINDOW_SCHEMA).sort_by(order).equals(every.sort_by(order))


def test_retried_batch_is_stored_once(server: Server, topo: Topology) -> None:
    t = make_windows(topo, "h03", time.time_ns() - 30 * 10**9, seed=5)
    before = stored_windows(server)
    first = post(server, "h03", t, batch_id="retry-me-1")
    again = post(server, "h03", t, batch_id="retry-me-1", fmt="json")
    assert first.status_code == again.status_code == 200
    assert (first.json()["stored"], again.json()["stored"]) == (True, False)
    assert stored_windows(server) - before == t.num_rows
    with server.client(READ) as c:
        text = c.get("/metrics").text
    assert metric(text, "fleetlens_ingest_batches_total", result="duplicate") >= 1


def _json_batch(table: pa.Table, host: str, **change: object) -> bytes:
    rows = table.to_pylist()
    rows[-1].update(change)
    return json.dumps({"batch_id": "bad-1", "host_id": host, "windows": rows}).encode()


MALFORMED = [
    ("wrong type", {"sent": "lots"}, 422, "sent"),
    ("float port", {"sport": 33000.5}, 422, "sport"),
    ("unknown NIC", {"dst_nic": "h99/eth0"}, 422, "dst_nic"),
    ("from the future", {"start_ns": time.time_ns() + 3600 * 10**9}, 422, "start_ns"),
    ("NaN", {"owd_p99_ns": math.nan}, 422, "owd_p99_ns"),
    ("negative count", {"received": -5}, 422, "received"),
    ("negative sent", {"sent": -1, "received": -2}, 422, "sent"),
    ("not my NIC", {"src_nic": "h02/eth0"}, 422, "src_nic"),
]


@pytest.mark.parametrize(
    ("what", "change", "status", "field"), MALFORMED, ids=[m[0] for m in MALFORMED]
)
def test_malformed_batches_store_nothing(
    server: Server, topo: Topology, what: str, change: dict, status: int, field: str
) -> None:
    t = make_windows(topo, "h01", time.time_ns() - 20 * 10**9)
    before = stored_windows(server)
    with server.client(INGEST) as c:
        r = c.post("/v1/ingest", content=_json_batch(t, "h01", **change),
                   headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == status, r.text
    assert r.json()["field"] == field and field in r.json()["detail"]
    assert stored_windows(server) == before  # the good rows of the batch were not stored either


def test_truncated_arrow_and_bad_content_type(server: Server, topo: Topology) -> None:
    t = make_windows(topo, "h01", time.time_ns() - 20 * 10**9)
    body, ctype = encode_batch("h01", t)
    before = stored_windows(server)
    with server.client(INGEST) as c:
        r = c.post("/v1/ingest", content=body[:-40], headers={"Content-Type": ctype})
        assert r.status_code == 400 and r.json()["field"] == "body", r.text
        r = c.post("/v1/ingest", content=body, headers={"Content-Type": "text/plain"})
        assert r.status_code == 415 and r.json()["field"] == "content-type", r.text
        text = c.get("/metrics", headers={"Authorization": f"Bearer {READ}"}).text
    assert stored_windows(server) == before
    assert metric(text, "fleetlens_ingest_rejected_batches_total", reason="decode") >= 1


def test_auth(server: Server, topo: Topology) -> None:
    t = make_windows(topo, "h00", time.time_ns() - 20 * 10**9)
    assert post(server, "h00", t, token=None).status_code == 401
    assert post(server, "h00", t, token="wrong").status_code == 401
    r = post(server, "h00", t, token=READ)
    assert r.status_code == 403 and "read token" in r.json()["detail"]
    reg = {"host_id": "h00", "nics": [{"ifname": "eth0", "ip": "10.0.0.1"}]}
    with server.client(READ) as c:
        assert c.post("/v1/register", json=reg).status_code == 403
    for token, want in ((None, 401), ("nope", 401), (INGEST, 403), (READ, 200)):
        with server.client(token) as c:
            assert c.get("/v1/links").status_code == want, token
            assert c.get("/metrics").status_code == want, token
    with server.client(None) as c:
        assert c.get("/healthz").status_code == 200  # liveness needs no token


def test_refuses_to_start_without_tokens(tmp_path: Path) -> None:
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    r = subprocess.run([FLEETLENS, "collector", "--db", str(tmp_path / "x.db")], env=env,
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode == 2 and "--insecure-no-auth" in r.stderr
    assert not (tmp_path / "x.db").exists()


def test_register_makes_nics_known(server: Server, topo: Topology) -> None:
    """A NIC outside the inventory is rejected until its host registers it."""
    t = make_windows(topo, "h02", time.time_ns() - 20 * 10**9)
    extra = t.slice(0, 1).set_column(0, "src_nic", pa.array(["h02/ib7"]))
    r = post(server, "h02", extra)
    assert r.status_code == 422 and r.json()["field"] == "src_nic"
    reg = {"host_id": "h02", "nics": [{"ifname": "ib7", "ip": "10.9.0.7"}],
           "ts_source": "hardware", "agent_version": "0.1.0"}  # fmt: skip
    with server.client(INGEST) as c:
        r = c.post("/v1/register", json=reg)
    assert r.status_code == 200, r.text
    assert r.json()["nics"] == ["h02/ib7"]
    assert post(server, "h02", extra).status_code == 200
    with server.client(READ) as c:
        nics = {n["nic_id"]: n for n in c.get("/v1/nics", params={"host_id": "h02"}).json()}
    assert nics["h02/ib7"]["ip"] == "10.9.0.7" and nics["h02/ib7"]["leaf"] is None
    with server.client(INGEST) as c:
        bad = c.post(
            "/v1/register", json={"host_id": "h02", "nics": [{"ifname": "a/b", "ip": "x"}]}
        )
    assert bad.status_code == 422 and bad.json()["field"] in ("ifname", "ip")


def test_tokens_from_files(inventory: Path, tmp_path: Path, topo: Topology) -> None:
    (tmp_path / "ingest").write_text("file-ingest\n")
    (tmp_path / "read").write_text("file-read\n")
    files = ["--ingest-token-file", str(tmp_path / "ingest"),
             "--read-token-file", str(tmp_path / "read")]  # fmt: skip
    server = start_server(tmp_path, inventory, *files, env_tokens=False)
    try:
        t = make_windows(topo, "h00", time.time_ns() - 20 * 10**9)
        assert post(server, "h00", t, token="file-ingest").status_code == 200
        assert post(server, "h00", t, token=INGEST).status_code == 401
        with server.client("file-read") as c:
            assert c.get("/v1/links").status_code == 200
    finally:
        server.stop()
