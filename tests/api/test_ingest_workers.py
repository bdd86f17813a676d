"""``--ingest-workers``: ingest served by worker processes that hand checked batches to the
writer process. The same contract as in one process (the ingest tests of ``test_ingest.py``
run again through workers), a 200 only once the batch is committed and readable, and no
acknowledged batch lost when a worker or the whole collector is killed."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import duckdb
import httpx
import pytest
from collector_helpers import INGEST, READ, Server, make_windows, start_server
from test_ingest import (  # noqa: F401  (collected again here, through workers)
    test_auth,
    test_malformed_batches_store_nothing,
    test_register_makes_nics_known,
    test_retried_batch_is_stored_once,
    test_truncated_arrow_and_bad_content_type,
)

from fleetlens.batch import encode_batch
from fleetlens.topology import Topology

WORKERS = ("--ingest-workers", "2")


@pytest.fixture(scope="module")
def server(inventory: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("collector"), inventory, *WORKERS)
    try:
        yield s
    finally:
        s.stop()


def _workers(server: Server) -> list[int]:
    """The collector's child processes (restarted ones are children of another thread)."""
    pid, kids = server.proc.pid, []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(stat.parent.name))
    return sorted(kids)


def _alive(pid: int) -> bool:
    try:  # an exited process not reaped yet is a zombie (Z)
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_http_is_served_by_the_workers(server: Server) -> None:
    workers = _workers(server)
    assert len(workers) == 2
    for w in workers:  # the public port is theirs; the writer process listens on it no more
        assert "fleetlens.api.ingestworker" in Path(f"/proc/{w}/cmdline").read_text()


