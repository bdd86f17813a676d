"""Group commit over HTTP: the writer stores the batches of many concurrent requests in one
transaction, and still answers each request only after that transaction committed; a batch that
fails inside a group costs its neighbours nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from collector_helpers import INGEST, READ, InProcessServer, make_windows
from fleetlens.api import ingest
from fleetlens.api.config import Settings

from fleetlens.batch import Batch, LayoutIds, encode_batch
from fleetlens.topology import Topology

N = 6


def _bodies(topo: Topology, start: int) -> list[tuple[bytes, str]]:
    """Batch ``g{k}``: one window of host ``k % hosts``, ``k`` seconds after ``start``."""
    hosts = topo.hosts
    return [encode_batch(hosts[k % len(hosts)], make_windows(topo, hosts[k % len(hosts)],
                         start + k * 10**9), f"g{k}") for k in range(N)]  # fmt: skip


def _stored_rows(srv: InProcessServer) -> int:
    return srv.collector.store.read().execute("SELECT count(*) FROM windows").fetchone()[0]


@contextmanager
def _queued_requests(
    srv: InProcessServer, bodies: list[tuple[bytes, str]], results: dict[int, Any]
) -> Iterator[Callable[[], None]]:
    """Post every body at once while the writer is held, so that all of them wait in its queue;
    yields the function that lets the writer go (it then takes them as one group)."""
    gate = threading.Event()
    hold = srv.collector.writer.submit_call(lambda s: gate.wait(30), block=False)

    def send(k: int) -> None:
        with srv.client(INGEST) as cl:
            body, ctype = bodies[k]
            results[k] = cl.post("/v1/ingest", content=body, headers={"Content-Type": ctype})

    senders = [threading.Thread(target=send, args=(k,)) for k in range(len(bodies))]
    for th in senders:
        th.start()
    try:
        deadline = time.monotonic() + 20
        while srv.collector.writer.depth() < len(bodies) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.collector.writer.depth() == len(bodies), "requests did not all queue"
        yield gate.set
    finally:
        gate.set()
        hold.result(30)
        for th in senders:
            th.join(60)


def _settings(tmp_path: Path, inventory: Path) -> Settings:
    return Settings(db_path=tmp_path / "g.duckdb", inventory=str(inventory), ingest_token=INGEST,
                    read_token=READ, loop_interval_s=3600)  # fmt: skip


def test_group_of_many_requests_acks_each_only_after_its_commit(
    tmp_path: Path, inventory: Path, topo: Topology
) -> None:
    bodies = _bodies(topo, time.time_ns() - 60 * 10**9)
    results: dict[int, Any] = {}
    with InProcessServer(_settings(tmp_path, inventory)) as srv:
        store = srv.collector.store
        insert = store.insert_batches
        groups: list[int] = []
        writing, commit = threading.Event(), threading.Event()

        def held_insert(batches: list[Batch], now_ns: int) -> list[bool]:
            groups.append(len(batches))
            writing.set()
            assert commit.wait(30)  # the transaction has not begun: nothing may be acked yet
            return insert(batches, now_ns)

        store.insert_batches = held_insert  # type: ignore[method-assign]
        try:
            with _queued_requests(srv, bodies, results) as release_writer:
                release_writer()
                assert writing.wait(30)
                time.sleep(0.5)  # time for a premature answer to arrive
                assert results == {}, "a request was answered before its batch committed"
                assert _stored_rows(srv) == 0
                commit.set()
        finally:
            commit.set()
        assert groups == [N], "the queued requests were not committed as one group"
        assert sorted(results) == list(range(N))
        for k, r in results.items():
            assert r.status_code == 200, r.text
            assert r.json() == {"batch_id": f"g{k}", "host_id": topo.hosts[k % len(topo.hosts)],
                                "windows": r.json()["windows"], "stored": True}  # fmt: skip
        assert _stored_rows(srv) == sum(r.json()["windows"] for r in results.values())


def test_failing_batch_in_a_group_loses_none_of_the_others(
    tmp_path: Path, inventory: Path, topo: Topology
) -> None:
    start = time.time_ns() // 10**9 * 10**9 - 60 * 10**9
    bodies = _bodies(topo, start)
    bad = 2  # its rows make the transaction fail, alone or in the group
    results: dict[int, Any] = {}
    with InProcessServer(_settings(tmp_path, inventory)) as srv:
        store = srv.collector.store
        insert_windows = store._insert_windows
        groups: list[int] = []

        def failing(tables: list[pa.Table], layouts: Sequence[LayoutIds | None] = ()) -> None:
            table = pa.concat_tables(tables)
            groups.append(table.num_rows)
            insert_windows(tables, layouts)  # written, then the transaction fails: all rolls back
            if start + bad * 10**9 in set(table["start_ns"].to_pylist()):
                raise RuntimeError("disk full")

        store._insert_windows = failing  # type: ignore[method-assign]
        with _queued_requests(srv, bodies, results) as release_writer:
            release_writer()
        assert len(groups) == 1 + N, "want one failed group, then each batch on its own"
        assert sorted(results) == list(range(N))
        for k, r in results.items():
            if k == bad:
                assert r.status_code == 503, r.text
                assert r.headers["Retry-After"] == "5"
                assert r.json()["field"] is None
            else:
                assert r.status_code == 200 and r.json()["stored"], r.text
        good = sum(r.json()["windows"] for k, r in results.items() if k != bad)
        assert _stored_rows(srv) == good
        ids = store.read().execute("SELECT batch_id FROM batches ORDER BY batch_id").fetchall()
        # The failed batch's id is not remembered: the agent's retry is stored.
        assert [i for (i,) in ids] == [f"g{k}" for k in range(N) if k != bad]
        store._insert_windows = insert_windows  # type: ignore[method-assign]
        with srv.client(INGEST) as cl:
            body, ctype = bodies[bad]
            again = cl.post("/v1/ingest", content=body, headers={"Content-Type": ctype})
        assert again.status_code == 200 and again.json()["stored"], again.text


def test_large_bodies_decode_off_the_event_loop(
    tmp_path: Path, inventory: Path, topo: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past INLINE_DECODE_BYTES a body is decoded on the decoding thread, with the same
    answers: stored, or refused naming the field."""
    monkeypatch.setattr(ingest, "INLINE_DECODE_BYTES", 0)
    good, ctype = _bodies(topo, time.time_ns() - 60 * 10**9)[0]
    bad_rows = make_windows(topo, "h00", time.time_ns() - 60 * 10**9)
    bad_rows = bad_rows.set_column(6, "received", pa.array([10**6] * bad_rows.num_rows, pa.int32()))
    bad, _ = encode_batch("h00", bad_rows, "bad")
    with InProcessServer(_settings(tmp_path, inventory)) as srv, srv.client(INGEST) as cl:
        ok = cl.post("/v1/ingest", content=good, headers={"Content-Type": ctype})
        refused = cl.post("/v1/ingest", content=bad, headers={"Content-Type": ctype})
        threads = {t.name for t in threading.enumerate()}
    assert ok.status_code == 200 and ok.json()["stored"], ok.text
    assert refused.status_code == 422 and refused.json()["field"] == "received", refused.text
    assert any(name.startswith("fleetlens-decode") for name in threads)
