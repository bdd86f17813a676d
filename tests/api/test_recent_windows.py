"""The newest window generations held in memory (``feed.RecentWindows``): the loops read the
same rows from there as from DuckDB, and read DuckDB for what memory does not hold entirely
(generations stored before a restart, or pruned)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from collector_helpers import clean_window, send_clean_window
from fleetlens.api.config import Settings
from fleetlens.api.feed import RecentWindows
from fleetlens.api.service import Collector

from fleetlens.batch import Batch
from fleetlens.records import HULLS, WINDOW_SCHEMA
from fleetlens.topology import leaf_spine

T0 = 1_800_000_000_000_000_000
SEC = 1_000_000_000
ROWS = 4 * 2 * 6  # a generation: 4 hosts x 2 NICs, each probing the 6 NICs of other hosts


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([("start_ns", "ascending"), ("src_nic", "ascending"),
                      ("dst_nic", "ascending")])  # fmt: skip


def _collector(tmp_path: Path) -> Collector:
    topo = leaf_spine(hosts=4, nics=2, leaves=2, spines=2)
    inv = tmp_path / "fleet.json"
    topo.save(inv)
    c = Collector(Settings(db_path=tmp_path / "fl.duckdb", inventory=str(inv)))
    c.start(loops=False)
    return c


def test_memory_holds_what_the_store_holds_then_defers_to_it(tmp_path: Path) -> None:
    c = _collector(tmp_path)
    topo = c.topology
    assert topo is not None
    path = ["leaf0->spine1", "spine1->leaf1"]
    try:
        for w in range(3):
            for h in topo.hosts:
                send_clean_window(c, topo, h, T0 + w * SEC, with_hull=True, path=path)
        recent = c.feed.recent
        for lo, hi, without in ((T0, T0 + 2 * SEC, ("path",)), (T0 + SEC, T0 + SEC, HULLS)):
            held = recent.between(lo, hi, without)
            assert held is not None and held.num_rows == ROWS * ((hi - lo) // SEC + 1)
            stored = c.store.windows_between(lo, hi, without)
            assert _sorted(held).equals(_sorted(stored.cast(held.schema)))
            assert held.schema.equals(WINDOW_SCHEMA)
            for name in without:
                assert held[name].null_count == held.num_rows  # left out, as the store does
        assert c.rounds.newest_windows(T0 + 4 * SEC).num_rows == 3 * ROWS
    finally:
        c.stop()
    # Restarted: what was stored before is the store's, what comes after is held.
    c = _collector(tmp_path)
    try:
        assert c.feed.recent.between(T0, T0 + 2 * SEC) is None
        assert c.feed.recent.at(T0 + 3 * SEC) is not None  # nothing there yet: empty
        assert c.rounds.newest_windows(T0 + 4 * SEC).num_rows == 3 * ROWS  # from the store
        send_clean_window(c, topo, topo.hosts[0], T0 + 3 * SEC, with_hull=True)
        one = c.feed.recent.at(T0 + 3 * SEC)
        assert one is not None and one.num_rows == ROWS // 4
        assert _sorted(one).equals(_sorted(c.store.window_at(T0 + 3 * SEC).cast(one.schema)))
    finally:
        c.stop()


def test_pruned_generations_are_read_from_the_store() -> None:
    recent = RecentWindows(None, keep_ns=2 * SEC)

    def gen(start: int, n: int = 2) -> pa.Table:
        cols = {f.name: pa.nulls(n, f.type) for f in WINDOW_SCHEMA}
        cols["start_ns"] = pa.array([start] * n, pa.int64())
        cols["src_nic"] = pa.array([f"h{i}/eth0" for i in range(n)])
        return pa.table(cols, schema=WINDOW_SCHEMA)

    for w in range(3):
        recent.add(gen(T0 + w * SEC))
    both = pa.concat_tables([gen(T0), gen(T0 + SEC)])
    got = recent.between(T0, T0 + SEC)
    assert got is not None and got.equals(both)
    # A batch holding two generations is split between them.
    recent.add(pa.concat_tables([gen(T0 + 3 * SEC, 1), gen(T0 + 4 * SEC, 3)]))
    assert recent.between(T0, T0 + SEC) is None  # T0, T0 + 1 s pruned: > 2 s behind T0 + 4 s
    four = recent.at(T0 + 4 * SEC)
    assert four is not None and four.num_rows == 3
    assert recent.at(T0 + SEC) is None
    recent.add(gen(T0 + SEC))  # a late batch for a pruned generation stays the store's
    assert recent.at(T0 + SEC) is None
    assert recent.between(T0 + 2 * SEC, T0 + 4 * SEC) is not None


def test_per_host_starts_are_held_and_pruned_as_one_look_back() -> None:
    """Agents that stamp their windows' starts on their own clocks (the simulator's) give
    one held start per host and generation: a commit group of them is added at once, the
    look-back answers every host's rows between two starts, and whole generations are
    pruned once they are ``keep_ns`` behind the newest start, whatever their hosts' jitter."""
    hosts, keep = 40, 2 * SEC
    recent = RecentWindows(None, keep_ns=keep)
    jitter = [(h * 7_919_993) % (100 * 1_000_000) for h in range(hosts)]  # within 100 ms

    def batch(w: int, h: int) -> pa.Table:
        cols = {f.name: pa.nulls(3, f.type) for f in WINDOW_SCHEMA}
        cols["start_ns"] = pa.array([T0 + w * SEC + jitter[h]] * 3, pa.int64())
        cols["src_nic"] = pa.array([f"h{h}/eth{i}" for i in range(3)])
        return pa.table(cols, schema=WINDOW_SCHEMA)

    for w in range(6):
        order = [(7 * i + w) % hosts for i in range(hosts)]  # a new commit order each window
        for g in range(0, hosts, 16):
            recent.add_all([batch(w, h) for h in order[g : g + 16]])
        newest = T0 + w * SEC + max(jitter)
        assert min(recent._rows) >= newest - keep  # pruned: nothing older than keep_ns held
        assert len(recent._rows) <= 3 * hosts  # at most the generations within keep_ns
        lo = T0 + max(w - 1, 0) * SEC
        got = recent.between(lo, newest)
        assert got is not None
        want = [batch(v, h) for v in range(max(w - 1, 0), w + 1) for h in range(hosts)]
        assert _sorted(got).equals(_sorted(pa.concat_tables(want)))


