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
