"""GET /v1/flows: per-flow totals over a period, from a real collector holding simulated
windows streamed by the simulator's own client. Every figure is checked against the windows
that were sent (computed here in numpy, not by the collector's SQL), as are paging over a
stable order, the period boundaries, the path of most windows (also for flows whose path
changed mid-period, as the audit reads them), auth and bad parameters."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from collector_helpers import INGEST, READ, Server, start_server
from fleetlens.api.store import Store

from fleetlens.audit.data import Flows, RestReader, read_flows
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.topology import Topology, leaf_spine

sim = pytest.importorskip("fleetlens.fixtures.sim")
stream = pytest.importorskip("fleetlens.fixtures.sim.stream")

N_WINDOWS = 4
WIN = 10**9
NO_PATH_SRC = "h01/eth0"  # its flows never carry a path: the API must answer null
MOVED_SRC = "h02/eth1"  # its odd ports move to another path in the newest window
FlowKey = tuple[str, str, int]


@dataclasses.dataclass
class Fleet:
    server: Server
    epoch: int
    sent: pa.Table  # every window posted, WINDOW_SCHEMA
    moved: dict[FlowKey, tuple[list[str], list[str]]]  # flow -> (path before, newest path)


def _hide_paths(t: pa.Table, mask: np.ndarray) -> pa.Table:
    path = t["path"].combine_chunks()
    kept = pc.if_else(pa.array(~mask), path, pa.scalar(None, path.type))
    return t.set_column(t.schema.get_field_index("path"), "path", kept)


def _move_paths(t: pa.Table, mask: np.ndarray, topo: Topology) -> tuple[pa.Table, dict]:
    """The rows of ``mask`` take another of their pair's ECMP paths; flow -> (before, after)."""
    paths, moved = t["path"].to_pylist(), {}
    for i in np.flatnonzero(mask):
        src, dst, sport = t["src_nic"][i].as_py(), t["dst_nic"][i].as_py(), t["sport"][i].as_py()
        other = [p for p in topo.ecmp_paths(src, dst) if p != paths[i]]
        if other:
            moved[(src, dst, sport)] = (paths[i], other[0])
            paths[i] = other[0]
    column = pa.array(paths, t.schema.field("path").type)
    return t.set_column(t.schema.get_field_index("path"), "path", column), moved


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("flows")
    topo = leaf_spine(hosts=4, nics=2, leaves=2, spines=2)
    inventory = tmp / "topology.json"
    topo.save(inventory)
    epoch = (time.time_ns() // WIN - 20) * WIN  # recent past: not "from the future"
    # a row per port (not per path): flows enough to page through, half of them hidden below
    cfg = sim.SimConfig(
        paths_known=True, merge_paths=False, faults=("leaf0->spine1:loss=0.2",), epoch_ns=epoch
    )
    simulator = sim.Simulator(topo, cfg, seed=5)
    server = start_server(tmp, inventory)
    sent, moved = [], {}
    try:
        cs = stream.CollectorStream(server.url, INGEST, workers=2)
        try:
            cs.register(topo, cfg.ts_source)
            for win in simulator.stream(N_WINDOWS):
                t = win.windows
                src = np.array(t["src_nic"].to_pylist(), dtype=object)
                hide = src == NO_PATH_SRC
                if win.index == N_WINDOWS - 1:  # newest window: half the flows lost their path
                    odd = np.asarray(t["sport"].to_numpy()) % 2 == 1
                    hide |= ~odd
                    # ... and some of the others moved to another path, for this window only
                    t, moved = _move_paths(t, odd & (src == MOVED_SRC), topo)
                win = dataclasses.replace(win, windows=_hide_paths(t, hide))
                cs.send_window(win, seed=5)
                sent.append(win.windows.select(WINDOW_SCHEMA.names))
        finally:
            cs.close()
        assert not cs.stats.rejected, cs.stats.rejected[:3]
        assert moved  # (the flows of a pair on two leaves have two paths over 2 spines)
        yield Fleet(server, epoch, pa.concat_tables(sent), moved)
    finally:
        server.stop()


def _expected(sent: pa.Table, since: int, until: int) -> list[dict]:
    """The oracle: per flow over the windows wholly inside [since, until), in numpy."""
    start = sent["start_ns"].to_numpy()
    keep = (start >= since) & (start + sent["duration_ns"].to_numpy() <= until)
    t = sent.filter(pa.array(keep))
    key = list(zip(t["src_nic"].to_pylist(), t["dst_nic"].to_pylist(),
                   t["sport"].to_pylist(), strict=True))  # fmt: skip
    cols = {n: t[n].to_numpy(zero_copy_only=False) for n in
            ("start_ns", "sent", "received", "owd_min_ns", "owd_p50_ns")}  # fmt: skip
    paths = t["path"].to_pylist()
    groups: dict[tuple, list[int]] = {}
    for i, k in enumerate(key):
        groups.setdefault(k, []).append(i)
    out = []
    for (src, dst, sport), idx in sorted(groups.items()):
        ix = np.array(idx)
        mins = cols["owd_min_ns"][ix].astype(float)
        p50 = cols["owd_p50_ns"][ix].astype(float)
        # the path of most windows, ties to the newest (max of (count, newest start))
        used: dict[tuple, list[int]] = {}
        for i in idx:
            if paths[i] is not None:
                used.setdefault(tuple(paths[i]), []).append(int(cols["start_ns"][i]))
        best = max(used.items(), key=lambda kv: (len(kv[1]), max(kv[1])), default=None)
        out.append({
            "src_nic": src, "dst_nic": dst, "sport": sport, "windows": len(idx),
            "sent": int(cols["sent"][ix].sum()), "received": int(cols["received"][ix].sum()),
            "owd_min_ns": float(np.nanmin(mins)) if np.isfinite(mins).any() else None,
            "owd_min_median_ns": float(np.nanmedian(mins)) if np.isfinite(mins).any() else None,
            "owd_p50_ns": float(np.nanmedian(p50)) if np.isfinite(p50).any() else None,
            "path": list(best[0]) if best is not None else None,
        })  # fmt: skip
    return out


def _get_all(fleet: Fleet, limit: int, **params: object) -> tuple[list[dict], int]:
    rows: list[dict] = []
    with fleet.server.client(READ) as c:
        while True:
            r = c.get("/v1/flows", params={**params, "limit": limit, "offset": len(rows)})
            assert r.status_code == 200, r.text
            total = int(r.headers["X-Total-Count"])
            rows += r.json()
            if len(r.json()) < limit:
                return rows, total


def _same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for k in ("owd_min_ns", "owd_min_median_ns", "owd_p50_ns"):
            assert g[k] == pytest.approx(w[k], rel=1e-12, abs=1e-9), (k, g, w)
        rest = {k: v for k, v in g.items() if not k.startswith("owd")}
        assert rest == {k: v for k, v in w.items() if not k.startswith("owd")}


def test_flows_equal_the_windows_sent(fleet: Fleet) -> None:
    since, until = fleet.epoch, fleet.epoch + N_WINDOWS * WIN
    want = _expected(fleet.sent, since, until)
    got, total = _get_all(fleet, 1000, since=since, until=until)
    assert total == len(got) == len(want) > 100
    _same(got, want)
    assert {g["windows"] for g in got} == {N_WINDOWS}
    # Loss on the faulted link shows up in the flows crossing it, and only there.
    lossy = [g for g in got if g["path"] and "leaf0->spine1" in g["path"]]
    clean = [g for g in got if g["path"] and "leaf0->spine1" not in g["path"]]
    assert lossy and clean
    assert sum(g["sent"] - g["received"] for g in lossy) > 0.1 * sum(g["sent"] for g in lossy)
    # The newest window hid even sports' paths: those flows answer the previous window's.
    assert all(g["path"] is None for g in got if g["src_nic"] == NO_PATH_SRC)
    assert all(g["path"] for g in got if g["src_nic"] != NO_PATH_SRC)


def test_pages_are_stable_and_complete(fleet: Fleet) -> None:
    since, until = fleet.epoch, fleet.epoch + N_WINDOWS * WIN
    whole, total = _get_all(fleet, 1000, since=since, until=until)
    paged, total7 = _get_all(fleet, 7, since=since, until=until)
    assert paged == whole and total7 == total == len(whole)
    keys = [(g["src_nic"], g["dst_nic"], g["sport"]) for g in whole]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    with fleet.server.client(READ) as c:
        r = c.get("/v1/flows", params={"since": since, "until": until, "offset": total + 5})
        assert r.status_code == 200 and r.json() == []
        assert int(r.headers["X-Total-Count"]) == total


def test_period_counts_only_windows_wholly_inside(fleet: Fleet) -> None:
    # [epoch + 0.5 s, epoch + 3.5 s): windows 1 and 2 only (0 starts before, 3 ends after).
    since, until = fleet.epoch + WIN // 2, fleet.epoch + 3 * WIN + WIN // 2
    got, _ = _get_all(fleet, 1000, since=str(since), until=str(until))
    assert {g["windows"] for g in got} == {2}
    _same(got, _expected(fleet.sent, since, until))
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(fleet.epoch // WIN + 1))
    by_iso, _ = _get_all(fleet, 1000, since=iso, until=str(fleet.epoch + 3 * WIN))
    assert {g["windows"] for g in by_iso} == {2}
    empty, total = _get_all(fleet, 1000, since=since, until=since + 1)
    assert empty == [] and total == 0


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-01-01T00:00:00"}, "until"),  # no time zone
        ({"since": "2000", "until": "1000"}, "until"),
        ({"since": "0", "until": str(40 * 86400 * 10**9)}, "since"),  # longer than allowed
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"offset": "-1"}, "offset"),
    ],
)
def test_bad_parameters_name_the_field(fleet: Fleet, params: dict, field: str) -> None:
    with fleet.server.client(READ) as c:
        r = c.get("/v1/flows", params=params)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field, r.json()


