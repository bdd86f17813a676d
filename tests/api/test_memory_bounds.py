"""The collector's memory parts are bounded by stated settings (issue 29, point 4): DuckDB's
buffer pool by ``duckdb_memory_limit`` set on the collector's connection, the ingest path's
bodies by the writer queue's bound (429 + Retry-After past it, nothing accepted lost), and
every part is exported as ``fleetlens_memory_bytes{part}``."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from collector_helpers import INGEST, InProcessServer, make_windows, metric
from fleetlens.api import memory
from fleetlens.api.config import Settings
from fleetlens.api.service import Collector
from fleetlens.api.store import Store

from fleetlens.batch import CT_ARROW, Batch, encode_batch
from fleetlens.topology import Topology, leaf_spine

NOW = 1_780_000_000 * 10**9
LIMIT = 16 * 2**20


def _limit_bytes(store: Store) -> int:
    rows = store.read().execute("SELECT current_setting('memory_limit')").fetchall()
    number, unit = rows[0][0].split()
    return round(float(number) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit])


def test_the_default_limit_is_on_the_collectors_connection(tmp_path: Path) -> None:
    c = Collector(Settings(db_path=tmp_path / "d.duckdb", insecure_no_auth=True))
    try:
        assert _limit_bytes(c.store) == 2**30  # not DuckDB's 80% of RAM
    finally:
        c.store.close()


@pytest.mark.parametrize("limit", [None, f"{LIMIT // 2**20}MiB"])
def test_duckdb_holds_no_more_than_its_limit(tmp_path: Path, limit: str | None) -> None:
    """The same rows stored with and without the limit: without it DuckDB keeps the blocks
    it wrote (past the limit); with it, it stays within."""
    topo = leaf_spine(hosts=16, nics=8, leaves=8, spines=2)
    store = Store(tmp_path / "m.duckdb", threads=1, memory_limit=limit)
    try:
        for i in range(12):
            host = topo.hosts[i % len(topo.hosts)]
            t = make_windows(topo, host, NOW + i * 8 * 10**9, n_windows=8, seed=i)
            store.insert_batches([Batch(f"b{i}", host, t)], NOW)
        held = memory.duckdb_bytes(store)
        if limit is None:
            assert held > LIMIT, "the rows must be enough to pass the limit"
        else:
            assert _limit_bytes(store) == LIMIT and 0 < held <= LIMIT
    finally:
        store.close()


def _wait(cond, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_ingest_bodies_are_bounded_by_the_writer_queue(
    tmp_path: Path, inventory: Path, topo: Topology
) -> None:
    """With the writer held, batches queue up to its bound and the rest are refused (429 +
    Retry-After): the bodies held are those queued; once the writer runs, every batch
    answered 200 is stored and the ingest part is back to 0."""
    bound = 4
    # The loops' rounds quiet (one a minute): a round's outputs queued while the writer is
    # held would take one of the queue's places, and the first round came ~1 s after the
    # start, as the first requests were being answered (a race lost on a loaded box).
    s = Settings(db_path=tmp_path / "q.duckdb", inventory=str(inventory), ingest_token=INGEST,
                 read_token="r", queue_max_batches=bound, public_metrics=True,
                 loop_interval_s=60.0)  # fmt: skip
    bodies = [encode_batch(h, make_windows(topo, h, NOW + i * 10**9, seed=i), f"q-{h}-{i}")[0]
              for i in range(4) for h in topo.hosts]  # fmt: skip
    headers = {"Authorization": f"Bearer {INGEST}", "Content-Type": CT_ARROW}
    with InProcessServer(s) as srv, ThreadPoolExecutor(len(bodies)) as pool:
        c = srv.collector
        gate = threading.Event()
        c.writer.submit_call(lambda _st: gate.wait(60))  # holds the writer
        _wait(lambda: c.writer.depth() == 0)  # the writer thread took the call

        def post(body: bytes) -> httpx.Response:
            return httpx.post(srv.url + "/v1/ingest", content=body, headers=headers, timeout=60)

        futures: list[Future[httpx.Response]] = [pool.submit(post, b) for b in bodies]
        _wait(lambda: sum(f.done() for f in futures) == len(bodies) - bound)
        scrape = httpx.get(srv.url + "/metrics").text
        held = metric(scrape, "fleetlens_memory_bytes", part="ingest")
        assert 0 < held <= bound * max(len(b) for b in bodies)
        gate.set()
        answers = [f.result() for f in futures]
        busy = [r for r in answers if r.status_code == 429]
        assert sorted(r.status_code for r in answers) == [200] * bound + [429] * len(busy)
        assert all(int(r.headers["Retry-After"]) >= 1 for r in busy)
        ids = {r.json()["batch_id"] for r in answers if r.status_code == 200}
        stored = c.store.read().execute("SELECT batch_id FROM batches").fetchall()
        assert {row[0] for row in stored} == ids  # nothing accepted lost
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "fleetlens_memory_bytes", part="ingest") == 0
        assert metric(text, "fleetlens_memory_bytes", part="lookback") == c.feed.recent.held_bytes()
        assert metric(text, "fleetlens_memory_bytes", part="rss") > 0
