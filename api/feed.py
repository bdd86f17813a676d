"""The windows triangulation is handed: each stored window once, oldest first, when settled.

The engine keeps per-flow baselines and hysteresis, so a window seen twice would count its
losses twice, and a skipped one would leave a hole in its evidence. The feed therefore walks
its own backlog in the store (not the clock solve's look-back: a round slower than the
look-back, on a big fleet, must delay windows, never skip them), one window read at a time
without the hulls (clock sync's), and stops at the first window not yet settled
(``settling.py``); what it hands over is what ``clockgate.py`` lets triangulation judge.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from fleetlens.api.clockgate import ClockGate
from fleetlens.api.settling import Settling
from fleetlens.api.store import Store

from fleetlens.records import HULLS


class TriangulationFeed:
    def __init__(self, store: Store, settling: Settling, gate: ClockGate, lookback_ns: int):
        self.store = store
        self.settling = settling
        self.gate = gate
        self.lookback_ns = lookback_ns
        self.triangulated_ns: int | None = None  # start of the newest window the feed is past

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
