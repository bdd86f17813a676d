"""The collector's rounds: what its triangulation and clock loops run, given the wall time.

- A triangulation round hands each settled window to the engine once, oldest first
  (``feed.py``), or, without an inventory, the fallback the look-back the clocks are solved on;
  the verdicts and the drain decisions derived from them are stored in one transaction and
  published. A failing clock solve holds none of them back.
- A clock round solves the look-back up to the newest window generation every live agent has
  uploaded (``arrivals.py``), then stores and publishes the models; ``clockgate.py`` learns
  from them which hosts' delays triangulation may use.

Every committed batch is reported here (:meth:`Rounds.committed`): it moves the newest stored
window and may complete a window generation, which wakes the loops.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fleetlens.api.arrivals import WindowArrivals
from fleetlens.api.clockgate import ClockGate
from fleetlens.api.feed import TriangulationFeed
from fleetlens.api.known import KnownNics
from fleetlens.api.loops import timed
from fleetlens.api.metrics import Metrics
from fleetlens.api.owdhist import NicIds
from fleetlens.api.publish import Published
from fleetlens.api.store import Store
from fleetlens.triangulate import decisions, decisions_by_nic

from fleetlens.batch import Batch
from fleetlens.engines import SolveClocks, Triangulate
from fleetlens.records import WINDOW_SCHEMA, Decision, Verdict
from fleetlens.topology import Topology

DEFAULT_WINDOW_NS = 1_000_000_000  # a batch whose first window has no duration


@dataclass(kw_only=True)
class Rounds:
    """The loops' rounds over the collector's parts. ``fallback``: the triangulation engine
    judges the look-back (it keeps no per-window state), not the feed's settled windows."""

    topology: Topology | None
    solve_clocks: SolveClocks
    triangulate: Triangulate
    fallback: bool
    lookback_ns: int
    store: Store
    known: KnownNics
    arrivals: WindowArrivals
    feed: TriangulationFeed
    clock_gate: ClockGate
    published: Published
    metrics: Metrics
    wake: Callable[[], None]
    newest_start_ns: int | None = field(init=False)  # newest window start stored
    judged_end_ns: int | None = field(init=False, default=None)  # newest judged window's end

    def __post_init__(self) -> None:
        self.newest_start_ns = self.store.newest_window_start()

    def run(self, now_ns: int) -> None:
        """Both rounds, one after the other (what tests and replays drive)."""
        self.triangulation_round(now_ns)
        self.clock_round(now_ns)

    def committed(self, group: list[tuple[Batch, bool]], seconds: float) -> None:
        """The writer committed a group of batches in ``seconds`` (each with ``stored``: it
        was new, not a retry); called on the writer thread, once per commit. The group's
        rows are handled as one table: metrics, look-back and arrivals each cost a fixed
        part per call, and the writer groups up to hundreds of agents' batches when busy."""
        m = self.metrics
        new = [b for b, stored in group if stored]
        m.commit_group.observe(len(group))
        for _ in group:
            m.commit_seconds.observe(seconds)
        if len(new) < len(group):
            m.batches.labels("duplicate").inc(len(group) - len(new))
        if not new:
            return
        m.batches.labels("stored").inc(len(new))
        full = [b for b in new if b.rows]
        if not full:
            return
        rows = pa.concat_tables([b.windows for b in full])
        lo, hi, duration = _spans(rows, [b.rows for b in full])
        sent = [_sent(*each) for each in zip(full, lo, hi, duration, strict=True)]
        newest = max(max(starts) for _, starts, _ in sent)
        self.newest_start_ns = max(self.newest_start_ns or newest, newest)
        m.windows.inc(rows.num_rows)
        m.owd.observe(rows, self._nic_ids(rows.num_rows))
        self.feed.recent.add_all([b.windows for b in full], (lo, hi))
        if self.arrivals.stored(sent, time.time_ns()):
            self.wake()

    def _nic_ids(self, rows: int) -> NicIds | None:
        """The NIC ids the store's layout gave the group's new rows (the same rows, in the
        same order), or None (a store that keeps none: the names are looked up)."""
        got = self.store.last_nic_ids
        if got is None or len(got[0]) != rows:
            return None
        return NicIds(got[0], got[1], self.store.dicts.nics.ids)

    def newest_windows(self, now_ns: int | None = None) -> pa.Table:
        """The look-back up to the newest window generation every live agent has uploaded."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        hi = self.arrivals.solve_upto(now_ns, self.newest_start_ns)
        if hi is None:
            return WINDOW_SCHEMA.empty_table()
        # Paths are triangulation's, which reads its own windows (the fallback excepted).
        skip = () if self.fallback else ("path",)
        lo = hi - self.lookback_ns
        held = self.feed.recent.between(lo, hi, skip)
        return self.store.windows_between(lo, hi, skip) if held is None else held

    def triangulation_round(self, now_ns: int) -> None:
        """The settled windows triangulated, their verdicts and drain decisions stored in one
        transaction and published."""
        ends: list[int] = []
        judge = self._judge_lookback if self.fallback else self._judge_feed
        verdicts = judge(now_ns, ends)
        if verdicts is None:
            return
        self.published.verdicts_round(verdicts, self.decide(verdicts, now_ns), now_ns)
        done = time.time_ns()
        for end in ends:
            self.metrics.verdict_lag.observe((done - end) / 1e9)
        if ends:
            self.judged_end_ns = max(ends)

    def clock_round(self, now_ns: int) -> None:
        """The clock solve on the look-back, its models stored (one transaction) and published."""
        windows = self.newest_windows(now_ns)
        prev = dict(self.published.clocks)
        solve = self.solve_clocks
        clocks = timed(self.metrics, "clocks", solve, windows, self.topology, prev)
        if clocks is not None:
            self.clock_gate.note_models(clocks, now_ns)
            self.published.clocks_round(clocks, now_ns)

    def decide(self, verdicts: list[Verdict], now_ns: int) -> list[Decision]:
        """Per host, the NICs to drain given these verdicts."""
        if self.topology is not None:
            return decisions(verdicts, self.topology, now_ns)
        return decisions_by_nic(verdicts, self.known.nics().to_pylist(), now_ns)

    def judged_age_s(self) -> float:
        """Seconds since the end of the newest window whose verdicts are out (NaN: none yet)."""
        end = self.judged_end_ns
        return math.nan if end is None else (time.time_ns() - end) / 1e9

    def _judge_feed(self, now_ns: int, ends: list[int]) -> list[Verdict] | None:
        """Each settled window handed to the engine once, oldest first; the end of each
        window judged is appended to ``ends``."""
        verdicts = list(self.published.verdicts.values())
        for one in self.feed.windows(self.newest_start_ns, now_ns):
            out = self._triangulate(one)
            if out is None:
                return None
            verdicts = out
            ends.append(self.feed.judged(one))
        return verdicts

    def _judge_lookback(self, now_ns: int, ends: list[int]) -> list[Verdict] | None:
        windows = self.newest_windows(now_ns)
        if windows.num_rows:
            ends.append(pc.max(pc.add(windows["start_ns"], windows["duration_ns"])).as_py())
        return self._triangulate(windows)

    def _triangulate(self, windows: pa.Table) -> list[Verdict] | None:
        prev = dict(self.published.verdicts)
        return timed(self.metrics, "triangulate", self.triangulate, windows, self.topology, prev)


def _spans(rows: pa.Table, sizes: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Per batch of a commit group (``rows``: theirs, concatenated; ``sizes``: their row
    counts), its first and last window start and its first window's duration: in one pass
    over the group, not three numpy calls per batch (~15 us an agent batch)."""
    first = np.cumsum([0, *sizes[:-1]])
    start = rows["start_ns"].to_numpy()
    duration = pc.fill_null(rows["duration_ns"], 0).to_numpy()[first]
    lo, hi = np.minimum.reduceat(start, first), np.maximum.reduceat(start, first)
    return lo.tolist(), hi.tolist(), duration.tolist()


def _sent(batch: Batch, lo: int, hi: int, duration_ns: int) -> tuple[str, list[int], int]:
    """A batch's host, the window starts in it (nearly always one: its first and last start
    are ``lo`` and ``hi``) and their duration."""
    starts = [lo] if lo == hi else np.unique(batch.windows["start_ns"].to_numpy()).tolist()
    return batch.host_id, starts, duration_ns or DEFAULT_WINDOW_NS
