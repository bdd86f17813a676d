"""Prometheus metrics stay bounded as the fleet grows (issue 29): at 8,192 NICs the exposition
has at most 20 k series and keeps its size as every NIC's windows arrive; one batch's update
does the same work in a fleet of 1,024 NICs as in one of 8,192; the one-way-delay aggregates
count what was fed (per leaf, rail, tier), from the inventory or, without one, from the NIC ids
and reported paths, with the rails bounded."""

from __future__ import annotations

import tracemalloc
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fleetlens.api.cli import settings_from_args
from fleetlens.api.metrics import Metrics, StateCollector
from fleetlens.api.owdhist import MAX_RAILS, OWD_BUCKETS_S, OwdHistograms
from prometheus_client.parser import text_string_to_metric_families

from fleetlens.plan import peer_pairs
from fleetlens.records import WINDOW_SCHEMA, ClockModel, Verdict
from fleetlens.topology import Topology, fat_tree, from_spec

REFERENCE = "leafspine:hosts=1024,nics=8,leaves=32,spines=8"
SMALL = "leafspine:hosts=128,nics=8,leaves=8,spines=8"
T0 = 1_700_000_000 * 10**9


def table(src: list[str], dst: list[str], owd_ns: np.ndarray, paths: Any = None) -> pa.Table:
    n = len(src)
    cols: dict[str, Any] = {f.name: pa.nulls(n, f.type) for f in WINDOW_SCHEMA}
    cols |= {"src_nic": src, "dst_nic": dst, "start_ns": [T0] * n, "owd_p50_ns": owd_ns}
    if paths is not None:
        cols["path"] = paths
    return pa.table(cols, schema=WINDOW_SCHEMA)


def fleet_batches(topo: Topology, sports: int = 4) -> list[pa.Table]:
    """One batch per host: its NICs' planned peer pairs (fleetlens.plan), ``sports`` each."""
    src, dst = peer_pairs(topo, peers=16, seed=0)
    ids = np.array([n.id for n in topo.nics])
    host_of = np.array([topo.hosts.index(n.host) for n in topo.nics])
    rng = np.random.default_rng(1)
    out = []
    for h in range(len(topo.hosts)):
        mine = host_of[src] == h
        s, d = np.repeat(src[mine], sports), np.repeat(dst[mine], sports)
        out.append(table(ids[s].tolist(), ids[d].tolist(), rng.uniform(2e3, 2e5, len(s))))
    return out


def metrics(topo: Topology | None, per_nic: bool = False) -> Metrics:
    zero = lambda: 0.0  # noqa: E731
    m = Metrics(zero, zero, zero, zero, topo, per_nic)
    if topo is not None:
        verdicts = [
            Verdict(lk.id, "link", "faulty" if i < 20 else "healthy", 0, 1e3, 0.1, 0.9)
            for i, lk in enumerate(topo.links)
        ]
        clocks = [ClockModel(h, 0, 1e3, 5.0, 200.0, True) for h in topo.hosts]
        m.add_state(StateCollector(lambda: verdicts, lambda: clocks, 20))
    return m


def series(text: bytes) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    return {
        (s.name, frozenset(s.labels.items()))
        for fam in text_string_to_metric_families(text.decode())
        for s in fam.samples
    }


