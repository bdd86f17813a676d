"""Wire records shared by the agent, the simulator, the collector, sync and triangulation.

Time is integer nanoseconds everywhere. "Raw" times are read off a host's own clock; "fleet"
times have been mapped through that host's :class:`ClockModel`.

A :class:`Window` summarises one flow ``(src_nic, dst_nic, sport)`` over one window (default
1 s). Its hull is the flow's pure ``(t, owd_raw)`` points that are vertices of the lower convex
hull of its NIC pair's pure points in the window (all the pair's flows), where ``t`` is the
sender's raw transmit time of the pair's first probe and ``owd_raw = rx0_raw - tx0_raw``: the
max-margin separator between the two directions of an edge depends only on the two pair
hulls, so a handful of points per pair and window carry all the clock-sync information, and
the union of a pair's rows' hulls has exactly the pair's hull (``fleetlens.summary``). A row
may hold none. Records of agents that sent each flow's whole lower hull give the same pair
hulls.

Counts: ``sent`` and ``received`` count probe packets (two per pair); ``pure`` counts pairs;
``acks_lost`` counts pairs whose own ack never came back although the receiver saw the pair
(a later ack's receive bitmap told): evidence about the reverse path, never forward loss. It
is null (unknown) in records of agents older than the column.
One-way-delay statistics are in fleet time and are ``None`` when nothing was received.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TS_SOFTWARE, TS_HARDWARE = "software", "hardware"
STATES = ("healthy", "suspect", "faulty")


@dataclass(frozen=True)
class Flow:
    """A probe flow; ECMP pins it to one path through the fabric."""

    src_nic: str
    dst_nic: str
    sport: int


@dataclass(frozen=True)
class ClockModel:
    """Maps a host's raw clock to fleet time: ``raw - fleet = offset + drift·(raw - t0)``."""

    host_id: str
    t0_ns: int = 0
    offset_ns: float = 0.0
    drift_ppb: float = 0.0
    error_bound_ns: float | None = None
    synced: bool = False

    @overload
    def to_fleet(self, raw_ns: int) -> int: ...
    @overload
    def to_fleet(self, raw_ns: np.ndarray) -> np.ndarray: ...
    def to_fleet(self, raw_ns: np.ndarray | int) -> np.ndarray | int:
        """Raw time to fleet time: a Python int for an int (or a 0-d array), else an array."""
        raw = np.asarray(raw_ns, dtype=np.int64)
        corr = self.offset_ns + self.drift_ppb * 1e-9 * (raw - self.t0_ns).astype(np.float64)
        out = raw - np.rint(corr).astype(np.int64)
        return out if out.ndim else int(out)

    @classmethod
    def identity(cls, host_id: str) -> ClockModel:
        return cls(host_id)


@dataclass(frozen=True)
class ProbeSample:
    """One coded probe pair as the sender knows it once the ack is back (raw clocks)."""

    flow: Flow
    seq: int
    tx0_ns: int
    tx1_ns: int
    rx0_ns: int
    rx1_ns: int

    @property
    def owd_raw_ns(self) -> int:
        return self.rx0_ns - self.tx0_ns

    def is_pure(self, threshold_ns: int) -> bool:
        return abs((self.rx1_ns - self.rx0_ns) - (self.tx1_ns - self.tx0_ns)) <= threshold_ns


@dataclass
class Window:
    src_nic: str
    dst_nic: str
    sport: int
    start_ns: int
    duration_ns: int
    sent: int
    received: int
    pure: int
    owd_min_ns: float | None = None
    owd_p50_ns: float | None = None
    owd_p99_ns: float | None = None
    owd_max_ns: float | None = None
    hull_t_ns: list[int] = field(default_factory=list)
    hull_owd_ns: list[int] = field(default_factory=list)
    ts_source: str = TS_SOFTWARE
    path: list[str] | None = None
    acks_lost: int | None = None

    @property
    def flow(self) -> Flow:
        return Flow(self.src_nic, self.dst_nic, self.sport)


