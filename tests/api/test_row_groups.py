"""The store's file is attached with row groups of ``ROW_GROUP_ROWS``: a commit of at least that
many rows is written to the file as row groups (DuckDB's cheaper way, not the WAL's), and what it
wrote reads back the same, from a reopened file and from a read-only open."""

from __future__ import annotations

from pathlib import Path

from collector_helpers import make_windows
from fleetlens.api.store import ROW_GROUP_ROWS, Store

from fleetlens.batch import Batch
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import leaf_spine

TOPO = leaf_spine(hosts=8, nics=2, leaves=2, spines=2)
KEY = ["src_nic", "dst_nic", "sport", "start_ns"]


def _row_groups(store: Store) -> list[int]:
    sql = (
        "SELECT row_group_id, max(count) FROM pragma_storage_info('windows') "
        "WHERE column_name = 'start_ns' GROUP BY 1 ORDER BY 1"
    )
    return [n for _, n in store.read().execute(sql).fetchall()]


def test_a_large_commit_is_written_as_row_groups_and_reads_back(tmp_path: Path) -> None:
    windows = make_windows(TOPO, "h00", 10**12, n_windows=700)  # 56 flows x 700 s
    assert windows.num_rows > ROW_GROUP_ROWS
    db = tmp_path / "s.duckdb"
    store = Store(db, threads=1)
    assert store.insert_batches([Batch("b0", "h00", windows)], 0) == [True]
    sizes = _row_groups(store)
    assert sum(sizes) == windows.num_rows
    assert len(sizes) == 2 and max(sizes) == ROW_GROUP_ROWS
    store.close()
    assert not Path(f"{db}.wal").exists()  # closing checkpointed the attached file

    want = windows.sort_by([(k, "ascending") for k in KEY])
    for read_only in (False, True):
        again = Store(db, read_only=read_only)
        got = again.read_windows().sort_by([(k, "ascending") for k in KEY])
        assert got.equals(want.cast(WINDOW_SCHEMA))
        assert again.window_starts()[:2] == [10**12, 10**12 + 10**9]  # a read cursor's query
        again.close()


def test_row_groups_stay_as_committed_and_deleted_ones_go(tmp_path: Path) -> None:
    """No checkpoint vacuum: two commits of a row group and a bit stay 2 + 2 row groups (the
    vacuum would rewrite the two small ones into one), and deleting the older commit's rows,
    as retention does, drops its row groups at the checkpoint."""
    old = make_windows(TOPO, "h00", 10**12, n_windows=600)
    new = make_windows(TOPO, "h00", 2 * 10**12, n_windows=600)
    assert ROW_GROUP_ROWS < old.num_rows < 1.1 * ROW_GROUP_ROWS
    store = Store(tmp_path / "s.duckdb", threads=1)
    store.insert_batches([Batch("old", "h00", old)], 0)
    store.insert_batches([Batch("new", "h00", new)], 0)
    store.con.execute("CHECKPOINT")
    assert sorted(_row_groups(store)) == sorted([ROW_GROUP_ROWS, old.num_rows - ROW_GROUP_ROWS] * 2)
    store.con.execute("DELETE FROM windows WHERE start_ns < ?", [2 * 10**12])
    store.con.execute("CHECKPOINT")
    assert sorted(_row_groups(store)) == sorted([ROW_GROUP_ROWS, new.num_rows - ROW_GROUP_ROWS])
    assert store.read_windows().num_rows == new.num_rows
    store.close()