def value(text: bytes, name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    raise KeyError(f"{name}{labels}")


@pytest.fixture(scope="module")
def reference() -> Topology:
    return from_spec(REFERENCE)


def test_reference_fleet_exposition_is_bounded_and_keeps_its_size(reference: Topology) -> None:
    m = metrics(reference)
    before = series(m.exposition())
    feed = fleet_batches(reference)
    for b in feed:
        m.owd.observe(b)
    text = m.exposition()
    after = series(text)
    assert len(after) <= 20_000
    assert after == before  # every NIC has sent: not one series more
    assert not any(name.startswith("fleetlens_nic_owd") for name, _ in after)
    # The aggregates count exactly what was fed: per tier once, per leaf and rail each side.
    windows = pa.concat_tables(feed)
    nic = reference.nic_by_id
    src = [nic[x] for x in windows["src_nic"].to_pylist()]
    dst = [nic[x] for x in windows["dst_nic"].to_pylist()]
    tiers = Counter("leaf" if a.leaf == b.leaf else "spine" for a, b in zip(src, dst, strict=True))
    for tier, n in tiers.items():
        assert value(text, "fleetlens_tier_owd_seconds_count", tier=tier) == n
    tx_leaf, rx_rail = Counter(a.leaf for a in src), Counter(b.ifname for b in dst)
    for leaf in ("leaf0", "leaf17", "leaf31"):
        assert (
            value(text, "fleetlens_leaf_owd_seconds_count", leaf=leaf, direction="tx")
            == (tx_leaf[leaf])
        )
    assert (
        value(text, "fleetlens_rail_owd_seconds_count", rail="eth3", direction="rx")
        == (rx_rail["eth3"])
    )
    owd_s = windows["owd_p50_ns"].to_numpy() * 1e-9
    on_leaf0 = np.array([a.leaf == "leaf0" for a in src])
    assert value(text, "fleetlens_leaf_owd_seconds_sum", leaf="leaf0", direction="tx") == (
        pytest.approx(owd_s[on_leaf0].sum())
    )
    le = OWD_BUCKETS_S[10]  # 2 ms
    assert value(
        text, "fleetlens_leaf_owd_seconds_bucket", leaf="leaf0", direction="tx", le=str(le)
    ) == np.count_nonzero(owd_s[on_leaf0] <= le)


def _host0_batch(topo: Topology) -> pa.Table:
    """Host 0's NICs to the same and the next rail of hosts 1-16: identical in shape (same
    leaves, rails and tiers, same delays) in any rail-wired fleet of 8-NIC hosts and 8+ leaves
    per 128 hosts."""
    by_host = topo.nics_by_host
    src, dst = [], []
    for k, nic in enumerate(by_host[topo.hosts[0]]):
        for h in topo.hosts[1:17]:
            for peer in (by_host[h][k], by_host[h][(k + 1) % 8]):
                src.append(nic.id)
                dst.append(peer.id)
    owd = np.random.default_rng(2).uniform(2e3, 2e5, len(src))
    return table(src * 4, dst * 4, np.tile(owd, 4))


def _cells(h: OwdHistograms) -> np.ndarray:
    return np.concatenate([f._counts[: len(f.keys)].ravel() for f in h.families])


def _update(m: Metrics, batch: pa.Table) -> tuple[int, int]:
    """(histogram cells one update changes, peak bytes numpy allocates during it)."""
    before = _cells(m.owd).copy()
    tracemalloc.start()
    m.owd.observe(batch)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    after = _cells(m.owd)
    return int(np.count_nonzero(after[: len(before)] != before)) + len(after) - len(before), peak


@pytest.mark.parametrize("per_nic", [False, True])
def test_one_batch_update_does_not_depend_on_fleet_size(reference: Topology, per_nic: bool) -> None:
    """The same batch in a fleet of 1,024 NICs and in one of 8,192 (every NIC already sending)
    changes the same number of histogram cells and allocates as much: work O(batch)."""
    out = []
    for topo in (from_spec(SMALL), reference):
        m = metrics(topo, per_nic)
        for b in fleet_batches(topo, sports=1):
            m.owd.observe(b)
        batch = _host0_batch(topo)
        m.owd.observe(batch)  # its NICs and peers are known: the steady state
        out.append(_update(m, batch))
    (cells_small, peak_small), (cells_big, peak_big) = out
    assert cells_small == cells_big > 0
    assert cells_big <= 2 * batch.num_rows + batch.num_rows  # tx, rx and tier cells at most
    # The old per-NIC update allocated a fleet-sized array per batch (2.6 MB at 8,192 NICs).
    assert peak_big <= 1.25 * peak_small + 4096 and peak_big < 256 * 1024


def test_per_nic_histograms_are_opt_in() -> None:
    topo = from_spec("leafspine:hosts=4,nics=2,leaves=2,spines=2")
    batch = table(["h00/eth0", "h01/eth1"], ["h02/eth0", "h03/eth0"], np.array([3e3, 4e3]))
    off, on = metrics(topo), metrics(topo, per_nic=True)
    for m in (off, on):
        m.owd.observe(batch)
    names_off = {name for name, _ in series(off.exposition())}
    text = on.exposition()
    nic_series = [s for s in series(text) if s[0].startswith("fleetlens_nic_owd_seconds")]
    assert not any(n.startswith("fleetlens_nic_owd_seconds") for n in names_off)
    assert len(nic_series) == len(topo.nics) * 2 * (len(OWD_BUCKETS_S) + 3)  # from 0
    assert value(text, "fleetlens_nic_owd_seconds_count", nic="h03/eth0", direction="rx") == 1
    assert value(text, "fleetlens_nic_owd_seconds_count", nic="h03/eth0", direction="tx") == 0
    assert settings_from_args(["--db", "x.duckdb", "--per-nic-metrics"])[0].per_nic_metrics
    assert not settings_from_args(["--db", "x.duckdb"])[0].per_nic_metrics


def test_fat_tree_tiers_from_the_inventory() -> None:
    topo = fat_tree(k=4)  # 2 hosts per leaf, 2 leaves per pod
    n = [x.id for x in topo.nics]  # h00, h01: leaf0; h02, h03: leaf1 (pod 0); h04+: pod 1
    m = metrics(topo)
    m.owd.observe(table([n[0], n[0], n[0], n[5]], [n[1], n[2], n[4], n[9]], np.full(4, 5e3)))
    text = m.exposition()
    counts = {t: value(text, "fleetlens_tier_owd_seconds_count", tier=t) for t in ("leaf",
              "spine", "core")}  # fmt: skip
    assert counts == {"leaf": 1, "spine": 1, "core": 2}


def test_without_inventory_tiers_come_from_paths_and_rails_are_bounded() -> None:
    m = metrics(None)
    paths = [["a/e0->leaf0", "leaf0->b/e0"], ["a/e0->l0", "l0->s0", "s0->l1", "l1->c/e0"], None]
    m.owd.observe(table(["a/e0", "a/e0", "a/e1"], ["b/e0", "c/e0", "b/e1"], np.full(3, 5e3), paths))
    text = m.exposition()
    for tier in ("leaf", "spine", "unknown"):
        assert value(text, "fleetlens_tier_owd_seconds_count", tier=tier) == 1
    assert value(text, "fleetlens_leaf_owd_seconds_count", leaf="unknown", direction="tx") == 3
    assert value(text, "fleetlens_rail_owd_seconds_count", rail="e1", direction="rx") == 1
    # An agent registering ever new interface names cannot grow the rails past the bound.
    many = [f"h{i:03d}/if{i}" for i in range(3 * MAX_RAILS)]
    m.owd.observe(table(many, many[::-1], np.full(len(many), 5e3)))
    rails = {dict(lbl)["rail"] for name, lbl in series(m.exposition()) if "rail" in dict(lbl)}
    assert len(rails) == MAX_RAILS + 1 and "other" in rails
    total = value(m.exposition(), "fleetlens_rail_owd_seconds_count", rail="other", direction="tx")
    assert total == 3 * MAX_RAILS - (MAX_RAILS - 2)  # e0 and e1 took two of the names


@pytest.mark.parametrize("per_nic", [False, True])
def test_the_commit_hooks_nic_ids_count_what_the_names_count(tmp_path: Any, per_nic: bool) -> None:
    """The collector's commit hook counts the rows through the NIC ids the storage layout gave
    them: the same histograms as looking the names up, with NICs outside the inventory, rows
    without a median and a retried batch (not counted again) in the groups."""
    from fleetlens.api.config import Settings
    from fleetlens.api.service import Collector

    from fleetlens.batch import Batch

    topo = from_spec(SMALL)
    c = Collector(Settings(db_path=tmp_path / "c.duckdb", inventory=SMALL, per_nic_metrics=per_nic))
    by_names = metrics(topo, per_nic)
    tables = fleet_batches(topo)[:24]
    rng = np.random.default_rng(5)
    for i, t in enumerate(tables[::3]):  # a few rows without a median, some NICs unknown
        owd = t["owd_p50_ns"].to_numpy(zero_copy_only=False)
        src = np.array(t["src_nic"].to_pylist())
        src[rng.random(len(src)) < 0.2] = f"x{i}/eth9"
        mask = rng.random(len(owd)) < 0.3
        tables[3 * i] = table(src.tolist(), t["dst_nic"].to_pylist(), pa.array(owd, mask=mask))
    batches = [Batch(f"b{i}", t["src_nic"][0].as_py().split("/")[0], t)
               for i, t in enumerate(tables)]  # fmt: skip
    groups = [batches[:10], [batches[3], *batches[10:]]]  # batches[3] again: a retry
    for g in groups:
        stored = c.store.insert_batches(g, T0)
        ids = c.store.last_nic_ids  # the hook's: one per row stored, in the group's order
        assert ids is not None
        assert len(ids[0]) == sum(b.rows for b, s in zip(g, stored, strict=True) if s)
        c.rounds.committed(list(zip(g, stored, strict=True)), 0.01)
        for b, s in zip(g, stored, strict=True):
            if s:
                by_names.owd.observe(b.windows)
    assert c.metrics.owd.collect() and by_names.owd.collect()
    got = [(f.name, f.samples) for f in c.metrics.owd.collect()]
    want = [(f.name, f.samples) for f in by_names.owd.collect()]
    assert got == want
    assert value(c.metrics.exposition(), "fleetlens_leaf_owd_seconds_count", leaf="unknown",
                 direction="tx") > 0  # fmt: skip
    c.store.close()
