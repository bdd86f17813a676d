"""Recorded windows replayed through a solver the way the collector's loop feeds it: one call
per window generation, each with the generations of the trailing look-back, and the models
of the last call passed back in. A change to ``sync/`` is then measured in seconds on a
recorded lab run (``bench/sync_replay.py``, ``tests/sync/test_sync_recorded.py``) instead of
a minutes-long run of agents."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pyarrow as pa

from fleetlens.records import ClockModel
from fleetlens.topology import Topology

from .solver import HuygensSync

# (lo, hi) start_ns bounds, both inclusive -> the windows that started within them
ReadWindows = Callable[[int, int], pa.Table]


def replay(
    read: ReadWindows,
    generations: list[int],
    sync: HuygensSync,
    topology: Topology | None,
    lookback_ns: int,
) -> Iterator[dict[str, ClockModel]]:
    """The models by host after each generation's solve, in order."""
    prev: dict[str, ClockModel] = {}
    for g in generations:
        prev = {m.host_id: m for m in sync(read(g - lookback_ns, g), topology, prev)}
        yield prev