def test_a_batch_is_readable_when_its_200_arrives(server: Server, topo: Topology) -> None:
    base = (time.time_ns() // 10**9 - 600) * 10**9
    enc = lambda nic: quote(nic, safe="")  # noqa: E731
    with server.client(INGEST) as ing, server.client(READ) as rd:
        for k in range(12):
            t = make_windows(topo, "h01", base + k * 10**9, seed=k)
            body, ctype = encode_batch("h01", t, f"readable-{k}")
            r = ing.post("/v1/ingest", content=body, headers={"Content-Type": ctype})
            assert r.status_code == 200 and r.json()["stored"], r.text
            src, dst = t["src_nic"][0].as_py(), t["dst_nic"][0].as_py()
            pair = (t["src_nic"].to_numpy(zero_copy_only=False) == src) & (
                t["dst_nic"].to_numpy(zero_copy_only=False) == dst
            )
            since, until = base + k * 10**9, base + (k + 1) * 10**9
            got = rd.get(f"/v1/pairs/{enc(src)}/{enc(dst)}/owd",
                         params={"since": since, "until": until, "step": "1s"})  # fmt: skip
            assert got.status_code == 200, got.text
            assert sum(p["windows"] for p in got.json()["points"]) == int(pair.sum())


def _stream(url: str, bodies: list[tuple[str, bytes, str]], acked: list[str],
            stop: threading.Event, retry: bool, errors: list[str]) -> None:  # fmt: skip
    """An agent: posts each batch; ``retry``: again after a failure, as agents do. Answers
    other than 200, 429 and 503 go to ``errors``."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {INGEST}"}, timeout=10) as c:
        for batch_id, body, ctype in bodies:
            while not stop.is_set():
                try:
                    r = c.post("/v1/ingest", content=body, headers={"Content-Type": ctype})
                except httpx.TransportError:
                    if not retry:
                        return  # the collector is gone
                    time.sleep(0.05)
                    continue
                if r.status_code == 200:
                    acked.append(batch_id)
                    break
                if r.status_code not in (429, 503):
                    errors.append(f"{r.status_code} {r.text}")
                time.sleep(0.05)


def _streams(topo: Topology, n: int, base: int) -> tuple[list[list], int]:
    """Two agents' batches; batch k holds the windows starting at base + k s."""
    streams: list[list[tuple[str, bytes, str]]] = [[], []]
    for k in range(n):
        host = topo.hosts[k % 2]
        t = make_windows(topo, host, base + k * 10**9, sports=4, seed=k)
        streams[k % 2].append((f"b{k}", *encode_batch(host, t, f"b{k}")))
    return streams, t.num_rows


def _stored(db: Path, base: int) -> tuple[set[str], dict[int, int]]:
    con = duckdb.connect(str(db))  # replays the WAL like a restarted collector
    try:
        ids = {r[0] for r in con.execute("SELECT batch_id FROM batches").fetchall()}
        sql = "SELECT (start_ns - ?) // 1000000000, count(*) FROM windows GROUP BY 1"
        return ids, dict(con.execute(sql, [base]).fetchall())
    finally:
        con.close()


def _run(server: Server, streams: list[list], retry: bool, until_acked: int, then) -> list[str]:
    acked: list[list[str]] = [[], []]
    errors: list[str] = []
    stop = threading.Event()
    args = [(server.url, streams[i], acked[i], stop, retry, errors) for i in range(2)]
    threads = [threading.Thread(target=_stream, args=a) for a in args]
    try:
        for th in threads:
            th.start()
        deadline = time.monotonic() + 60
        while sum(map(len, acked)) < until_acked and time.monotonic() < deadline:
            time.sleep(0.01)
        then()
    finally:
        if not retry:
            stop.set()
        for th in threads:
            th.join(90)
        stop.set()
    assert not errors, errors[:3]
    return acked[0] + acked[1]


def test_killing_a_worker_loses_nothing_acknowledged(
    topo: Topology, inventory: Path, tmp_path: Path
) -> None:
    server = start_server(tmp_path, inventory, *WORKERS)
    base = (time.time_ns() // 10**9 - 3600) * 10**9
    streams, rows = _streams(topo, 300, base)
    killed: list[int] = []

    def kill_a_worker() -> None:
        killed.append(_workers(server)[0])
        os.kill(killed[0], signal.SIGKILL)

    try:
        acked = _run(server, streams, retry=True, until_acked=30, then=kill_a_worker)
        # the worker was replaced, and ingest went on through the workers
        deadline = time.monotonic() + 30
        while (len(_workers(server)) < 2 or killed[0] in _workers(server)) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert len(_workers(server)) == 2 and killed[0] not in _workers(server)
    finally:
        server.stop()
    assert len(acked) == 300, "every batch is acknowledged in the end (agents retry)"
    stored, per_start = _stored(server.db, base)
    assert set(acked) <= stored, f"acknowledged but lost: {sorted(set(acked) - stored)[:5]}"
    assert {f"b{k}" for k in per_start} == stored and set(per_start.values()) == {rows}


def test_kill9_of_the_writer_process_loses_nothing_acknowledged(
    topo: Topology, inventory: Path, tmp_path: Path
) -> None:
    server = start_server(tmp_path, inventory, *WORKERS)
    workers = _workers(server)
    base = (time.time_ns() // 10**9 - 3600) * 10**9
    streams, rows = _streams(topo, 400, base)

    def kill_the_writer() -> None:
        server.proc.send_signal(signal.SIGKILL)  # mid-stream: requests are in flight
        server.proc.wait(10)

    try:
        acked = _run(server, streams, retry=False, until_acked=40, then=kill_the_writer)
        # the workers notice the writer process is gone and exit
        deadline = time.monotonic() + 20
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, workers))
    finally:
        server.stop(signal.SIGKILL)
    assert 40 <= len(acked) < 400, "the kill came while requests were in flight"
    stored, per_start = _stored(server.db, base)
    assert set(acked) <= stored, f"acknowledged but lost: {sorted(set(acked) - stored)[:5]}"
    assert {f"b{k}" for k in per_start} == stored and set(per_start.values()) == {rows}
