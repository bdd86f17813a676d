"""The collector: the composition root that wires the collector's jobs, independent of HTTP.

- ``store.py`` / ``writer.py``: the DuckDB file, written by one thread (group commit);
- ``known.py`` and ``checks.py``: which NICs may send, and the checks of a batch against them;
- ``arrivals.py``: which window generations every live agent has uploaded (wakes the loops);
- ``loops.py``: the triangulation and clock loops, each on its own thread;
- ``feed.py`` (with ``settling.py`` and ``clockgate.py``): the windows triangulation judges;
- ``publish.py``: the served clocks, verdicts and decisions, stored when they change;
- ``retention.py``: rollups and deletion of old rows;
- the engines (``fleetlens.engines``): Huygens clock sync, and ``Triangulator`` when an
  inventory gives the topology, else ``fallback.py`` on the paths agents report. Drain
  decisions and a job's impact come from ``fleetlens.triangulate.decisions``.

The HTTP layer (``app.py``) and tests call the public methods below; a test or a replay can
drive the rounds itself with an explicit ``now_ns`` (``start(loops=False)``, ``run_round``).
"""

from __future__ import annotations

import math
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from fleetlens.api.arrivals import WindowArrivals
from fleetlens.api.checks import check_batch
from fleetlens.api.clockgate import ClockGate
from fleetlens.api.config import Settings
from fleetlens.api.fallback import LossyPathFallback
from fleetlens.api.feed import TriangulationFeed
from fleetlens.api.known import KnownNics
from fleetlens.api.loops import Loops, timed
from fleetlens.api.metrics import Metrics, StateCollector, WriterCounters
from fleetlens.api.publish import Published
from fleetlens.api.retention import Retention
from fleetlens.api.settling import Settling
from fleetlens.api.store import Store
from fleetlens.api.writer import Writer
from fleetlens.sync import HuygensSync
from fleetlens.triangulate import (
    JobImpact,
    TriangulateConfig,
    Triangulator,
    decisions,
    decisions_by_nic,
    job_impact,
)

from fleetlens.batch import Batch
from fleetlens.engines import SolveClocks, Triangulate
from fleetlens.ids import split_nic_id
from fleetlens.plan import host_plan
from fleetlens.records import WINDOW_SCHEMA, ClockModel, Decision, HostPlan, Verdict
from fleetlens.topology import Topology

