"""The windows triangulation is handed: each stored window once, oldest first, when settled.

The engine keeps per-flow baselines and hysteresis, so a window seen twice would count its
losses twice, and a skipped one would leave a hole in its evidence. The feed therefore walks
its own backlog in the store (not the clock solve's look-back: a round slower than the
look-back, on a big fleet, must delay windows, never skip them), one window read at a time
without the hulls (clock sync's), and stops at the first window not yet settled
(``settling.py``); what it hands over is what ``clockgate.py`` lets triangulation judge.

The newest window generations are also held in memory as the writer committed them
(:class:`RecentWindows`): the feed and the clock round read those from there, not back from
DuckDB.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fleetlens.api.clockgate import ClockGate
from fleetlens.api.settling import Settling
from fleetlens.api.store import Store

from fleetlens.records import HULLS, WINDOW_SCHEMA

# Generations kept in memory behind the newest one, beyond the look-back: the feed judges a
# window about a second after its end, so it finds it here unless it fell that far behind.
RECENT_SPARE_NS = 1_000_000_000


class RecentWindows:
    """The rows of the newest window generations, as committed (every committed batch passes
    through :meth:`add`).

    At 1024 hosts x 8 NICs a generation is ~0.9 M rows, and reading one back from DuckDB and
    decoding it took 1-2.6 s: longer than the second it covers, so the loops fell behind real
    time. A generation is answered from memory only if every row of it went through ``add``:
    it started after the newest window stored when the collector started, and it is not older
    than ``keep_ns`` behind the newest generation (pruned). Anything else is the store's."""

    def __init__(self, stored_newest_ns: int | None, keep_ns: int) -> None:
        self._lock = threading.Lock()
        self._rows: dict[int, list[pa.Table]] = {}
        # The held starts as a heap, oldest first, and the newest: pruning pops the old ones
        # (senders stamping off the window grid can make thousands of starts; a scan of them
        # per commit group was most of the upkeep).
        self._starts: list[int] = []
        self._newest: int | None = None
        # Generations up to here (stored before this collector ran, or pruned) are not held.
        self._upto = stored_newest_ns
        self._keep_ns = keep_ns

    def add(self, windows: pa.Table) -> None:
        """A committed batch's rows (``WINDOW_SCHEMA``); called on the writer thread."""
        self.add_all([windows])

    def add_all(
        self,
        tables: list[pa.Table],
        spans: tuple[Sequence[int | None], Sequence[int | None]] | None = None,
    ) -> None:
        """A commit group's batches, each as its rows: a batch nearly always holds one
        generation and is kept whole (filtering the group's table by generation would copy
        its list columns). ``spans``: each table's first and last window start, if known."""
        lo, hi = spans or ([None] * len(tables), [None] * len(tables))
        parts = [(s, part) for t, a, b in zip(tables, lo, hi, strict=True)
                 for s, part in _generations(t, a, b)]  # fmt: skip
        with self._lock:
            for s, part in parts:
                if self._upto is not None and s <= self._upto:
                    continue
                if s not in self._rows:
                    heapq.heappush(self._starts, s)
                    self._rows[s] = []
                    self._newest = s if self._newest is None else max(self._newest, s)
                self._rows[s].append(part)
            while self._newest is not None and self._starts[0] < self._newest - self._keep_ns:
                old = heapq.heappop(self._starts)
                del self._rows[old]
                self._upto = old if self._upto is None else max(self._upto, old)

    def between(self, lo_ns: int, hi_ns: int, without: tuple[str, ...] = ()) -> pa.Table | None:
        """The generations starting in [lo_ns, hi_ns] as ``Store.windows_between`` reads
        them, or None if some of them are not held (read the store)."""
        with self._lock:
            if self._upto is not None and lo_ns <= self._upto:
                return None
            parts = [t for s in sorted(self._rows) if lo_ns <= s <= hi_ns for t in self._rows[s]]
        table = pa.concat_tables(parts) if parts else WINDOW_SCHEMA.empty_table()
        for name in without:  # as the store leaves them: null, unread
            i = table.schema.get_field_index(name)
            table = table.set_column(
                i, name, pa.nulls(table.num_rows, WINDOW_SCHEMA.field(name).type)
            )
        return table

    def held_bytes(self) -> int:
        """Bytes of the rows held (``api/memory.py``)."""
        with self._lock:
            return sum(t.nbytes for parts in self._rows.values() for t in parts)

    def at(self, start_ns: int, without: tuple[str, ...] = ()) -> pa.Table | None:
        """The generation starting at ``start_ns`` (as ``Store.window_at``), or None."""
        return self.between(start_ns, start_ns, without)


def _generations(
    windows: pa.Table, lo: int | None = None, hi: int | None = None
) -> list[tuple[int, pa.Table]]:
    """A batch's rows per window generation (start), as ``WINDOW_SCHEMA``; ``lo``, ``hi``:
    its first and last start, if known."""
    if not windows.num_rows:
        return []
    # Batches are decoded to WINDOW_SCHEMA exactly: a cast would only cost a copy's time.
    if not windows.schema.equals(WINDOW_SCHEMA):
        windows = windows.select(WINDOW_SCHEMA.names).cast(WINDOW_SCHEMA)
    if lo is None or hi is None:
        start = windows["start_ns"].to_numpy()
        lo, hi = int(start.min()), int(start.max())
    if lo == hi:
        return [(lo, windows)]
    starts = np.unique(windows["start_ns"].to_numpy()).tolist()
    return [(s, windows.filter(pc.equal(windows["start_ns"], s))) for s in starts]


class TriangulationFeed:
    def __init__(self, store: Store, settling: Settling, gate: ClockGate, lookback_ns: int):
        self.store = store
        self.settling = settling
        self.gate = gate
        self.lookback_ns = lookback_ns
        self.triangulated_ns: int | None = None  # start of the newest window the feed is past
        self.recent = RecentWindows(store.newest_window_start(), lookback_ns + RECENT_SPARE_NS)

    def windows(self, newest_start_ns: int | None, now_ns: int) -> Iterator[pa.Table]:
        """Each settled window not handed over yet, as triangulation may judge it. The caller
        calls :meth:`judged` once the engine took it, and stops iterating if it failed (the
        window is handed over again next round)."""
        lo = self._backlog_start(newest_start_ns)
        if lo is None:
            return
        self.gate.note_live(self.store.first_window_per_host(lo))
        for start in self.store.window_starts(lo):
            # On a reference fleet (6 M rows) reading the whole backlog and filtering it took
            # ~4 s a window: one window at a time, without the hulls.
            window = self.recent.at(start, HULLS)
            if window is None:
                window = self.store.window_at(start, without=HULLS)
            if not self.settling.ready(window, now_ns):
                return  # a late upload: this window (and the next ones) next round
            one = self.gate.judgeable(window)
            if not one.num_rows:  # nobody to judge yet: not evidence of health either
                self.triangulated_ns = start
                continue
            yield one

    def judged(self, one: pa.Table) -> int:
        """The engine took ``one``; the end of that window."""
        start = one["start_ns"][0].as_py()
        self.triangulated_ns = start
        return start + one["duration_ns"][0].as_py()

    def _backlog_start(self, newest_start_ns: int | None) -> int | None:
        if self.triangulated_ns is None:
            # First round: start at the newest windows, not the whole history, and stay
            # there: a start that slid with the newest window would pass over each window
            # before it settles, round after round.
            if newest_start_ns is None:
                return None
            self.triangulated_ns = newest_start_ns - self.lookback_ns
        return self.triangulated_ns
