"""The ``acks_lost`` window column (issue 28): an old store file gains it when a collector
opens it, and batches of agents older than the column are still stored, with null (unknown)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import msgpack
import pyarrow as pa
import pytest
from collector_helpers import INGEST, make_windows, start_server
from fleetlens.api.store import SCHEMA, Store

from fleetlens.batch import META_BATCH_ID, META_HOST_ID, BatchError, decode_batch, encode_batch
from fleetlens.topology import Topology, leaf_spine

TOPO = leaf_spine(hosts=4, nics=2, leaves=2, spines=2)
# the windows table as released before the column
OLD_WINDOWS = """CREATE TABLE windows (
    src_nic VARCHAR, dst_nic VARCHAR, sport INTEGER, start_ns BIGINT, duration_ns BIGINT,
    sent INTEGER, received INTEGER, pure INTEGER,
    owd_min_ns DOUBLE, owd_p50_ns DOUBLE, owd_p99_ns DOUBLE, owd_max_ns DOUBLE,
    hull_t_ns BLOB, hull_owd_ns BLOB, ts_source VARCHAR, path BLOB);
INSERT INTO windows VALUES ('h00/eth0', 'h01/eth0', 40000, 5000000000, 1000000000,
    200, 190, 90, 1.0, 2.0, 3.0, 4.0, NULL, NULL, 'software', NULL);"""


def _old_file(tmp_path: Path) -> Path:
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    con.execute(OLD_WINDOWS)
    con.execute(SCHEMA)  # the other tables (windows exists: left as it is)
    con.close()
    return db


def _old_arrow(table: pa.Table, batch_id: str) -> tuple[bytes, str]:
    """An agent from before the column: the same stream without ``acks_lost``."""
    old = table.drop_columns(["acks_lost"])
    old = old.replace_schema_metadata({META_BATCH_ID: batch_id, META_HOST_ID: "h01"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, old.schema) as writer:
        writer.write_table(old)
    return sink.getvalue().to_pybytes(), "application/vnd.apache.arrow.stream"


def test_a_read_only_open_of_an_old_file_reads_null(tmp_path: Path) -> None:
    db = _old_file(tmp_path)
    ro = Store(db, read_only=True)
    try:
        t = ro.read_windows()
        assert t["acks_lost"].to_pylist() == [None] and t["received"].to_pylist() == [190]
    finally:
        ro.close()
    con = duckdb.connect(str(db), read_only=True)  # and the file was left as it was
    cols = [r[0] for r in con.execute("DESCRIBE windows").fetchall()]
    con.close()
    assert "acks_lost" not in cols


def test_an_old_file_migrates_and_keeps_its_rows(tmp_path: Path) -> None:
    db = _old_file(tmp_path)
    store = Store(db)
    try:
        new = make_windows(TOPO, "h01", 6 * 10**9).slice(0, 3)
        new = new.set_column(new.schema.get_field_index("acks_lost"), "acks_lost",
                             pa.array([0, 7, 2], pa.int32()))  # fmt: skip
        store.insert_windows_raw(new)
        t = store.read_windows().sort_by("start_ns")
        assert t["acks_lost"].to_pylist()[0] is None  # the old row: unknown, not zero
        assert sorted(t["acks_lost"].to_pylist()[1:]) == [0, 2, 7]
    finally:
        store.close()
    Store(db).close()  # opening a migrated file again is a no-op


@pytest.mark.parametrize("fmt", ["arrow", "msgpack", "json"])
def test_an_old_schema_batch_decodes_with_null_acks_lost(fmt: str) -> None:
    t = make_windows(TOPO, "h01", time.time_ns() - 10**10)
    body, ctype = _old_arrow(t, "old-1") if fmt == "arrow" else _old_document(t, fmt)
    b = decode_batch(body, ctype)
    assert b.windows["acks_lost"].null_count == t.num_rows
    assert b.windows.drop_columns(["acks_lost"]).equals(t.drop_columns(["acks_lost"]))


def _old_document(t: pa.Table, fmt: str) -> tuple[bytes, str]:
    cols = t.drop_columns(["acks_lost"]).to_pydict()
    doc = {"batch_id": "old-1", "host_id": "h01", "columns": cols}
    if fmt == "msgpack":
        return msgpack.packb(doc), "application/msgpack"
    return json.dumps(doc).encode(), "application/json"


@pytest.mark.parametrize(("value", "why"), [(-1, "negative"), (10**6, "greater than received")])
def test_an_impossible_acks_lost_is_refused(value: int, why: str) -> None:
    t = make_windows(TOPO, "h01", time.time_ns() - 10**10)
    bad = t.set_column(t.schema.get_field_index("acks_lost"), "acks_lost",
                       pa.array([value] * t.num_rows, pa.int32()))  # fmt: skip
    with pytest.raises(BatchError) as e:
        decode_batch(*encode_batch("h01", bad, "bad", "arrow"))
    assert e.value.field == "acks_lost" and why in str(e.value)


@pytest.mark.parametrize("extra", [(), ("--ingest-workers", "2")], ids=["in-process", "workers"])
def test_both_ingest_paths_store_old_and_new_batches(
    extra: tuple[str, ...], tmp_path: Path, topo: Topology, inventory: Path
) -> None:
    server = start_server(tmp_path, inventory, *extra)
    base = (time.time_ns() // 10**9 - 600) * 10**9
    new = make_windows(topo, "h01", base)
    new = new.set_column(new.schema.get_field_index("acks_lost"), "acks_lost",
                         pa.array([3] * new.num_rows, pa.int32()))  # fmt: skip
    old = make_windows(topo, "h01", base + 10**9)
    try:
        with server.client(INGEST) as c:
            for body, ctype in (encode_batch("h01", new, "new-1"), _old_arrow(old, "old-1")):
                r = c.post("/v1/ingest", content=body, headers={"Content-Type": ctype})
                assert r.status_code == 200 and r.json()["stored"], r.text
    finally:
        server.stop()
    con = duckdb.connect(str(server.db))  # replays the WAL like a restarted collector
    try:
        got = dict(con.execute(
            "SELECT start_ns, list(DISTINCT acks_lost) FROM windows GROUP BY 1"
        ).fetchall())  # fmt: skip
    finally:
        con.close()
    assert got == {base: [3], base + 10**9: [None]}
