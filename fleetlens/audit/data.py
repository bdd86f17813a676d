"""What ``fleetlens audit`` reads: the collector's REST API, and per-flow totals.

- :class:`RestReader` asks a running collector for its inventory (links, NICs), clock models,
  the live triangulation's verdict history per link, and every probed NIC pair's one-way delay
  and loss over the audit period (one bucket per pair).
- :meth:`RestReader.flows` asks the collector for its per-flow totals (``GET /v1/flows``,
  paged), so an audit from any machine fits the same tomography; and
  :func:`topology_from_rest` rebuilds the fleet inventory the collector serves when the
  operator passes none.
- :func:`read_flows` reads the same per-flow totals (:meth:`Store.flow_totals
  <fleetlens.api.store.Store.flow_totals>`: probes sent and received, the typical one-way
  delay, the path that carried most of the period's windows) from a DuckDB file, with host
  stalls left out (:class:`~fleetlens.api.store.StallRule`). DuckDB lets another process
  open the file only once the collector has stopped (the lab mode stops it first; on the
  collector's machine, ``--db`` reads a copy of the live file).

Every failure to reach or understand the collector is an :class:`AuditInputError` with a
sentence for the operator, never a traceback.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from fleetlens.api.store import StallRule, Store
from fleetlens.client import CollectorClient, CollectorError
from fleetlens.topology import TIER_LEAF, TIER_SPINE, Link, Nic, Switch, Topology


class AuditInputError(RuntimeError):
    """The audit cannot get its input (collector unreachable, bad token, unreadable DB)."""


@dataclass
class RestEvidence:
    links: list[dict] = field(default_factory=list)  # /v1/links rows
    nics: list[dict] = field(default_factory=list)  # /v1/nics rows
    hosts: list[dict] = field(default_factory=list)  # /v1/hosts rows
    clocks: list[dict] = field(default_factory=list)  # /v1/clocks rows
    history: dict[str, list[dict]] = field(default_factory=dict)  # link -> verdict history
    pairs: list[dict] = field(default_factory=list)  # one row per probed NIC pair


class RestReader:
    """The collector's API (:class:`~fleetlens.client.CollectorClient`) as the audit reads it."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.api = CollectorClient(self.url, token, timeout_s)

    def close(self) -> None:
        self.api.close()

    @contextmanager
    def asking(self) -> Iterator[None]:
        """A failed call inside is an AuditInputError saying why, for the operator (the
        client's message names the request and the collector's answer)."""
        try:
            yield
        except CollectorError as e:
            if e.unreachable:
                raise AuditInputError(f"collector {self.url} unreachable: {e}") from None
            if e.status in (401, 403):
                raise AuditInputError(
                    f"collector {self.url} refused {e}; give the read token "
                    "(--token-file or FLEETLENS_READ_TOKEN)"
                ) from None
            raise AuditInputError(f"collector {self.url}: {e}") from None

    def check(self) -> None:
        """Reachable, healthy, and our token may read."""
        with self.asking():
            health = self.api.get("/healthz")
        if not isinstance(health, dict) or "status" not in health:
            raise AuditInputError(f"{self.url} does not look like a FleetLens collector")
        with self.asking():
            self.api.get("/v1/clocks", limit=1)

    def pair(self, src: str, dst: str, since_ns: int, until_ns: int) -> dict | None:
        """One bucket over the whole period: probes, loss, one-way delay of one NIC pair."""
        step = max(until_ns - since_ns, 1_000_000)
        with self.asking():
            pts = self.api.pair_owd(src, dst, since_ns, until_ns, step).get("points", [])
        if not pts:
            return None
        sent = sum(p["sent"] for p in pts)
        recv = sum(p["received"] for p in pts)
        p50 = [p["owd_p50_ns"] for p in pts if p.get("owd_p50_ns") is not None]
        mins = [p["owd_min_ns"] for p in pts if p.get("owd_min_ns") is not None]
        return {
            "src_nic": src, "dst_nic": dst, "sent": sent, "received": recv,
            "loss_rate": (sent - recv) / sent if sent else None,
            "owd_p50_ns": float(np.median(p50)) if p50 else None,
            "owd_min_ns": min(mins) if mins else None,
        }  # fmt: skip

    def flows(self, since_ns: int, until_ns: int, attempts: int = 3) -> Flows | None:
        """Per-flow totals of the windows wholly inside [since, until) from ``GET /v1/flows``,
        page by page in the collector's stable order; None when the collector predates the
        endpoint (404). A late upload adding a flow while we page would shift the offsets:
        then the count differs and we read again."""
        for _ in range(attempts):
            with self.asking():
                try:
                    total = self.api.flow_count(since_ns, until_ns)
                except CollectorError as e:
                    if e.status == 404:
                        return None
                    raise
                rows = self.api.flows(since_ns, until_ns)
            if len(rows) == total:
                return flows_from_rows(rows)
        raise AuditInputError(
            f"collector {self.url}: /v1/flows kept changing while being read ({attempts} tries)"
        )

    def gather(self, since_ns: int, until_ns: int, pairs: list[tuple[str, str]]) -> RestEvidence:
        with self.asking():
            ev = RestEvidence(
                links=self.api.links(),
                nics=self.api.nics(),
                hosts=self.api.hosts(),
                clocks=self.api.paged("/v1/clocks"),
            )
        with self.asking():
            for row in ev.links:
                link = row["link_id"]
                ev.history[link] = self.api.link_history(link, since_ns, until_ns)
        ev.pairs = self.gather_pairs(since_ns, until_ns, pairs)
        return ev

    def gather_pairs(
        self, since_ns: int, until_ns: int, pairs: list[tuple[str, str]]
    ) -> list[dict]:
        """One request per NIC pair (only when no per-flow data is to be had)."""
        out = [self.pair(src, dst, since_ns, until_ns) for src, dst in pairs]
        return [p for p in out if p is not None]

    def probed_pairs(self, hosts: list[str]) -> list[tuple[str, str]]:
        """The NIC pairs the agents of ``hosts`` probe: their plans (the read token may read
        them); none when the collector serves no plans (it has no inventory)."""
        pairs: set[tuple[str, str]] = set()
        for host in hosts:
            try:
                plan = self.api.plan(host)
            except CollectorError:
                continue
            pairs |= {(e.src_nic, e.dst_nic) for e in plan.entries}
        return sorted(pairs)