LOOPS = ("triangulate", "clocks")
JOB_PATHS_NS = 300_000_000_000  # a job's observed paths: those of the last 5 minutes


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
    def __init__(self, settings: Settings, engines: Engines | None = None) -> None:
        s = self.settings = settings
        self.engines = engines or Engines()
        self.topology = Topology.load(s.inventory) if s.inventory else None
        # Without an inventory the fallback judges the look-back the clocks are solved on.
        self.fallback = self.engines.triangulate is None and self.topology is None
        self.triangulate = self._triangulation_engine()
        self.store = Store(s.db_path, s.duckdb_threads, s.duckdb_memory_limit)
        self.writer = Writer(self.store, s.queue_max_batches, s.queue_max_rows, self._on_commit)
        self.published = Published(self._save)
        self.metrics = self._metrics()
        self.known = KnownNics(self.topology)
        self.arrivals = WindowArrivals(s.solve_max_wait_ns, s.agent_starting_ns)
        self.clock_gate = ClockGate()
        settling = Settling(self.arrivals, s.triangulate_settle_ns, s.triangulate_max_wait_ns)
        self.feed = TriangulationFeed(self.store, settling, self.clock_gate, s.loop_lookback_ns)
        self.loops = Loops(LOOPS, s.loop_interval_s, self.metrics)
        self.retention = Retention(s, self.writer, self.metrics)
        self.newest_start_ns: int | None = None  # newest window start stored
        self.judged_end_ns: int | None = None  # end of the newest window whose verdicts are out
        self._load()

    def _triangulation_engine(self) -> Triangulate:
        if self.engines.triangulate is not None:
            return self.engines.triangulate
        if self.topology is None:
            return LossyPathFallback(self.settings.lossy_flow_threshold)
        cfg = TriangulateConfig(background_loss=self.settings.background_loss)
        return Triangulator(self.topology, cfg)

    def _metrics(self) -> Metrics:
        w = self.writer
        m = Metrics(w.depth, w.queued_rows, w.lag_s, self._judged_age_s)
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
        self.newest_start_ns = self.store.newest_window_start()
        self.published.load(self.store)
        # synced models stored before a restart: their agents already run with them
        self.clock_gate.trust({h: 0 for h, c in self.published.clocks.items() if c.synced})

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self, loops: bool = True) -> None:
        """The writer, and (``loops``) the background loops."""
        self.writer.start()
        if loops:
            clocks = self._clocks_and_retention
            self.loops.start({"triangulate": self.triangulation_round, "clocks": clocks})

    def stop(self) -> None:
        self.loops.stop()
        self.writer.stop()
        self.store.close()

    def health(self) -> WriterHealth:
        w = self.writer
        return WriterHealth(w.alive(), w.depth(), w.lag_s())

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

    def _on_commit(self, batch: Batch, stored: bool, seconds: float) -> None:
        m = self.metrics
        m.commit_seconds.observe(seconds)
        if not stored:
            m.batches.labels("duplicate").inc()
            return
        m.batches.labels("stored").inc()
        m.windows.inc(batch.rows)
        if batch.rows:
            newest = pc.max(batch.windows["start_ns"]).as_py()
            self.newest_start_ns = max(self.newest_start_ns or newest, newest)
            m.owd.observe(batch.windows)
            starts = pc.unique(batch.windows["start_ns"]).to_pylist()
            dur = batch.windows["duration_ns"][0].as_py() or 1_000_000_000
            if self.arrivals.stored(batch.host_id, starts, dur, time.time_ns()):
                self.loops.wake()

    # ---- rounds --------------------------------------------------------------------------
    def run_round(self, now_ns: int) -> None:
        """Both loops' rounds, one after the other (what tests and replays drive)."""
        self.triangulation_round(now_ns)
        self.clock_round(now_ns)

    def newest_windows(self, now_ns: int | None = None) -> pa.Table:
        """The look-back up to the newest window generation every live agent has uploaded."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        hi = self.arrivals.solve_upto(now_ns, self.newest_start_ns)
        if hi is None:
            return WINDOW_SCHEMA.empty_table()
        # Paths are triangulation's, which reads its own windows (the fallback excepted).
        skip = () if self.fallback else ("path",)
        return self.store.windows_between(hi - self.settings.loop_lookback_ns, hi, skip)

    def triangulation_round(self, now_ns: int) -> None:
        """The settled windows triangulated, their verdicts and drain decisions stored in one
        transaction and published; a failing clock solve holds none of them back."""
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
        solve = self.engines.solve_clocks
        clocks = timed(self.metrics, "clocks", solve, windows, self.topology, prev)
        if clocks is not None:
            self.clock_gate.note_models(clocks, now_ns)
            self.published.clocks_round(clocks, now_ns)

    def run_retention(self, now_ns: int) -> dict[str, int] | None:
        return self.retention.run(now_ns)

    def _clocks_and_retention(self, now_ns: int) -> None:
        self.clock_round(now_ns)
        self.retention.run_if_due()

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

    def _save(
        self, clocks: list[ClockModel], verdicts: list[Verdict], decided: list[Decision], now: int
    ) -> None:
        """One stage's outputs in one writer transaction; waits until it is stored."""
        save = self.writer.submit_call(
            lambda st: st.save_loop_outputs(clocks, verdicts, decided, now)
        )
        save.result(timeout=60)

    def _judged_age_s(self) -> float:
        end = self.judged_end_ns
        return math.nan if end is None else (time.time_ns() - end) / 1e9

    # ---- what the loops' outputs mean ----------------------------------------------------
    def decide(self, verdicts: list[Verdict], now_ns: int) -> list[Decision]:
        """Per host, the NICs to drain given these verdicts."""
        if self.topology is not None:
            return decisions(verdicts, self.topology, now_ns)
        return decisions_by_nic(verdicts, self.known_nics().to_pylist(), now_ns)

    def decision(self, host: str) -> Decision:
        """The host's current decision (nothing to drain when none was made yet)."""
        return self.published.decisions.get(host) or Decision(host, time.time_ns(), [])

    def job_impact(self, name: str) -> JobImpact | None:
        """What the job's traffic crosses and which of it is bad (None: no such job)."""
        hosts = self.store.job_hosts(name)
        if hosts is None:
            return None
        nics = [n for n in self.known_nics().to_pylist() if split_nic_id(n)[0] in set(hosts)]
        observed: set[str] = set()
        if nics and self.newest_start_ns is not None:
            observed = self.store.links_on_paths(nics, self.newest_start_ns - JOB_PATHS_NS)
        verdicts = list(self.published.verdicts.values())
        return job_impact(verdicts, self.topology, hosts, nics=nics, observed=observed)

    def plan(self, host: str) -> HostPlan:
        """The host's probe plan with its current clock model (needs the topology)."""
        if self.topology is None:
            raise LookupError("no inventory loaded")
        s, clock = self.settings, self.published.clocks.get(host)
        return host_plan(self.topology, host, s.plan_peers, s.plan_seed, clock)