def test_a_commit_group_with_a_batch_of_two_generations(tmp_path: Path) -> None:
    """The commit hook reads each batch's first and last window start off the group's rows
    at once: a batch holding two generations is held under both, next to one-generation
    batches of the same group, and the arrivals and the newest start see both."""
    c = _collector(tmp_path)
    topo = c.topology
    assert topo is not None
    try:
        h0, h1, h2 = topo.hosts[:3]
        c.writer.stop()  # the group committed below by hand, as the writer would
        got = {h: pa.concat_tables([clean_window(topo, h, s) for s in starts])
               for h, starts in ((h0, [T0]), (h1, [T0, T0 + SEC]), (h2, [T0 + SEC]))}  # fmt: skip
        group = [Batch(f"g-{h}", h, got[h]) for h in (h0, h1, h2)]
        stored = c.store.insert_batches(group, T0)
        c.rounds.committed(list(zip(group, stored, strict=True)), 0.01)
        per_host = ROWS // 4
        for start, rows in ((T0, 2 * per_host), (T0 + SEC, 2 * per_host)):
            held = c.feed.recent.at(start)
            assert held is not None and held.num_rows == rows
            assert held["start_ns"].to_pylist() == [start] * rows
            assert c.arrivals.first_arrival(start) is not None
        assert c.rounds.newest_start_ns == T0 + SEC
    finally:
        c.stop()
