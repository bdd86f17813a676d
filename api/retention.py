"""Retention: roll raw windows up into per-minute rows and drop what is past its keep time.

The pass runs on the writer thread (it deletes and inserts), at most every ``interval_s``, on
the clock loop (it is as little urgent); ``Store.retention_pass`` holds what is kept how long.
"""

from __future__ import annotations

import time

from fleetlens.api.config import Settings
from fleetlens.api.loops import timed
from fleetlens.api.metrics import Metrics
from fleetlens.api.writer import Writer


class Retention:
    def __init__(self, settings: Settings, writer: Writer, metrics: Metrics) -> None:
        self.settings = settings
        self.writer = writer
        self.metrics = metrics
        self._last = 0.0  # monotonic time of the last pass

    def run_if_due(self) -> None:
        if time.monotonic() - self._last >= self.settings.retention_interval_s:
            self._last = time.monotonic()
            self.run(time.time_ns())

    def run(self, now_ns: int) -> dict[str, int] | None:
        """One pass; its counts (rolled, deleted, dropped; new watermark and raw floor), or
        None when it failed (counted under the ``retention`` loop)."""
        s = self.settings
        fut = self.writer.submit_call(
            lambda st: st.retention_pass(
                now_ns, s.raw_retention_ns, s.agg_retention_ns, batch_ids_ns=s.batch_id_retention_ns
            )
        )
        return timed(self.metrics, "retention", fut.result, 600)
