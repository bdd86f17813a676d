"""The windows table's layout (issue 29 point 2): ``path`` as one id per row into ``path_dict``,
``src_nic``, ``dst_nic`` and ``ts_source`` as ids into ``nic_dict`` and ``ts_source_dict``.

Pins that the path dictionary is exact (every row decodes to the path it was stored with, a
hash collision included), that the dictionaries stay bounded (storing the same flows again adds
nothing), and that a file written by the layout before them opens with every row and answers
every read the same."""

from __future__ import annotations

import logging
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from collector_helpers import make_windows
from fleetlens.api import codec
from fleetlens.api.codec import LinkDict, PathDict, list_to_blob
from fleetlens.api.store import StallRule, Store

from fleetlens.batch import Batch
from fleetlens.topology import leaf_spine

TOPO = leaf_spine(hosts=4, nics=2, leaves=2, spines=2)
T0 = 1_700_000_000 * 10**9
LISTS = pa.list_(pa.int32())

# The store file as the release before path ids wrote it (api/store.py SCHEMA at 4fe8623, with
# the acks_lost migration applied): path a BLOB of int32 link_dict indices, packed.
OLD_SCHEMA = """
CREATE TABLE windows (
    src_nic VARCHAR, dst_nic VARCHAR, sport INTEGER, start_ns BIGINT, duration_ns BIGINT,
    sent INTEGER, received INTEGER, pure INTEGER,
    owd_min_ns DOUBLE, owd_p50_ns DOUBLE, owd_p99_ns DOUBLE, owd_max_ns DOUBLE,
    hull_t_ns BLOB, hull_owd_ns BLOB, ts_source VARCHAR, path BLOB, acks_lost INTEGER);
CREATE TABLE link_dict (idx INTEGER PRIMARY KEY, link_id VARCHAR);
CREATE TABLE rollup (id INTEGER PRIMARY KEY, watermark_ns BIGINT, raw_floor_ns BIGINT);
CREATE TABLE batches (
    batch_id VARCHAR PRIMARY KEY, host_id VARCHAR, rows INTEGER, received_ns BIGINT);
CREATE TABLE windows_minute (
    src_nic VARCHAR, dst_nic VARCHAR, minute_ns BIGINT, windows BIGINT,
    sent BIGINT, received BIGINT, pure BIGINT,
    owd_min_ns DOUBLE, owd_p50_ns DOUBLE, owd_p99_ns DOUBLE, owd_max_ns DOUBLE,
    PRIMARY KEY (src_nic, dst_nic, minute_ns));
"""


def test_path_ids_round_trip_nulls_and_empty_paths() -> None:
    paths = PathDict(pa.array([], LISTS))
    rows = pa.array([[1, 2], None, [], [2, 1], [1, 2], None, [5, 6, 7]], LISTS)
    ids, new = paths.encode(rows)
    assert ids.null_count == 2 and ids[0] == ids[4]
    assert len(set(ids.drop_null().to_pylist())) == 4 == len(new) == len(paths)
    assert paths.decode(ids).to_pylist() == rows.to_pylist()
    again, new = paths.encode(rows.slice(2))  # known paths: the same ids, nothing new
    assert again.to_pylist() == ids.slice(2).to_pylist() and len(new) == 0
    reloaded = PathDict(paths.paths)  # as the store loads path_dict: id i at position i
    assert reloaded.encode(rows)[0].to_pylist() == ids.to_pylist()


def test_a_hash_collision_keeps_ids_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "_HASH_MASK", 0)  # every path hashes to 0
    paths = PathDict(pa.array([], LISTS))
    rows = pa.array([[1], [2], [1], [3], None, [2]], LISTS)
    ids, _ = paths.encode(rows)
    assert ids.to_pylist() == [0, 1, 0, 2, None, 1]
    more = pa.array([[3], [4], [1]], LISTS)
    assert paths.encode(more)[0].to_pylist() == [2, 3, 0]
    reloaded = PathDict(paths.paths)
    assert reloaded.encode(paths.paths)[0].to_pylist() == [0, 1, 2, 3]
    assert reloaded.decode(pa.array([3, 0], pa.int32())).to_pylist() == [[4], [1]]


