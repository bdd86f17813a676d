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


def _pairs(t: pa.Table) -> int:
    return len(set(zip(t["src_nic"].to_pylist(), t["dst_nic"].to_pylist(), strict=True)))


def test_raw_for_a_day_then_minutes_for_thirty_days(collector: Collector, topo: Topology) -> None:
    c = collector
    old = make_windows(topo, "h00", NOW - 25 * HOUR_NS, n_windows=3, seed=1)  # minutes only
    recent = make_windows(topo, "h00", NOW - HOUR_NS, n_windows=3, seed=2)  # raw and minutes
    ancient = make_windows(topo, "h00", NOW - 31 * DAY_NS, n_windows=3, seed=3)  # dropped
    for t in (old, recent, ancient):
        _insert(c, t)
    out = c.run_retention(NOW)
    assert out["rolled_windows"] == old.num_rows + recent.num_rows + ancient.num_rows
    assert out["deleted_windows"] == old.num_rows + ancient.num_rows
    assert out["dropped_minutes"] == _pairs(ancient)
    pairs = _pairs(old)
    assert _counts(c) == (recent.num_rows, 2 * pairs)  # one minute row per pair and minute

    con = c.store.read()
    row = con.execute(
        "SELECT minute_ns, windows, sent, received, owd_min_ns, owd_max_ns FROM windows_minute "
        "WHERE src_nic = ? AND dst_nic = ? ORDER BY minute_ns LIMIT 1",
        list(PAIR),
    ).fetchone()
    mine = _pair(old)
    assert row[0] == (NOW - 25 * HOUR_NS) // MINUTE_NS * MINUTE_NS
    assert row[1:4] == (
        mine.num_rows,
        pc.sum(mine["sent"]).as_py(),
        pc.sum(mine["received"]).as_py(),
    )
    assert row[4] == pytest.approx(pc.min(mine["owd_min_ns"]).as_py())
    assert row[5] == pytest.approx(pc.max(mine["owd_max_ns"]).as_py())

    # The pair history reads both tiers and gives the same answer whichever split it uses:
    # minute-aligned buckets read the rollups, unaligned ones raw rows where they still exist.
    aligned = queries.pair_owd(c, *PAIR, NOW - 26 * HOUR_NS, NOW, HOUR_NS)
    assert [p.windows for p in aligned] == [mine.num_rows, _pair(recent).num_rows]
    assert aligned[0].sent == pc.sum(mine["sent"]).as_py()
    shifted = queries.pair_owd(c, *PAIR, NOW - 26 * HOUR_NS + 1, NOW, HOUR_NS)

    def totals(pts: list) -> tuple[int, int, int]:
        return tuple(sum(getattr(p, k) for p in pts) for k in ("windows", "sent", "received"))

    assert totals(shifted) == totals(aligned)

    # A late window of an already rolled-up minute merges into it at once (no duplicate row).
    late = make_windows(topo, "h00", NOW - 25 * HOUR_NS + 30 * 10**9, seed=4)
    _insert(c, late)
    merged = con.execute(
        "SELECT count(*), sum(windows) FROM windows_minute WHERE src_nic = ? AND dst_nic = ? "
        "AND minute_ns < ?", [*PAIR, NOW - 2 * HOUR_NS]).fetchone()  # fmt: skip
    assert merged == (1, mine.num_rows + _pair(late).num_rows)
    again = c.run_retention(NOW)
    assert (again["rolled_windows"], again["deleted_windows"]) == (0, late.num_rows)

    # 29 days on, the 25 h old minutes passed 30 days and are gone; the once-recent hour is
    # left as minutes only.
    c.run_retention(NOW + 29 * DAY_NS)
    assert _counts(c) == (0, pairs)
    left = con.execute("SELECT min(minute_ns) FROM windows_minute").fetchone()[0]
    assert left == (NOW - HOUR_NS) // MINUTE_NS * MINUTE_NS


def test_rollup_watermark_survives_restart(tmp_path: Path, inventory: Path, topo: Topology) -> None:
    settings = Settings(db_path=tmp_path / "wm.duckdb", inventory=str(inventory),
                        insecure_no_auth=True)  # fmt: skip
    c = Collector(settings)
    c.start(loops=False)
    t = make_windows(topo, "h01", NOW - HOUR_NS)
    _insert(c, t)
    c.run_retention(NOW)
    c.stop()
    again = Collector(settings)
    again.start(loops=False)
    try:
        # Re-running the pass after a restart must not roll the same minute up twice.
        assert again.run_retention(NOW)["rolled_windows"] == 0
        total = again.store.read().execute("SELECT sum(windows) FROM windows_minute").fetchone()
        assert total[0] == t.num_rows
    finally:
        again.stop()


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
