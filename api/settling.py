"""When a stored window may go to triangulation, which judges each window once.

A window is settled when every agent expected to send it has (``arrivals.py``), in a steady
fleet: the round its last upload wakes judges it. Without a window judged before, "expected"
only knows the hosts whose rows are in (a restarted collector, a replay of past windows where
one batch holds two windows), so the window then waits until both its end and its first rows
are ``settle_ns`` ago.

A settled window also waits for every host that sent the previous judged window, up to
``max_wait_ns`` after its end: rows arriving after a window was judged are lost to
triangulation, and an agent that died is waited for only once (the next window no longer
expects it).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from fleetlens.api.arrivals import WindowArrivals

from fleetlens.records import nic_hosts


class Settling:
    def __init__(self, arrivals: WindowArrivals, settle_ns: int, max_wait_ns: int) -> None:
        self.arrivals = arrivals
        self.settle_ns = settle_ns
        self.max_wait_ns = max_wait_ns
        self.last_senders: frozenset[str] = frozenset()  # hosts of the last window judged

    def ready(self, window: pa.Table, now_ns: int) -> bool:
        """``window`` (one generation's rows) may be judged now; when it may, its senders
        become the ones the next window waits for."""
        return self._settled(window, now_ns) and self._all_senders_in(window, now_ns)

    def _settled(self, window: pa.Table, now_ns: int) -> bool:
        start = window["start_ns"][0].as_py()
        if self.last_senders and self.arrivals.complete(start, now_ns):
            return True
        since = start + window["duration_ns"][0].as_py()
        since = max(since, self.arrivals.first_arrival(start) or since)
        return now_ns - since >= self.settle_ns

    def _all_senders_in(self, window: pa.Table, now_ns: int) -> bool:
        senders = frozenset(pc.unique(nic_hosts(pc.unique(window["src_nic"]))).to_pylist())
        end = window["start_ns"][0].as_py() + window["duration_ns"][0].as_py()
        if not self.last_senders <= senders and now_ns - end < self.max_wait_ns:
            return False
        self.last_senders = senders
        return True
