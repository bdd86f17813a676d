"""The single writer on a real DuckDB file: group commit keeps per-batch idempotency, and the
storage layout (BLOB-packed lists, link dictionary) reads back exactly."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
from collector_helpers import make_windows
from fleetlens.api.store import Store
from fleetlens.api.writer import Backpressure, Writer

from fleetlens.batch import Batch
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import Topology


def test_group_commit_dedups_within_and_across_groups(tmp_path: Path, topo: Topology) -> None:
    store = Store(tmp_path / "w.duckdb")
    writer = Writer(store, max_batches=16)
    a = Batch("a", "h00", make_windows(topo, "h00", 10**18, seed=1))
    b = Batch("b", "h01", make_windows(topo, "h01", 10**18, seed=2))
    # Queued before the thread starts, so all four land in one group (one transaction).
    futures = [writer.submit_batch(x) for x in (a, a, b, a)]
    writer.start()
    try:
        assert [f.result(30) for f in futures] == [True, False, True, False]
        assert writer.submit_batch(b).result(30) is False  # and across groups
    finally:
        writer.stop()
    got = store.read_windows()
    order = [(c, "ascending") for c in ("src_nic", "dst_nic", "sport", "start_ns")]
    assert got.sort_by(order).equals(pa.concat_tables([a.windows, b.windows]).sort_by(order))
    assert store.con.execute("SELECT count(*) FROM batches").fetchone()[0] == 2
    store.close()


def test_null_paths_and_empty_hulls_survive_storage(tmp_path: Path, topo: Topology) -> None:
    t = make_windows(topo, "h02", 10**18)
    path = t["path"].to_pylist()
    path[0] = None
    hull = t["hull_t_ns"].to_pylist()
    hull_y = t["hull_owd_ns"].to_pylist()
    hull[1], hull_y[1] = [], []
    t = t.set_column(15, "path", pa.array(path, WINDOW_SCHEMA.field("path").type))
    t = t.set_column(12, "hull_t_ns", pa.array(hull, WINDOW_SCHEMA.field("hull_t_ns").type))
    t = t.set_column(13, "hull_owd_ns", pa.array(hull_y, WINDOW_SCHEMA.field("hull_owd_ns").type))
    store = Store(tmp_path / "n.duckdb")
    store.insert_windows_raw(t.slice(3))  # a slice: non-zero Arrow offsets
    store.insert_windows_raw(t.slice(0, 3))
    store.close()
    again = Store(tmp_path / "n.duckdb")  # the link dictionary is reloaded from the file
    got = again.read_windows()
    again.close()
    order = [(c, "ascending") for c in ("src_nic", "dst_nic", "sport")]
    assert got.sort_by(order).equals(t.sort_by(order))


def test_row_bound_backpressure(tmp_path: Path, topo: Topology) -> None:
    store = Store(tmp_path / "b.duckdb")
    t = make_windows(topo, "h00", 10**18)
    writer = Writer(store, max_batches=100, max_rows=t.num_rows * 2)
    writer.submit_batch(Batch("x1", "h00", t))
    writer.submit_batch(Batch("x2", "h00", t))
    try:
        writer.submit_batch(Batch("x3", "h00", t))
        raise AssertionError("a third batch should exceed the row bound")
    except Backpressure as e:
        assert e.retry_after_s >= 1
    assert writer.queued_rows() == 2 * t.num_rows and writer.lag_s() > 0
    writer.start()
    deadline = time.monotonic() + 30
    while writer.queued_rows() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.queued_rows() == 0 and writer.lag_s() == 0
    writer.stop()
    store.close()


def test_loop_state_survives_restart(tmp_path: Path, inventory: Path) -> None:
    """Clock models, verdicts and decisions are reloaded from the file on start (newest row per
    subject), so a restarted collector answers like the one that stopped."""
    from fleetlens.api.config import Settings
    from fleetlens.api.service import Collector

    from fleetlens.records import ClockModel, Decision, DrainEntry, Verdict

    settings = Settings(db_path=tmp_path / "s.duckdb", inventory=str(inventory),
                        insecure_no_auth=True)  # fmt: skip
    first = Collector(settings)
    first.start(loops=False)
    v_old = Verdict("leaf0->spine0", "link", "suspect", 5, 0.0, 0.1, 0.5, 1, ["a>b:1"])
    v_new = Verdict("leaf0->spine0", "link", "faulty", 7, 0.0, 0.4, 1.0, 3, ["a>b:1", "c>d:2"])
    clock = ClockModel("h01", 11, 250.0, -3.5, 40.0, True)
    drain = Decision("h01", 9, [DrainEntry("h01/eth1", "link h01/eth1->leaf1 faulty", 7)])
    first.writer.submit_call(lambda s: s.save_loop_outputs([], [v_old], [], 100)).result(30)
    first.writer.submit_call(lambda s: s.save_loop_outputs([clock], [v_new], [drain], 200)).result(
        30
    )
    first.stop()
    again = Collector(settings)
    try:
        assert again.published.verdicts == {"leaf0->spine0": v_new}
        assert again.published.clocks == {"h01": clock}
        assert again.published.clock_updated["h01"] == 200
        assert again.published.decisions["h01"] == drain
    finally:
        again.stop()


def test_batch_ids_are_remembered_for_the_retry_window(tmp_path: Path, topo: Topology) -> None:
    from fleetlens.api.config import DAY_NS, HOUR_NS, MINUTE_NS

    store = Store(tmp_path / "ids.duckdb")
    now = time.time_ns()
    z = Batch("z", "h00", make_windows(topo, "h00", now - 10**10))
    assert store.insert_batches([z], now) == [True]
    store.retention_pass(now + 30 * MINUTE_NS, DAY_NS, 30 * DAY_NS, batch_ids_ns=HOUR_NS)
    assert store.insert_batches([z], now + 31 * MINUTE_NS) == [False]  # a retry: stored once
    store.retention_pass(now + 2 * HOUR_NS, DAY_NS, 30 * DAY_NS, batch_ids_ns=HOUR_NS)
    assert store.insert_batches([z], now + 2 * HOUR_NS) == [True]  # id forgotten after 1 h
    store.close()


def test_typed_window_reads_select_by_start(tmp_path: Path, topo: Topology) -> None:
    """The reads replays and benches use (no SQL from the caller): window starts, the windows
    of a span or from a start on, the oldest and newest start."""
    store = Store(tmp_path / "r.duckdb")
    t0 = 10**18
    assert store.window_starts() == [] and store.oldest_window_start() is None
    store.insert_windows_raw(make_windows(topo, "h00", t0, n_windows=4, seed=1))
    every = store.read_windows()
    starts = every["start_ns"].to_pylist()
    assert store.window_starts() == sorted(set(starts)) == [t0 + i * 10**9 for i in range(4)]
    assert store.window_starts(t0 + 10**9) == [t0 + 2 * 10**9, t0 + 3 * 10**9]
    assert (store.oldest_window_start(), store.newest_window_start()) == (t0, t0 + 3 * 10**9)
    since = store.windows_since(t0 + 2 * 10**9, without=("path",))
    assert sorted(since["start_ns"].to_pylist()) == sorted(s for s in starts if s >= t0 + 2 * 10**9)
    assert since["path"].null_count == since.num_rows and since["hull_t_ns"].null_count == 0
    between = store.windows_between(t0 + 10**9, t0 + 2 * 10**9)
    assert sorted(set(between["start_ns"].to_pylist())) == [t0 + 10**9, t0 + 2 * 10**9]
    store.close()


def test_forget_batches_deletes_exactly_their_windows_and_ids(tmp_path: Path, topo: Topology):
    """A shard's reconciliation: the copies another owner stored go, windows and ids, and
    nothing else; a batch this file never held is not reported as forgotten."""
    store = Store(tmp_path / "f.duckdb")
    now = time.time_ns()
    a = Batch("a", "h00", make_windows(topo, "h00", now - 10**10))
    b = Batch("b", "h01", make_windows(topo, "h01", now - 10**10))
    never = Batch("n", "h02", make_windows(topo, "h02", now - 10**10))
    assert store.insert_batches([a, b], now) == [True, True]
    assert [x.batch_id for x in store.forget_batches([a, never])] == ["a"]
    left = store.read_windows()
    assert left.num_rows == b.rows and set(left["src_nic"].to_pylist()) <= set(
        b.windows["src_nic"].to_pylist()
    )
    assert store.insert_batches([a, b], now) == [True, False]  # a's id is gone, b's kept
    store.close()