def test_read_token_required(fleet: Fleet) -> None:
    with fleet.server.client(None) as c:
        assert c.get("/v1/flows").status_code == 401
    with fleet.server.client(INGEST) as c:
        assert c.get("/v1/flows").status_code == 403
    with fleet.server.client("wrong") as c:
        assert c.get("/v1/flows").status_code == 401


def test_a_copy_of_the_store_file_gives_the_same_totals(fleet: Fleet, tmp_path: Path) -> None:
    """What the audit reads without a collector: the totals from a read-only Store opened on
    a copy of the live file (with its write-ahead log) equal the windows sent."""
    since, until = fleet.epoch, fleet.epoch + N_WINDOWS * WIN
    store = Store(_copy_of_store(fleet.server.db, tmp_path), read_only=True)
    try:
        t = store.flow_totals(since, until)
        paths = store.decode_paths(t["path"]).to_pylist()
    finally:
        store.close()
    got = [
        dict(r, path=p) for r, p in zip(t.drop_columns(["path"]).to_pylist(), paths, strict=True)
    ]
    _same(got, _expected(fleet.sent, since, until))


def _copy_of_store(db: Path, into: Path) -> Path:
    copy = into / "snapshot.duckdb"
    copy.write_bytes(db.read_bytes())
    wal = db.with_name(db.name + ".wal")
    if wal.exists():
        copy.with_name(copy.name + ".wal").write_bytes(wal.read_bytes())
    return copy


