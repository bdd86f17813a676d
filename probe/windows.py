"""Turn the fast path's per-pair samples into per-flow window records (vectorized).

A pair belongs to the window of its send time in fleet time (the first TX stamp through the
host's clock model). A window is complete once every pair sent in it has been acked or timed
out. The engine numbers pairs 0, 1, 2, ... in send order and reports each exactly once, so the
agent notes the engine's ``pairs_sent`` counter when fleet time crosses a window's end
(:meth:`WindowBuilder.mark_end`) and the window is complete as soon as every pair below that
number has been reported (:class:`PairLedger`) — on a healthy fabric a few ms after its end,
which is what lets the collector solve clocks right after each window. A pair that is never
answered holds its window until the ack timeout; ``end + grace`` stays as the upper bound. A
window is closed once: a pair reported after it closed (only possible when a new clock model
moved fleet time back across the boundary) counts in the next open window. Per flow and window:

- ``sent``/``received``: probe packets sent, and those the receiver says arrived (the pair's
  ack, or a later ack's records or receive bitmap: a lost ack never reads as a lost probe);
- ``acks_lost``: pairs whose own ack was lost (a later ack answered for them): evidence about
  the reverse path, kept out of ``received``;
- ``pure``: pairs with all four stamps whose receive gap equals the send gap within
  ``purity_ns`` (neither packet met extra queueing on the way);
- one-way delay in fleet time (``rx_fleet - tx_fleet``, both probes of every pair) as
  min/p50/p99/max, nearest-rank percentiles;
- the lower convex hull of the pure ``(tx0 raw, rx0 raw - tx0 raw)`` points, only those on
  the hull of its NIC pair's flows' points in the window (all in this batch: the sender's).

The statistics and the hull are :func:`fleetlens.summary.summarize`, the simulator's too.

Flows of a NIC pair whose discovered paths are the same are one record, under the group's
lowest source port, over all of their probes (``fleetlens.pathgroups``): a pair's ~50 ports
then make as many records as it has paths. A flow whose path is not known has its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from fleetlens.probe.fastpath import (
    FLAG_ACK_LOST,
    FLAG_HEARD0,
    FLAG_HEARD1,
    FLAG_RX0,
    FLAG_RX1,
    FLAG_SENT0,
    FLAG_SENT1,
    FLAG_TX0,
    FLAG_TX1,
)

from fleetlens.pathgroups import path_ids, representatives
from fleetlens.records import WINDOW_SCHEMA, ClockModel
from fleetlens.summary import WindowSummary, pad_rows, summarize

DEFAULT_PURITY_NS = 1_000  # software stamps on a quiet veth: |gap error| p99 ~ 0.5 µs
_ALL_STAMPS = FLAG_TX0 | FLAG_TX1 | FLAG_RX0 | FLAG_RX1


@dataclass(frozen=True)
class FlowTable:
    """Flow id -> (src NIC, dst NIC, source port), the order the engine numbers them in."""

    src_nic: np.ndarray  # object arrays of NIC ids
    dst_nic: np.ndarray
    sport: np.ndarray  # int32
    ts_source: np.ndarray  # object array: the sending NIC's timestamp source

    def __len__(self) -> int:
        return len(self.sport)


class PairLedger:
    """Which pair numbers the engine has reported: all below ``done_below``, plus a few above
    it (answered out of order while an older pair still waits for its ack or timeout)."""

    def __init__(self) -> None:
        self.done_below = 0
        self._ahead = np.empty(0, np.int64)

    def add(self, pairs: np.ndarray) -> None:
        # The engine's numbers are uint32 and wrap (after ~4e9 pairs): unwrap them relative
        # to done_below; all outstanding pairs are within 2^31 of it.
        off = (pairs.astype(np.int64) - self.done_below + (1 << 31)) % (1 << 32) - (1 << 31)
        merged = np.union1d(self._ahead, off[off >= 0] + self.done_below)
        gap = merged - np.arange(merged.size) != self.done_below  # False while contiguous
        k = int(np.argmax(gap)) if gap.any() else merged.size
        self.done_below += k
        self._ahead = merged[k:]


class WindowBuilder:
    def __init__(
        self, flows: FlowTable, window_ns: int, purity_ns: int = DEFAULT_PURITY_NS
    ) -> None:
        self.flows = flows
        self.window_ns = window_ns
        self.purity_ns = purity_ns
        self._pending: list[dict[str, np.ndarray]] = []
        self.paths: dict[int, list[str]] = {}  # flow id -> discovered path
        pairs = [f"{a}>{b}" for a, b in zip(flows.src_nic, flows.dst_nic, strict=True)]
        self._pair = np.unique(np.array(pairs, str), return_inverse=True)[1].reshape(-1)
        self._rep = np.arange(len(flows))  # flow id -> the flow reporting for its path
        self.ledger = PairLedger()
        self._ends: list[tuple[int, int]] = []  # (window index, pairs sent when it ended)
        self._closed = -(1 << 62)  # every window up to this index has been popped

    def learn_paths(self, paths: dict[int, list[str]]) -> None:
        """Discovered paths (flow id -> links): later records group flows by them."""
        if not paths:
            return
        self.paths.update(paths)
        ids = path_ids([self.paths.get(f) for f in range(len(self.flows))])
        self._rep = representatives(self._pair, self.flows.sport, ids)

    def add(self, samples: dict[str, np.ndarray], clock: ClockModel, now_raw_ns: int) -> None:
        """Stamp the samples with their window, using the clock model current at this moment."""
        if samples["flow"].size == 0:
            return
        self.ledger.add(samples["pair"])
        flags = samples["flags"]
        tx0_f = clock.to_fleet(samples["tx0"])
        tx1_f = clock.to_fleet(samples["tx1"])
        ref = np.where(
            flags & FLAG_TX0, tx0_f, np.where(flags & FLAG_TX1, tx1_f, clock.to_fleet(now_raw_ns))
        )
        window = np.maximum(ref // self.window_ns, self._closed + 1)
        self._pending.append({**samples, "tx0_fleet": tx0_f, "tx1_fleet": tx1_f, "window": window})

    def mark_end(self, window: int, pairs_sent: int) -> None:
        """Fleet time has just passed the end of ``window``; the engine had sent ``pairs_sent``
        pairs by then (every later pair belongs to a later window)."""
        self._ends.append((window, pairs_sent))

    def ended(self) -> bool:
        """Whether an ended window is still waiting to be popped."""
        return bool(self._ends)

    def pop_complete(self, now_fleet_ns: int, grace_ns: int) -> pa.Table | None:
        """Windows whose pairs were all reported, or that ended before ``now - grace``, as one
        table in WINDOW_SCHEMA (None if none)."""
        last = (now_fleet_ns - grace_ns) // self.window_ns - 1  # ended at least grace ago
        while self._ends and self._ends[0][1] <= self.ledger.done_below:
            last = max(last, self._ends.pop(0)[0])
        self._ends = [e for e in self._ends if e[0] > last]
        self._closed = max(self._closed, last)
        # Called every round while a window waits for its last acks: concatenate only when
        # something is due.
        if not self._pending or min(int(p["window"].min()) for p in self._pending) > last:
            return None
        s = {k: np.concatenate([p[k] for p in self._pending]) for k in self._pending[0]}
        done = s["window"] <= last
        keep = {k: v[~done] for k, v in s.items()}
        self._pending = [keep] if keep["flow"].size else []
        if not done.any():
            return None
        return self._summarise({k: v[done] for k, v in s.items()})

    def _summarise(self, s: dict[str, np.ndarray]) -> pa.Table:
        key = s["window"] * len(self.flows) + self._rep[s["flow"]]
        groups, g = np.unique(key, return_inverse=True)
        n = groups.size
        win, flow = groups // len(self.flows), groups % len(self.flows)
        g = g.reshape(-1)
        pair = win * (int(self._pair.max()) + 1) + self._pair[flow]  # directed pair and window
        summary = summarize_samples(s, g, n, self.purity_ns, pair)
        acks_lost = np.bincount(g, (np.asarray(s["flags"], np.uint16) & FLAG_ACK_LOST) > 0, n)
        cols = {
            "src_nic": pa.array(self.flows.src_nic[flow], pa.string()),
            "dst_nic": pa.array(self.flows.dst_nic[flow], pa.string()),
            "sport": pa.array(self.flows.sport[flow], pa.int32()),
            "start_ns": pa.array(win * self.window_ns, pa.int64()),
            "duration_ns": pa.array(np.full(n, self.window_ns), pa.int64()),
            **summary.columns(),
            "ts_source": pa.array(self.flows.ts_source[flow], pa.string()),
            "path": pa.array([self.paths.get(int(f)) for f in flow], pa.list_(pa.string())),
            "acks_lost": pa.array(acks_lost.astype(np.int32)),
        }
        return pa.table(cols, schema=WINDOW_SCHEMA)


def summarize_samples(
    s: dict[str, np.ndarray], g: np.ndarray, n: int, purity_ns: int, pair: np.ndarray | None = None
) -> WindowSummary:
    """The summary of the fast path's samples ``s``, one row per group ``0 <= g < n``; the
    OWDs of both probes of every pair count. ``pair``: per group, its NIC pair and window
    key (:func:`summarize`: each row's hull cut to its pair's)."""
    fl = np.asarray(s["flags"], np.uint16)  # the engine's flags are 16-bit since wire v2

    def has(flag: int) -> np.ndarray:
        return (fl & flag) > 0

    ok0, ok1 = has(FLAG_TX0) & has(FLAG_RX0), has(FLAG_TX1) & has(FLAG_RX1)
    gap_err = np.abs((s["rx1"] - s["rx0"]) - (s["tx1"] - s["tx0"]))
    _, (sent, received, pure, t, y, owd0, owd1, v0, v1) = pad_rows(
        g,
        n,
        has(FLAG_SENT0) + has(FLAG_SENT1).astype(np.int64),
        # a probe arrived if its stamps came back, or a later ack's bitmap says so (stamps lost)
        has(FLAG_RX0 | FLAG_HEARD0) + has(FLAG_RX1 | FLAG_HEARD1).astype(np.int64),
        ((fl & _ALL_STAMPS) == _ALL_STAMPS) & (gap_err <= purity_ns),
        s["tx0"],
        s["rx0"] - s["tx0"],
        (s["rx0_fleet"] - s["tx0_fleet"]).astype(np.float64),
        (s["rx1_fleet"] - s["tx1_fleet"]).astype(np.float64),
        ok0,
        ok1,
    )
    owd, valid = np.hstack([owd0, owd1]), np.hstack([v0, v1])
    return summarize(sent, received, pure, t, y, owd, valid, pair)