# ---- per-flow totals ----------------------------------------------------------------------
@dataclass
class Flows:
    """One row per probe flow over the audit period (arrays of equal length)."""

    src: np.ndarray  # NIC ids (object)
    dst: np.ndarray
    sport: np.ndarray  # int64
    windows: np.ndarray  # int64: windows reported
    sent: np.ndarray  # float64 probe packets
    received: np.ndarray
    owd_ns: np.ndarray  # float64: median over windows of the window's minimum (NaN: none)
    path: pa.Array  # list<string>: the path of most of its windows (null: never learned)

    @property
    def n(self) -> int:
        return int(self.src.size)

    def pairs(self) -> list[dict]:
        """Per NIC pair: probes, loss and the median of its flows' one-way delays."""
        key = np.char.add(np.char.add(self.src.astype(str), ">"), self.dst.astype(str))
        uniq, inv = np.unique(key, return_inverse=True)
        sent = np.bincount(inv, self.sent, uniq.size)
        recv = np.bincount(inv, self.received, uniq.size)
        out = []
        for k, name in enumerate(uniq.tolist()):
            src, dst = name.split(">")
            owd = self.owd_ns[(inv == k) & np.isfinite(self.owd_ns)]
            out.append({
                "src_nic": src, "dst_nic": dst, "sent": float(sent[k]),
                "received": float(recv[k]),
                "loss_rate": float(1 - recv[k] / sent[k]) if sent[k] else None,
                "owd_p50_ns": float(np.median(owd)) if owd.size else None,
            })  # fmt: skip
        return out


def flows_from_rows(rows: list[dict]) -> Flows:
    """:class:`Flows` from ``/v1/flows`` rows (the delay: ``owd_min_median_ns``)."""
    try:
        owd = [r["owd_min_median_ns"] for r in rows]
        return Flows(
            src=np.array([r["src_nic"] for r in rows], dtype=object),
            dst=np.array([r["dst_nic"] for r in rows], dtype=object),
            sport=np.array([r["sport"] for r in rows], np.int64),
            windows=np.array([r["windows"] for r in rows], np.int64),
            sent=np.array([r["sent"] for r in rows], np.float64),
            received=np.array([r["received"] for r in rows], np.float64),
            owd_ns=np.array([np.nan if v is None else v for v in owd], np.float64),
            path=pa.array([r["path"] for r in rows], pa.list_(pa.string())),
        )
    except (KeyError, TypeError, ValueError, pa.ArrowException) as e:
        raise AuditInputError(f"/v1/flows rows not understood: {e}") from None


def topology_from_rest(links: list[dict], nics: list[dict]) -> Topology | None:
    """The fleet inventory as the collector serves it (``/v1/nics`` with their leaves,
    ``/v1/links`` with both ends and tiers); None when the collector runs without one. Switch
    tiers are not served: switches with NICs are leaves, the rest spines (the audit's paths
    and judgement use only the links)."""
    inv = [n for n in nics if n.get("leaf")]
    if not inv or not links:  # (registered NICs outside the inventory have no leaf: left out)
        return None
    leaves = {n["leaf"] for n in inv}
    ends = {e for lk in links for e in (lk["a"], lk["b"])}
    switches = sorted(ends - {n["nic_id"] for n in inv})
    return Topology(
        kind="collector", params={},
        hosts=sorted({n["host_id"] for n in inv}),
        nics=[Nic(n["host_id"], n["ifname"], n["ip"] or "", n["leaf"]) for n in inv],
        switches=[Switch(s, TIER_LEAF if s in leaves else TIER_SPINE) for s in switches],
        links=[Link(lk["a"], lk["b"], lk["tier"]) for lk in links],
    )  # fmt: skip