def test_a_flow_whose_path_changed_reports_its_most_used_path(fleet: Fleet, tmp_path: Path) -> None:
    """A path that changed mid-period: the API and the audit (remote and local) report the
    path that carried most of the period's windows, not the newest one."""
    since, until = fleet.epoch, fleet.epoch + N_WINDOWS * WIN
    api, _ = _get_all(fleet, 1000, since=since, until=until)
    rest = RestReader(fleet.server.url, READ)
    try:
        remote = rest.flows(since, until)
    finally:
        rest.close()
    local, _ = read_flows(_copy_of_store(fleet.server.db, tmp_path), since, until)
    assert remote is not None
    by_source = {
        "api": {(r["src_nic"], r["dst_nic"], r["sport"]): r["path"] for r in api},
        "remote audit": _paths(remote),
        "local audit": _paths(local),
    }
    for source, paths in by_source.items():
        for flow, (before, newest) in fleet.moved.items():
            assert before != newest
            assert paths[flow] == before, (source, flow)  # 3 windows of 4 took it


def _paths(flows: Flows) -> dict[FlowKey, list[str] | None]:
    keys = zip(flows.src.tolist(), flows.dst.tolist(), flows.sport.tolist(), strict=True)
    return dict(zip(keys, flows.path.to_pylist(), strict=True))
