"""kill -9 of the collector during a stream of batches loses nothing that was acknowledged, and
no batch is ever half stored."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import duckdb
import httpx
from collector_helpers import INGEST, READ, make_windows, start_server

from fleetlens.batch import encode_batch
from fleetlens.topology import Topology


def _stream(
    url: str, bodies: list[tuple[str, bytes, str]], acked: list[str], stop: threading.Event
):
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {INGEST}"}, timeout=10) as c:
        for batch_id, body, ctype in bodies:
            if stop.is_set():
                return
            try:
                r = c.post("/v1/ingest", content=body, headers={"Content-Type": ctype})
            except httpx.TransportError:
                return  # the collector is gone
            if r.status_code == 200:
                acked.append(batch_id)


def test_kill9_loses_nothing_acknowledged(topo: Topology, inventory: Path, tmp_path: Path) -> None:
    server = start_server(tmp_path, inventory)
    base = (time.time_ns() // 10**9 - 3600) * 10**9
    # Batch k holds the windows starting at base + k s, so rows per batch are countable.
    streams: list[list[tuple[str, bytes, str]]] = [[], []]
    for k in range(400):
        host = topo.hosts[k % 2]
        t = make_windows(topo, host, base + k * 10**9, sports=4, seed=k)
        streams[k % 2].append((f"b{k}", *encode_batch(host, t, f"b{k}")))
    rows_per_batch = t.num_rows
    acked: list[list[str]] = [[], []]
    stop = threading.Event()
    threads = [
        threading.Thread(target=_stream, args=(server.url, streams[i], acked[i], stop))
        for i in range(2)
    ]
    try:
        for th in threads:
            th.start()
        deadline = time.monotonic() + 30
        while sum(map(len, acked)) < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.proc.send_signal(signal.SIGKILL)  # mid-stream: requests are in flight
        server.proc.wait(10)
    finally:
        stop.set()
        for th in threads:
            th.join(30)
        server.stop(signal.SIGKILL)
    ok = set(acked[0]) | set(acked[1])
    assert len(ok) >= 40, "the stream did not get going"
    assert len(ok) < 400, "the kill came after the stream ended; nothing was in flight"

    con = duckdb.connect(str(server.db))  # replays the WAL like a restarted collector
    stored = {r[0] for r in con.execute("SELECT batch_id FROM batches").fetchall()}
    per_start = dict(
        con.execute(
            "SELECT (start_ns - ?) // 1000000000, count(*) FROM windows GROUP BY 1", [base]
        ).fetchall()
    )
    con.close()
    assert ok <= stored, f"acknowledged but lost: {sorted(ok - stored)[:5]}"
    # Whole or nothing: every stored batch has all its rows, nothing else is there.
    assert {f"b{k}" for k in per_start} == stored
    assert set(per_start.values()) == {rows_per_batch}

    # And the collector comes back up on the crashed file and serves it.
    again = start_server(tmp_path, inventory, db=server.db)
    try:
        with again.client(READ) as c:
            assert c.get("/healthz").json()["writer_alive"]
            assert len(c.get("/v1/hosts").json()) == len(topo.hosts)
    finally:
        again.stop()
