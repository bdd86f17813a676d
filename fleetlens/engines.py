"""The engine interfaces the collector's background loops call.

Both engines are stateful callables handed the newest stored windows (an Arrow table in
``WINDOW_SCHEMA``), the fleet topology when an inventory gives one, and their previous output
keyed by host (clocks) or by verdict subject (triangulation). They return their whole current
output; the collector stores and publishes what changed.

- ``fleetlens.sync.HuygensSync`` is a :class:`SolveClocks`: it tracks drift across windows.
- ``fleetlens.triangulate.Triangulator`` is a :class:`Triangulate`: it keeps per-flow baselines
  and hysteresis, so it must see each window once, oldest first.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from fleetlens.records import ClockModel, Verdict
from fleetlens.topology import Topology


class SolveClocks(Protocol):
    """One clock model per host from the windows' hulls of pure probe pairs."""

    def __call__(
        self, windows: pa.Table, topology: Topology | None, prev: dict[str, ClockModel], /
    ) -> list[ClockModel]: ...


class Triangulate(Protocol):
    """Verdicts on links, switches, NICs and hosts from the windows' losses and delays."""

    def __call__(
        self, windows: pa.Table, topology: Topology | None, prev: dict[str, Verdict], /
    ) -> list[Verdict]: ...