def test_path_ids_over_growth_and_a_reload() -> None:
    """Thousands of paths of mixed lengths, added in rounds that outgrow the table and the
    arrays several times, known ones repeated among them: every row decodes to its path, each
    distinct path has one id, and a dictionary reloaded from the paths finds the same ids."""
    rng = np.random.default_rng(3)
    paths = PathDict(pa.array([], LISTS))
    seen: dict[tuple[int, ...], int] = {}
    for _ in range(6):
        rows = [tuple(rng.integers(0, 50, rng.integers(0, 6)).tolist()) for _ in range(3000)]
        rows += list(seen)[:500]  # known ones
        ids, _ = paths.encode(pa.array([list(r) for r in rows], LISTS))
        for r, i in zip(rows, ids.to_pylist(), strict=True):
            assert seen.setdefault(r, i) == i
    assert len(paths) == len(seen) == len(set(seen.values()))
    want = pa.array([list(r) for r in seen], LISTS)
    assert paths.decode(pa.array(list(seen.values()), pa.int32())).to_pylist() == want.to_pylist()
    reloaded = PathDict(paths.paths)
    assert reloaded.encode(want)[0].to_pylist() == list(seen.values())


def _windows() -> pa.Table:
    lossy = frozenset({TOPO.links[0].id})  # some flows lose probes: host stalls to cut
    t = pa.concat_tables([make_windows(TOPO, h, T0, n_windows=3, lossy_links=lossy, seed=i)
                          for i, h in enumerate(TOPO.hosts)])  # fmt: skip
    path = t["path"].combine_chunks()  # some unknown paths: they stay null
    unknown = pa.array(np.arange(len(path)) % 7 == 0)
    nulls = pa.nulls(len(path), path.type)
    return t.set_column(t.schema.get_field_index("path"), "path",
                        pa.compute.if_else(unknown, nulls, path))  # fmt: skip


def test_the_windows_table_stores_path_ids_and_the_dictionary_stays_bounded(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "s.duckdb")
    try:
        t = _windows()
        store.insert_windows_raw(t)
        n_paths = store.con.execute("SELECT count(*) FROM path_dict").fetchall()[0][0]
        distinct = set(map(tuple, t["path"].drop_null().to_pylist()))
        assert n_paths == len(store.dicts.paths) == len(distinct)
        types = _types(store)
        assert {types[c] for c in ("src_nic", "dst_nic", "ts_source", "path")} == {"INTEGER"}
        n_nics = store.con.execute("SELECT count(*) FROM nic_dict").fetchall()[0][0]
        assert n_nics == len(TOPO.nics)
        later = t.set_column(t.schema.get_field_index("start_ns"), "start_ns",
                             pa.compute.add(t["start_ns"], 10 * 10**9))  # fmt: skip
        store.insert_windows_raw(later)  # the same flows again: no new path
        assert store.con.execute("SELECT count(*) FROM path_dict").fetchall()[0][0] == n_paths
        assert store.con.execute("SELECT count(*) FROM nic_dict").fetchall()[0][0] == n_nics
        back = store.read_windows().sort_by(
            [
                ("start_ns", "ascending"),
                ("src_nic", "ascending"),
                ("dst_nic", "ascending"),
                ("sport", "ascending"),
            ]
        )
        want = pa.concat_tables([t, later]).sort_by([("start_ns", "ascending"),
                                                     ("src_nic", "ascending"),
                                                     ("dst_nic", "ascending"),
                                                     ("sport", "ascending")])  # fmt: skip
        assert back["path"].to_pylist() == want["path"].to_pylist()
    finally:
        store.close()
    reopened = Store(tmp_path / "s.duckdb")  # the dictionary is read back: same ids
    try:
        assert len(reopened.dicts.paths) == n_paths
        reopened.insert_windows_raw(later.slice(0, 50))
        assert reopened.con.execute("SELECT count(*) FROM path_dict").fetchall()[0][0] == n_paths
    finally:
        reopened.close()