WINDOW_SCHEMA = pa.schema(
    [
        ("src_nic", pa.string()),
        ("dst_nic", pa.string()),
        ("sport", pa.int32()),
        ("start_ns", pa.int64()),
        ("duration_ns", pa.int64()),
        ("sent", pa.int32()),
        ("received", pa.int32()),
        ("pure", pa.int32()),
        ("owd_min_ns", pa.float64()),
        ("owd_p50_ns", pa.float64()),
        ("owd_p99_ns", pa.float64()),
        ("owd_max_ns", pa.float64()),
        ("hull_t_ns", pa.list_(pa.int64())),
        ("hull_owd_ns", pa.list_(pa.int64())),
        ("ts_source", pa.string()),
        ("path", pa.list_(pa.string())),
        ("acks_lost", pa.int32()),  # nullable: unknown from agents older than the column
    ]
)
HULLS = ("hull_t_ns", "hull_owd_ns")  # the window's columns only clock sync reads


def nic_hosts(nics: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """The host of each NIC id in an Arrow column (``h03/eth1`` -> ``h03``)."""
    return pc.list_element(pc.split_pattern(nics, "/", max_splits=1), 0)


def windows_to_table(windows: list[Window]) -> pa.Table:
    cols = {name: [getattr(w, name) for w in windows] for name in WINDOW_SCHEMA.names}
    return pa.table(cols, schema=WINDOW_SCHEMA)


def table_to_windows(table: pa.Table) -> list[Window]:
    return [Window(**row) for row in table.select(WINDOW_SCHEMA.names).to_pylist()]


def lower_hull(t: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices (sorted by t) of the lower convex hull of the points (t, y); Andrew's chain."""
    t = np.asarray(t, dtype=np.int64)
    y = np.asarray(y, dtype=np.int64)
    order = np.lexsort((y, t))
    hull: list[int] = []
    # Float cross products: exact enough at ns over a 1 s window (|dt|,|dy| < 2^31).
    for i in order:
        while len(hull) >= 2:
            o, a = hull[-2], hull[-1]
            dt_a, dy_a = float(t[a] - t[o]), float(y[a] - y[o])
            cross = dt_a * float(y[i] - y[o]) - dy_a * float(t[i] - t[o])
            if cross > 0:
                break
            hull.pop()
        if hull and t[hull[-1]] == t[i]:
            continue  # same t, larger y: never on the lower hull
        hull.append(int(i))
    return np.asarray(hull, dtype=np.int64)


@dataclass
class Verdict:
    """Health of one subject: a directed link, a switch, a NIC or a host."""

    subject: str
    kind: str  # 'link' | 'switch' | 'nic' | 'host'
    state: str  # one of STATES
    since_ns: int
    excess_delay_ns: float = 0.0
    loss_rate: float = 0.0
    confidence: float = 0.0
    evidence: int = 0
    flows: list[str] = field(default_factory=list)
    flapping: bool = False
    # links only: the ambiguity group the link belongs to (links the probes cannot tell
    # apart, ``fleetlens.ties``), reported together; None and 1 for a link named alone
    group_id: str | None = None
    group_size: int = 1


@dataclass
class DrainEntry:
    nic_id: str
    reason: str
    since_ns: int


@dataclass
class Decision:
    """Per host: the local NICs LinkPass should drain, and why (collector -> agent -> plugin)."""

    host_id: str
    generated_ns: int
    drain: list[DrainEntry] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Decision:
        d = json.loads(text)
        return cls(d["host_id"], int(d["generated_ns"]), [DrainEntry(**e) for e in d["drain"]])

    def write_atomic(self, path: str | Path) -> None:
        """Write then rename, so the plugin watching ``path`` never reads half a file."""
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as f:
            f.write(self.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


@dataclass(frozen=True)
class PlanEntry:
    """One peer a local NIC probes, and the source ports it rotates through."""

    src_nic: str
    dst_nic: str
    dst_ip: str
    sports: tuple[int, ...]


@dataclass
class HostPlan:
    host_id: str
    dport: int
    period_ns: int
    window_ns: int
    entries: list[PlanEntry]
    clock: ClockModel