def snapshot(db: Path, into: Path) -> Path:
    """Copy a collector's DuckDB file and its WAL (DuckDB locks the file it has open against
    every other process, readers included; a copy is ours). The copy is taken while the
    collector writes: an incomplete last WAL record is a transaction DuckDB discards on
    replay, and windows of the audit period were committed seconds before."""
    if not db.exists():
        raise AuditInputError(f"no collector database at {db}")
    out, wal = into / db.name, Path(f"{db}.wal")
    try:
        for _ in range(5):
            before = db.stat()
            wal_bytes = wal.read_bytes() if wal.exists() else None  # WAL first: it only grows
            shutil.copyfile(db, out)
            after = db.stat()
            # The main file changes only at a checkpoint (WAL folded in, WAL restarted):
            # then the two copies may not match, so take both again.
            if (before.st_mtime_ns, before.st_size) == (after.st_mtime_ns, after.st_size):
                if wal_bytes is not None:
                    Path(f"{out}.wal").write_bytes(wal_bytes)
                return out
            time.sleep(0.5)
    except OSError as e:
        raise AuditInputError(f"cannot copy {db}: {e.strerror}") from None
    raise AuditInputError(f"{db} kept changing (checkpoints) while being copied")


def read_flows(
    db: Path, since_ns: int, until_ns: int, rule: StallRule | None = None
) -> tuple[Flows, list[dict]]:
    """Per-flow totals of the windows wholly inside [since, until) in a collector's DuckDB
    file, host stalls left out (:class:`~fleetlens.api.store.StallRule`); and the stalls
    found, per host and side."""
    if not db.exists():
        raise AuditInputError(f"no collector database at {db}")
    try:
        store = Store(db, read_only=True)
    except duckdb.Error as e:
        raise AuditInputError(
            f"cannot open {db} read-only ({e}); DuckDB allows that only while no collector "
            "has it open: stop the collector or pass a copy"
        ) from None
    try:
        return _totals(store, since_ns, until_ns, rule or StallRule())
    finally:
        store.close()


def aggregate_windows(
    windows: pa.Table, since_ns: int, until_ns: int, rule: StallRule | None = None
) -> tuple[Flows, list[dict]]:
    """:func:`read_flows` over window records in memory (WINDOW_SCHEMA), stored first in an
    in-memory store as the collector stores them."""
    store = Store(Path(":memory:"))
    try:
        store.insert_windows_raw(windows)
        return _totals(store, since_ns, until_ns, rule or StallRule())
    finally:
        store.close()


def _totals(
    store: Store, since_ns: int, until_ns: int, rule: StallRule
) -> tuple[Flows, list[dict]]:
    stalls = store.host_stalls(since_ns, until_ns, rule)
    t = store.flow_totals(since_ns, until_ns, without=stalls.filter(stalls["excluded"]))
    return _flows(t, store.decode_paths(t["path"])), _stall_summary(stalls)


def _stall_summary(stalls: pa.Table) -> list[dict]:
    out: dict[tuple[str, str], dict] = {}
    for r in stalls.to_pylist():
        d = out.setdefault(
            (r["host"], r["side"]),
            {"host_id": r["host"], "side": "receiving" if r["side"] == "dst" else "sending",
             "seconds": r["seconds"], "of_seconds": r["of_seconds"],
             "excluded": r["excluded"], "worst_loss": 0.0},
        )  # fmt: skip
        d["worst_loss"] = max(d["worst_loss"], float(r["loss"]))
    return sorted(out.values(), key=lambda d: (d["host_id"], d["side"]))


def _flows(t: pa.Table, paths: pa.Array) -> Flows:
    return Flows(
        src=np.array(t["src_nic"].to_pylist(), dtype=object),
        dst=np.array(t["dst_nic"].to_pylist(), dtype=object),
        sport=np.asarray(t["sport"].to_numpy(), np.int64),
        windows=np.asarray(t["windows"].to_numpy(), np.int64),
        sent=np.asarray(t["sent"].to_numpy(), np.float64),
        received=np.asarray(t["received"].to_numpy(), np.float64),
        owd_ns=np.asarray(t["owd_min_median_ns"].to_numpy(zero_copy_only=False), np.float64),
        path=paths,
    )