def test_the_layout_of_chunks_slices_and_nulls_round_trips() -> None:
    """``codec.to_storage`` numbers a commit group's strings chunk by chunk (one chunk per
    batch, sliced ones among them), a null path, NIC or ts_source stays null, and the
    dictionaries' ids (stable as they grow over two groups) name every row back."""
    t = _windows()
    ts = t["ts_source"].combine_chunks()
    some_null = pa.compute.if_else(
        pa.array(np.arange(len(ts)) % 5 == 1), pa.nulls(len(ts), ts.type), ts
    )
    t = t.set_column(t.schema.get_field_index("ts_source"), "ts_source", some_null)
    chunks = [t.slice(0, 7), t.slice(7, 0), t.slice(7, 40), t.slice(47)]
    d = codec.Dicts()
    for group in (pa.concat_tables(chunks[:2]), pa.concat_tables(chunks[2:])):
        stored, _ = codec.to_storage([group], d)
        back = codec.from_storage(stored, d)
        for name in ("src_nic", "dst_nic", "ts_source", "path"):
            assert back[name].to_pylist() == group[name].to_pylist(), name
    assert len(d.nics.ids) == len(set(d.nics.ids.to_pylist())) == len(TOPO.nics)
    # columns in another order, strings as large_string: conformed before the pass reads them
    other = t.select(list(reversed(t.column_names)))
    other = other.cast(pa.schema([f.with_type(pa.large_string()) if f.type == pa.string()
                                  else f for f in other.schema]))  # fmt: skip
    stored, _ = codec.to_storage([other], d)
    assert codec.from_storage(stored, d)["src_nic"].to_pylist() == t["src_nic"].to_pylist()
    assert len(d.paths) == len(set(map(tuple, t["path"].drop_null().to_pylist())))


def _host_batches(t: pa.Table, tag: str) -> list[Batch]:
    """``t``'s rows as one batch per sending host, in the hosts' order."""
    src = np.asarray(t["src_nic"].to_pylist())
    return [Batch(f"{tag}-{h}", h, t.filter(pa.array(np.char.startswith(src, h + "/"))))
            for h in TOPO.hosts]  # fmt: skip


def test_ids_a_worker_found_store_the_rows_the_writer_would(tmp_path: Path) -> None:
    """Batches numbered by an ingest worker (``codec.WorkerDicts``, a copy of the committed
    dictionary entries) are stored exactly as the writer stores them when it numbers them
    itself, in a group mixed with batches the copy could not number (a NIC, link or
    ts_source new since the copy): the same rows back, the same dictionaries."""
    t = _windows()
    first, later = _host_batches(t.slice(0, 30), "a"), _host_batches(t.slice(30), "b")
    by_writer, by_workers = Store(tmp_path / "w.duckdb"), Store(tmp_path / "k.duckdb")
    try:
        copy = codec.WorkerDicts()
        for store in (by_writer, by_workers):
            assert store.insert_batches(first, T0) == [True] * len(first)
        copy.extend(*by_workers.committed_names(copy.sizes()))
        assert copy.sizes() == [len(by_workers.dicts.nics.ids), len(by_workers.dicts.sources.ids),
                                len(by_workers.dicts.links.ids)]  # fmt: skip
        numbered = []
        for b in later:
            layout = copy.number(b.host_id, b.windows)
            numbered.append(Batch(b.batch_id, b.host_id, b.windows, layout=layout))
        assert 0 < sum(b.layout is None for b in numbered) < len(numbered)
        by_writer.insert_batches(later, T0)
        by_workers.insert_batches(numbered, T0)
        assert by_workers.committed_names([0, 0, 0]) == by_writer.committed_names([0, 0, 0])
        assert by_workers.last_nic_ids is not None and by_writer.last_nic_ids is not None
        for a, b in zip(by_workers.last_nic_ids, by_writer.last_nic_ids, strict=True):
            assert a.tolist() == b.tolist()
        got, want = (s.windows_between(0, 2**62) for s in (by_workers, by_writer))
        assert got.equals(want) and got.num_rows == t.num_rows
    finally:
        by_writer.close()
        by_workers.close()


