"""The collector: the composition root that wires the collector's jobs, independent of HTTP.

- ``store.py`` / ``writer.py``: the DuckDB file, written by one thread (group commit);
- ``known.py`` and ``checks.py``: which NICs may send, and the checks of a batch against them;
- ``arrivals.py``: which window generations every live agent has uploaded (wakes the loops);
- ``loops.py``: the triangulation and clock loops, each on its own thread, running the rounds
  of ``rounds.py``;
- ``feed.py`` (with ``settling.py`` and ``clockgate.py``): the windows triangulation judges;
- ``publish.py``: the served clocks, verdicts and decisions, stored when they change;
- ``served.py``: what the read API serves from that state and the inventory;
- ``retention.py``: rollups and deletion of old rows, on the clock loop;
- the engines (``fleetlens.engines``): Huygens clock sync, and ``Triangulator`` when an
  inventory gives the topology, else ``fallback.py`` on the paths agents report. Drain
  decisions and a job's impact come from ``fleetlens.triangulate.decisions``.

The HTTP layer (``app.py``, ``queries.py``, ``flows.py``) calls the public methods below and
reads through ``Collector.served``; a test or a replay can drive the rounds itself with an
explicit ``now_ns`` (``start(loops=False)``, ``run_round``).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from fleetlens.api.arrivals import WindowArrivals
from fleetlens.api.checks import check_batch
from fleetlens.api.clockgate import ClockGate
from fleetlens.api.config import Settings
from fleetlens.api.fallback import LossyPathFallback
from fleetlens.api.feed import TriangulationFeed
from fleetlens.api.known import KnownNics
from fleetlens.api.loops import Loops
from fleetlens.api.metrics import Metrics, StateCollector, WriterCounters
from fleetlens.api.publish import Published
from fleetlens.api.retention import Retention
from fleetlens.api.rounds import Rounds
from fleetlens.api.served import Served
from fleetlens.api.settling import Settling
from fleetlens.api.store import Store
from fleetlens.api.writer import Writer
from fleetlens.sync import HuygensSync
from fleetlens.triangulate import TriangulateConfig, Triangulator

from fleetlens.batch import Batch
from fleetlens.engines import SolveClocks, Triangulate
from fleetlens.records import ClockModel, Decision, Verdict
from fleetlens.topology import Topology

log = logging.getLogger("fleetlens.api")

LOOPS = ("triangulate", "clocks")


@dataclass
class Engines:
    """What the background loops run. Clock sync is Huygens (one stateful solver for the
    collector's lifetime: it tracks drift across windows)."""

    solve_clocks: SolveClocks = field(default_factory=HuygensSync)
    triangulate: Triangulate | None = None  # None: Triangulator, or the fallback without one


@dataclass(frozen=True)
class WriterHealth:
    alive: bool
    queue_depth: int
    lag_s: float


class Collector:
    rounds: Rounds  # built last in __init__: the writer's commit hook and a gauge call it

    def __init__(self, settings: Settings, engines: Engines | None = None) -> None:
        s = self.settings = settings
        self.engines = engines or Engines()
        self.topology = Topology.load(s.inventory) if s.inventory else None
        self.store = self._open_store()
        # The writer's commit hook and the metrics' verdict-age gauge are the rounds', which
        # need the writer and the metrics: they look the rounds up when called.
        self.writer = Writer(
            self.store, s.queue_max_batches, s.queue_max_rows,
            lambda *a: self.rounds.committed(*a),
        )  # fmt: skip
        self.published = Published(self._save)
        self.metrics = self._metrics()
        self.known = KnownNics(self.topology)
        self.arrivals = WindowArrivals(s.solve_max_wait_ns, s.agent_starting_ns)
        self.clock_gate = ClockGate()
        settling = Settling(self.arrivals, s.triangulate_settle_ns, s.triangulate_max_wait_ns)
        self.feed = TriangulationFeed(self.store, settling, self.clock_gate, s.loop_lookback_ns)
        self.loops = Loops(LOOPS, s.loop_interval_s, self.metrics)
        self.retention = Retention(s, self.writer, self.metrics)
        # Without an inventory the fallback judges the look-back the clocks are solved on.
        fallback = self.engines.triangulate is None and self.topology is None
        self.rounds = Rounds(
            topology=self.topology, solve_clocks=self.engines.solve_clocks,
            triangulate=self._triangulation_engine(), fallback=fallback,
            lookback_ns=s.loop_lookback_ns, store=self.store, known=self.known,
            arrivals=self.arrivals, feed=self.feed, clock_gate=self.clock_gate,
            published=self.published, metrics=self.metrics, wake=self.loops.wake,
        )  # fmt: skip
        self.served = Served(
            s, self.topology, self.store, self.known, self.published, self.clock_gate,
            lambda: self.rounds.newest_start_ns,
        )  # fmt: skip
        self._load()

    def _open_store(self) -> Store:
        """The DuckDB store (the fleet tier's keeps its windows elsewhere: ``fleetstore.py``)."""
        s = self.settings
        return Store(s.db_path, s.duckdb_threads, s.duckdb_memory_limit)

    def _triangulation_engine(self) -> Triangulate:
        if self.engines.triangulate is not None:
            return self.engines.triangulate
        if self.topology is None:
            return LossyPathFallback(self.settings.lossy_flow_threshold)
        cfg = TriangulateConfig(background_loss=self.settings.background_loss)
        return Triangulator(self.topology, cfg)

    def _metrics(self) -> Metrics:
        w = self.writer
        m = Metrics(w.depth, w.queued_rows, w.lag_s, lambda: self.rounds.judged_age_s(),
                    self.topology, self.settings.per_nic_metrics)  # fmt: skip
        m.add_collector(WriterCounters(lambda: w.busy_cpu_s, lambda: w.rows_written))
        m.add_state(
            StateCollector(
                lambda: list(self.published.verdicts.values()),
                lambda: list(self.published.clocks.values()),
                self.settings.top_k_links,
            )
        )
        return m

    def _load(self) -> None:
        self.refresh_known_nics()
        self.published.load(self.store)
        # synced models stored before a restart: their agents already run with them
        self.clock_gate.trust({h: 0 for h, c in self.published.clocks.items() if c.synced})

    def _save(
        self, clocks: list[ClockModel], verdicts: list[Verdict], decided: list[Decision], now: int
    ) -> Future:
        """One stage's outputs in one writer transaction; the future is done once stored."""
        return self.writer.submit_call(
            lambda st: st.save_loop_outputs(clocks, verdicts, decided, now)
        )

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self, loops: bool = True) -> None:
        """The writer, and (``loops``) the background loops."""
        self.writer.start()
        self.log_unidentifiable()
        if loops:
            triangulate = self.rounds.triangulation_round
            self.loops.start(
                {"triangulate": triangulate, "clocks": self._clocks_and_retention},
                due={"clocks": self.arrivals.next_timeout},
            )

    def stop(self) -> None:
        self.loops.stop()
        self.writer.stop()
        self.store.close()

    def log_unidentifiable(self) -> None:
        """Say which links the probe plan cannot tell apart (a fault on one is reported on
        its whole group)."""
        if self.topology is None:
            return
        groups = self.served.unidentifiable()
        if groups is None:
            log.info("probe plan: too big to enumerate its ambiguity groups")
        elif not groups:
            log.info("probe plan: every link identifiable")
        else:
            listed = "; ".join(" = ".join(g) for g in groups)
            # a warning: at the default level the operator sees which faults cannot be pinned
            log.warning("probe plan: %d links unidentifiable, in %d groups (reported together): %s",
                     sum(map(len, groups)), len(groups), listed)  # fmt: skip

    def health(self) -> WriterHealth:
        w = self.writer
        return WriterHealth(w.alive(), w.depth(), w.lag_s())

    def run_round(self, now_ns: int) -> None:
        """Both loops' rounds, one after the other (what tests and replays drive), their
        outputs stored when it returns."""
        self.rounds.run(now_ns)
        self.published.flush()

    def run_retention(self, now_ns: int) -> dict[str, int] | None:
        return self.retention.run(now_ns)

    def _clocks_and_retention(self, now_ns: int) -> None:
        self.rounds.clock_round(now_ns)
        self.retention.run_if_due()

    # ---- known NICs and hosts ------------------------------------------------------------
    def refresh_known_nics(self) -> None:
        self.known.refresh(self.store.registered_nics())

    def known_nics(self) -> pa.Array:
        return self.known.nics()

    def nic_known(self, nic: str) -> bool:
        return nic in self.known

    def known_hosts(self) -> list[str]:
        return self.known.hosts()

    def register(self, host: str, nics: list[dict[str, str]], meta: dict[str, Any]) -> None:
        """Store an agent's registration (blocks while the writer queue is full), then know
        its NICs and wait for its first window."""
        self.writer.submit_call(lambda st: st.register_host(host, nics, meta)).result()
        self.refresh_known_nics()
        self.arrivals.registered(host, time.time_ns())
        self.metrics.registrations.inc()

    # ---- ingest --------------------------------------------------------------------------
    def check_context(self, batch: Batch, now_ns: int) -> None:
        """The checks that need collector state; raises BatchError naming the field."""
        check_batch(batch, self.known.nic_set(), now_ns, self.settings.max_future_ns)

    def submit(self, batch: Batch) -> Future[bool]:
        """Queue a checked batch; the future says whether it was new (False: a retry). Raises
        ``writer.Backpressure`` when the queue is full."""
        return self.writer.submit_batch(batch)

    def save_job(self, name: str, hosts: list[str], now_ns: int) -> Future[None]:
        return self.writer.submit_call(lambda st: st.save_job(name, hosts, now_ns))
