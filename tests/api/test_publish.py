"""Clock models are served as soon as solved, not after the writer stored them: a busy writer
(commit groups of ingest ahead) must not age the model agents map their timestamps with. They
are stored behind, and ``run_round`` returns once they are (real DuckDB file, real writer)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from fleetlens.api.config import Settings
from fleetlens.api.service import Collector, Engines

from fleetlens.records import ClockModel
from fleetlens.topology import leaf_spine

MODEL = ClockModel("h00", 1_700_000_000_000_000_000, 12.5, 3.0, 40.0, True)


def _stored(c: Collector) -> list[ClockModel]:
    return [m for m, _ in c.store.latest_clocks()]


def test_a_model_is_served_while_the_writer_is_busy_and_stored_after(tmp_path: Path) -> None:
    topo = leaf_spine(hosts=3, nics=1, leaves=1, spines=1)
    inv = tmp_path / "fleet.json"
    topo.save(inv)
    settings = Settings(db_path=tmp_path / "fl.duckdb", inventory=str(inv), loop_interval_s=3600)
    c = Collector(settings, Engines(solve_clocks=lambda windows, topo, prev: [MODEL]))
    c.start(loops=False)
    release = threading.Event()
    try:
        held = c.writer.submit_call(lambda store: release.wait(60))
        c.rounds.clock_round(time.time_ns())
        assert c.published.clocks == {"h00": MODEL}  # served at once
        assert _stored(c) == []  # its store waits behind the held writer
        release.set()
        held.result(timeout=60)
        c.published.flush()
        assert _stored(c) == [MODEL]
        c.run_round(time.time_ns())  # the same model again: nothing new to store
        assert _stored(c) == [MODEL]
    finally:
        release.set()
        c.stop()