def test_an_id_past_the_dictionary_is_refused() -> None:
    """A worker's id the writer never committed fails the group (it is never stored as some
    other name)."""
    t = _windows().slice(0, 10)
    d = codec.Dicts()
    codec.to_storage([t], d)
    copy = codec.WorkerDicts()
    copy.extend(d.nics.ids.to_pylist(), d.sources.ids.to_pylist(), d.links.ids.to_pylist())
    layout = copy.number("h", t)
    assert layout is not None
    layout.dst = layout.dst + len(d.nics.ids)
    with pytest.raises(ValueError, match="past its dictionary"):
        codec.to_storage([t], d, [layout])
    layout.dst = layout.dst - len(d.nics.ids)
    layout.path = np.full(t.num_rows, len(d.paths), np.int32)
    with pytest.raises(ValueError, match="past its dictionary"):
        codec.to_storage([t], d, [layout])


def test_path_ids_given_store_what_looking_the_paths_up_stores() -> None:
    """The ids the writer hands back (path ids included), given with a batch's next copy,
    store its rows as the writer's own lookup does; a group mixing batches with and without
    path ids looks the paths up and hands back the ids of those without."""
    t = _windows()
    a, b = t.slice(0, 30), t.slice(30)
    d = codec.Dicts()
    stored, added = codec.to_storage([a, b], d)
    assert [len(x.src) for x in added.numbered] == [a.num_rows, b.num_rows]
    assert all(x.path is not None for x in added.numbered)
    again, none = codec.to_storage([a, b], d, added.numbered)
    assert again.equals(stored) and none.numbered == []
    mixed, some = codec.to_storage([a, b], d, [added.numbered[0], None])
    assert mixed.equals(stored) and len(some.numbered) == 1
    assert some.numbered[0].path.tolist() == added.numbered[1].path.tolist()


def _copied(t: pa.Table) -> pa.Table:
    """``t`` in buffers of its own, one chunk, nothing sliced (as an agent's body decodes)."""
    cols = [pa.concat_arrays([c.combine_chunks()]) for c in t.columns]
    return pa.Table.from_batches([pa.RecordBatch.from_arrays(cols, schema=t.schema)])


def test_a_worker_reuses_a_hosts_ids_only_for_the_same_strings() -> None:
    """A host's batch whose string columns are byte for byte its last one's takes the ids
    found for that one; any other (a path or a ts_source changed, a row fewer) is numbered
    again, with the ids a fresh copy finds."""
    t = _copied(_windows().slice(0, 40))
    d = codec.Dicts()
    codec.to_storage([t], d)
    names = d.nics.ids.to_pylist(), d.sources.ids.to_pylist(), d.links.ids.to_pylist()
    copy = codec.WorkerDicts()
    copy.extend(*names)
    first = copy.number("h", t)
    assert first is not None and copy.number("h", _copied(t)) is first  # the same bytes
    path = t["path"].combine_chunks()
    swapped = pa.concat_arrays([path.slice(1, 1), path.slice(0, 1), path.slice(2)])
    first_ts = None if t["ts_source"][0].is_valid else names[1][0]
    ts = pa.array([first_ts, *t["ts_source"].to_pylist()[1:]], pa.string())
    changed = [t.set_column(t.schema.get_field_index("path"), "path", swapped),
               t.set_column(t.schema.get_field_index("ts_source"), "ts_source", ts),
               t.slice(0, 39)]  # fmt: skip
    for other in map(_copied, changed):
        fresh = codec.WorkerDicts()
        fresh.extend(*names)
        got, want = copy.number("h", other), fresh.number("h", other)
        assert got is not first and got is not None and want is not None
        for name in ("src", "dst", "ts", "path_off", "links"):
            assert getattr(got, name).tolist() == getattr(want, name).tolist(), name


