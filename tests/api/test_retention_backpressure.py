"""Retention (raw windows for 24 h, per-minute aggregates for 30 days, with an explicit `now`)
and back-pressure (429 + Retry-After when the writer's queue is full, nothing stored)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from collector_helpers import INGEST, READ, InProcessServer, make_windows, metric
from fleetlens.api import queries
from fleetlens.api.config import DAY_NS, HOUR_NS, MINUTE_NS, Settings
from fleetlens.api.service import Collector

from fleetlens.batch import encode_batch
from fleetlens.topology import Topology

NOW = int(datetime(2026, 6, 1, 12, 0, tzinfo=UTC).timestamp()) * 10**9
PAIR = ("h00/eth0", "h01/eth1")


def _pair(t: pa.Table) -> pa.Table:
    return t.filter(pc.and_(pc.equal(t["src_nic"], PAIR[0]), pc.equal(t["dst_nic"], PAIR[1])))


@pytest.fixture
def collector(tmp_path: Path, inventory: Path):
    c = Collector(Settings(db_path=tmp_path / "ret.duckdb", inventory=str(inventory),
                           insecure_no_auth=True))  # fmt: skip
    c.start(loops=False)
    try:
        yield c
    finally:
        c.stop()


def _insert(c: Collector, t: pa.Table) -> None:
    c.writer.submit_call(lambda s: s.insert_windows_raw(t)).result(30)


def _counts(c: Collector) -> tuple[int, int]:
    con = c.store.read()
    raw = con.execute("SELECT count(*) FROM windows").fetchone()[0]
    agg = con.execute("SELECT count(*) FROM windows_minute").fetchone()[0]
    return raw, agg


def test_raw_for_a_day_then_minutes_for_thirty_days(collector: Collector, topo: Topology) -> None:
    c = collector
    old = make_windows(topo, "h00", NOW - 25 * HOUR_NS, n_windows=3, seed=1)  # folded
    recent = make_windows(topo, "h00", NOW - HOUR_NS, n_windows=3, seed=2)  # stays raw
    ancient = make_windows(topo, "h00", NOW - 31 * DAY_NS, n_windows=3, seed=3)  # dropped
    for t in (old, recent, ancient):
        _insert(c, t)
    out = c.run_retention(NOW)
    assert out["folded_windows"] == old.num_rows + ancient.num_rows
    assert out["dropped_minutes"] > 0
    pairs = len(set(zip(old["src_nic"].to_pylist(), old["dst_nic"].to_pylist(), strict=True)))
    assert _counts(c) == (recent.num_rows, pairs)  # one minute row per pair for `old`

    con = c.store.read()
    row = con.execute(
        "SELECT minute_ns, windows, sent, received, owd_min_ns, owd_max_ns FROM windows_minute "
        "WHERE src_nic = ? AND dst_nic = ?", list(PAIR)).fetchone()  # fmt: skip
    mine = _pair(old)
    assert row[0] == (NOW - 25 * HOUR_NS) // MINUTE_NS * MINUTE_NS
    assert row[1:4] == (
        mine.num_rows,
        pc.sum(mine["sent"]).as_py(),
        pc.sum(mine["received"]).as_py(),
    )
    assert row[4] == pytest.approx(pc.min(mine["owd_min_ns"]).as_py())
    assert row[5] == pytest.approx(pc.max(mine["owd_max_ns"]).as_py())

    # The pair history reads both tiers: the aggregate for the old hour, raw for the recent one.
    pts = queries.pair_owd(c, *PAIR, NOW - 26 * HOUR_NS, NOW, HOUR_NS)
    assert [p.windows for p in pts] == [mine.num_rows, _pair(recent).num_rows]
    assert pts[0].sent == pc.sum(mine["sent"]).as_py()

    # A late window for an already folded minute merges into it (no duplicate minute row).
    late = make_windows(topo, "h00", NOW - 25 * HOUR_NS + 30 * 10**9, seed=4)
    _insert(c, late)
    assert c.run_retention(NOW)["folded_windows"] == late.num_rows
    merged = con.execute(
        "SELECT count(*), sum(windows) FROM windows_minute WHERE src_nic = ? AND dst_nic = ?",
        list(PAIR)).fetchone()  # fmt: skip
    assert merged == (1, mine.num_rows + _pair(late).num_rows)

    # 29 days on, the 25 h old minutes passed 30 days and are gone; the once-recent hour is
    # now a minute aggregate.
    c.run_retention(NOW + 29 * DAY_NS)
    raw, agg = _counts(c)
    assert raw == 0 and agg == pairs
    left = con.execute("SELECT min(minute_ns) FROM windows_minute").fetchone()[0]
    assert left == (NOW - HOUR_NS) // MINUTE_NS * MINUTE_NS


def test_backpressure_429_then_recovers(tmp_path: Path, inventory: Path, topo: Topology) -> None:
    settings = Settings(db_path=tmp_path / "bp.duckdb", inventory=str(inventory),
                        ingest_token=INGEST, read_token=READ, queue_max_batches=2,
                        loop_interval_s=3600)  # fmt: skip
    start = time.time_ns() - 60 * 10**9
    bodies = [encode_batch("h00", make_windows(topo, "h00", start + k * 10**9), f"bp{k}")
              for k in range(3)]  # fmt: skip
    with InProcessServer(settings) as srv:
        gate = threading.Event()
        hold = srv.collector.writer.submit_call(lambda s: gate.wait(30), block=False)
        results: dict[int, int] = {}

        def send(k: int) -> None:
            with srv.client(INGEST) as cl:
                body, ctype = bodies[k]
                results[k] = cl.post("/v1/ingest", content=body,
                                     headers={"Content-Type": ctype}).status_code  # fmt: skip

        waiting = [threading.Thread(target=send, args=(k,)) for k in range(2)]
        try:
            for th in waiting:
                th.start()
            deadline = time.monotonic() + 10
            while srv.collector.writer.depth() < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            with srv.client(INGEST) as cl:
                r = cl.post("/v1/ingest", content=bodies[2][0],
                            headers={"Content-Type": bodies[2][1]})  # fmt: skip
            assert r.status_code == 429, r.text
            assert int(r.headers["Retry-After"]) >= 1
            with srv.client(READ) as cl:
                lag = metric(cl.get("/metrics").text, "fleetlens_writer_lag_seconds")
            assert lag > 0
        finally:
            gate.set()
            hold.result(30)
            for th in waiting:
                th.join(30)
        assert results == {0: 200, 1: 200}
        with srv.client(READ) as cl:
            text = cl.get("/metrics").text
        assert metric(text, "fleetlens_ingest_rejected_batches_total", reason="backpressure") == 1
        assert metric(text, "fleetlens_ingest_batches_total", result="stored") == 2
        # The rejected batch can simply be retried once the writer caught up.
        with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {INGEST}"}) as cl:
            again = cl.post(
                "/v1/ingest", content=bodies[2][0], headers={"Content-Type": bodies[2][1]}
            )
        assert again.status_code == 200 and again.json()["stored"]