def _types(store: Store) -> dict[str, str]:
    sql = ("SELECT column_name, data_type FROM information_schema.columns "
           "WHERE table_name = 'windows'")  # fmt: skip
    return dict(store.con.execute(sql).fetchall())


def _old_file(db: Path, t: pa.Table) -> None:
    """``t`` stored as the release before path ids stored it."""
    links = LinkDict([])
    idx, _ = links.encode(t["path"])
    cols = {n: t[n] for n in t.column_names}
    for n in ("hull_t_ns", "hull_owd_ns"):
        cols[n] = list_to_blob(t[n])
    cols["path"] = list_to_blob(idx)
    con = duckdb.connect(str(db))
    con.execute(OLD_SCHEMA)
    con.register("_rows", pa.table(cols))
    con.register("_ids", pa.table({"idx": pa.array(range(len(links.ids)), pa.int32()),
                                   "link_id": links.ids}))  # fmt: skip
    con.execute("INSERT INTO windows SELECT * FROM _rows")
    con.execute("INSERT INTO link_dict SELECT * FROM _ids")
    con.close()


def _answers(store: Store, src: str, dst: str) -> dict[str, object]:
    """Every read of the windows table, in the REST API's terms (strings out)."""
    until = T0 + 10 * 10**9
    totals = store.flow_totals(T0, until)
    # every host-second with a loss is a burst: the cut leaves some of them out
    stalls = store.host_stalls(T0, until, StallRule(loss=0.001, spread=0.01, max_share=1.0))
    cut = store.flow_totals(T0, until, without=stalls.filter(stalls["excluded"]))
    order = ("start_ns", "src_nic", "dst_nic", "sport")
    windows = store.read_windows().sort_by([(n, "ascending") for n in order])
    return {
        "totals": totals.drop_columns(["path"]).to_pylist(),
        "paths": store.decode_paths(totals["path"]).to_pylist(),
        "stalls": stalls.sort_by([(n, "ascending") for n in ("side", "host", "sec")]).to_pylist(),
        "cut": cut.drop_columns(["path"]).to_pylist(),
        "history": store.pair_series(src, dst, T0, until, 10**9),
        "first_seen": store.first_window_per_host(T0 - 1),
        "links": store.links_on_paths([src, dst], T0),
        "windows": windows.to_pylist(),
    }


def test_a_file_of_the_previous_layout_migrates_with_every_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    t = _windows()
    src, dst = t["src_nic"][0].as_py(), t["dst_nic"][0].as_py()
    ref = Store(tmp_path / "new.duckdb")
    try:
        ref.insert_windows_raw(t)
        want = _answers(ref, src, dst)
        assert want["stalls"] and len(want["cut"]) < len(want["totals"]) and want["history"]
        assert want["links"] and len(want["first_seen"]) == len(TOPO.hosts)
    finally:
        ref.close()
    old = tmp_path / "old.duckdb"
    _old_file(old, t)
    ro = Store(old, read_only=True)  # a read-only open reads the old layout as it is
    try:
        assert _answers(ro, src, dst) == want
    finally:
        ro.close()
    with caplog.at_level(logging.WARNING, logger="fleetlens.api.store"):
        store = Store(old)
    try:
        assert f"{t.num_rows} rows" in caplog.text
        assert _answers(store, src, dst) == want
        assert set(_types(store).values()) >= {"INTEGER"} and _types(store)["src_nic"] == "INTEGER"
        hosts = store.con.execute("SELECT DISTINCT host_id FROM nic_dict").fetchall()
        assert sorted(h for (h,) in hosts) == sorted(TOPO.hosts)
        store.insert_windows_raw(make_windows(TOPO, "h00", T0 + 20 * 10**9))  # and writes on
        assert store.con.execute("SELECT count(*) FROM windows").fetchall()[0][0] > t.num_rows
    finally:
        store.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fleetlens.api.store"):
        Store(old).close()  # opening a migrated file again is a no-op
    assert "migrated" not in caplog.text
