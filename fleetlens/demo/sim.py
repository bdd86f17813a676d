"""``fleetlens demo --sim``: the demo's story on the fabric simulator, at fleet scale, no root.

The same story as on the lab (:mod:`fleetlens.demo.story`), with the simulator's agents in
place of real ones and its exact truth to judge against:

- A real collector (``fleetlens collector``: uvicorn on 127.0.0.1, a DuckDB file in a
  temporary directory) has the simulated fabric as its inventory, so the real Huygens sync and
  the real triangulation engine run. Default fabric: the reference leaf–spine, 1024 hosts,
  32 leaves, 8 spines, 16 peers per NIC, one NIC per host.
- The simulated agents' windows stream into it over HTTP, window by window, with clock offsets
  (±50 ms) and drifts (±100 ppm, wandering) injected per host. The agents apply the clock
  models the collector serves (``/v1/clocks``) from the first window they start after it, as
  real agents do: the loop is closed through the REST API. The simulator runs one window
  ahead (:class:`_SimAhead`), so that is the window after next. Every solved host's model
  is scored against the simulator's truth (p50/p99/max), judged at the window before the
  fault starts.
- The loss fault on a leaf–spine link is scheduled in the simulator (a fault spec with
  ``start_s``/``end_s``): the story's fault and heal steps begin at those simulated seconds and
  run to their end, recording when the collector first names the link and when every verdict
  is healthy again. Times are counted in simulated windows of probes.

Time: the run lies in the recent past (like ``fleetlens sim --fast``), so the collector never
sees a window "from the future" and judges each one as soon as a round finds it stored. Each
window is posted right after a collector round ends, within the round period
(:func:`quiet_interval`), and the next window waits until the served clock models show that a
round has solved and triangulated it: a collector slower than real time delays the story, it
never drops or half-judges a window (a posting that overlapped a round is reported). Simulated
and wall time are therefore decoupled: every "..._s" figure of the story is simulated seconds
(windows of probes), the wall time is reported separately.

The simulated agents align window starts and withhold unsynced one-way delays as described in
:mod:`fleetlens.demo.sim_agents`. LinkPass moves real bytes over real NIC sockets: there is
nothing for it to run on here, and the summary says so instead of pretending.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
from rich.console import Console

from fleetlens.client import CollectorError
from fleetlens.demo.collector import DemoCollector, SimDemoError
from fleetlens.demo.fabric import Evidence, Pacing, Reading, Step, StepRule, percentile
from fleetlens.demo.sim_agents import WINDOW_NS, clock_errors, withhold_unsynced_owd
from fleetlens.demo.story import Story
from fleetlens.demo.summary import ClockRow, Summary, render
from fleetlens.fixtures.sim import SimConfig, Simulator, SimWindow
from fleetlens.fixtures.sim.stream import CollectorStream
from fleetlens.records import ClockModel
from fleetlens.topology import Topology, leaf_spine

SYNC_BOUND_NS = 100.0  # the clock-sync issue's simulator bound (software timestamps), p99
LINKPASS = "not applicable in --sim (no sockets: LinkPass moves real bytes over real NICs)"
WORST_SHOWN = 10  # hosts listed in the clock table (and the summary's "clocks")
_RUNS = "fleetlens_loop_runs_total:"
# HTTP ingest of simulated windows on a busy 2-core machine (docs/notes/demo.md).
POST_ROWS_PER_S = 40_000.0


@dataclass(frozen=True)
class SimDemoConfig:
    hosts: int = 1024
    nics: int = 1  # 1024 x 1 NIC is already 0.7 M window rows per simulated second
    leaves: int | None = None  # None: 32 at >= 1024 hosts, else hosts // 8
    spines: int | None = None  # None: 8 at >= 1024 hosts, else leaves // 2
    peers: int = 16
    seed: int = 0
    fault_link: str | None = None  # None: a leaf->spine link drawn with the seed
    fault_loss_pct: float = 5.0
    fault_at_s: int = 5  # simulated second the fault starts (a window boundary)
    heal_at_s: int = 8
    max_seconds: int = 20  # give up waiting for the verdict to clear after this
    symmetric: bool = True  # symmetric fixed path delays, as the sync bound presupposes
    loop_interval_s: float | None = None  # the collector's loop period; None: from the size
    window_timeout_s: float = 600.0  # one window's processing by the collector
    work_parent: Path | None = None  # where the temporary directory goes (default: $TMPDIR)

    def fabric(self) -> tuple[int, int]:
        leaves = self.leaves or (32 if self.hosts >= 1024 else max(2, self.hosts // 8))
        spines = self.spines or (8 if self.hosts >= 1024 else max(2, leaves // 2))
        return leaves, spines

    def check(self) -> None:
        if not 1 <= self.fault_at_s < self.heal_at_s < self.max_seconds:
            raise ValueError("need 1 <= fault_at_s < heal_at_s < max_seconds (whole seconds)")
        if not 0 < self.fault_loss_pct <= 100:
            raise ValueError("fault_loss_pct must be in (0, 100]")


@dataclass
class WindowRow:
    window: int
    rows: int
    sync_p99_ns: float | None  # over the hosts with a solved model
    synced: int  # flagged synced by the collector this window
    solved: int  # hosts with a model from a solve (coasting ones included)
    faulty: list[str]
    wall_s: float  # simulate + post + wait for the collector
    sim_s: float = 0.0  # of which simulating the window (the agents' side included)
    post_s: float = 0.0  # posting it
    wait_s: float = 0.0  # waiting for a collector round to solve and judge it


@dataclass(kw_only=True)
class SimSummary(Summary):
    fabric: str
    mode: str = "sim"
    time_base: str = "simulated seconds (one window = 1 s of probes)"
    hosts: int = 0
    nics: int = 0
    sync_p50_ns: float | None = None
    sync_max_ns: float | None = None
    sync_p99_run_ns: float | None = None  # over every (host, window) once converged
    sync_p99_worst_window_ns: float | None = None  # the worst window's p99 once converged
    hosts_synced: int = 0  # hosts with a solved model, all scored
    hosts_flagged_synced: int = 0  # of which the collector flagged synced in that window
    owd_withheld_rows: int = 0  # rows sent without one-way delays: an endpoint never synced
    overlapped_windows: list[int] = field(default_factory=list)  # posted during a round
    loop_interval_s: float = 0.0
    faulty_nics: list[str] = field(default_factory=list)
    other_alarms: list[str] = field(default_factory=list)  # anything else faulty, any window
    linkpass: str = LINKPASS
    wall_s: dict[str, float] = field(default_factory=dict)
    timeline: list[WindowRow] = field(default_factory=list)
    workdir: str | None = None  # kept only with keep
    collector_pid: int | None = None  # kept only with keep

    title = "FleetLens demo --sim (times are simulated seconds)"
    error_digits = 1

    @property
    def clock_title(self) -> str:
        return f"clock error vs simulator truth: worst {len(self.clocks)} of {self.hosts} hosts"

    @property
    def checks(self) -> dict[str, bool]:
        return {
            "clocks synced": self.sync_p99_ns is not None
            and self.sync_p99_ns <= SYNC_BOUND_NS
            and self.hosts_synced == self.hosts,  # every host solved and scored
            "fault localized, nothing else": self.localized_s is not None
            and self.faulty_links == [self.fault.get("link")]
            and not self.faulty_nics
            and not self.other_alarms,
            "verdict cleared": self.localized_s is not None and self.cleared_s is not None,
        }

    def rows(self) -> list[tuple[str, str]]:
        w, f = self.wall_s, self.fault
        return [
            ("fabric", f"{self.fabric} ({self.nics} NICs)"),
            ("clock error p50 / p99 / max",
             f"{self.sync_p50_ns} / {self.sync_p99_ns} / {self.sync_max_ns} ns "
             f"(bound p99 {SYNC_BOUND_NS:.0f} ns; {self.hosts_synced}/{self.hosts} hosts solved, "
             f"{self.hosts_flagged_synced} flagged synced in that window)"),
            ("clock error since converged",
             f"p99 {self.sync_p99_run_ns} ns over every host and window; worst window p99 "
             f"{self.sync_p99_worst_window_ns} ns"),
            ("clock sync converged", f"after {self.sync_converged_s} s"),
            ("fault",
             f"{f.get('kind')} {f.get('value')}% on {f.get('link')} at {f.get('at_s')} s"),
            ("time to localize", f"{self.localized_s} s of probes"),
            ("faulty links reported", ", ".join(self.faulty_links + self.faulty_nics) or "none"),
            ("verdict cleared", f"{self.cleared_s} s after heal"),
            ("LinkPass", self.linkpass),
            ("wall time",
             f"{w.get('total')} s ({w.get('windows')} windows, {w.get('per_window_mean')} s "
             f"each: simulate {w.get('sim_per_window')}, post {w.get('post_per_window')}, "
             f"collector {w.get('wait_per_window')}; triangulation "
             f"{w.get('triangulate_per_round')} s per window)"),
        ]  # fmt: skip


class SimFabric:
    """:class:`~fleetlens.demo.fabric.DemoFabric` on the simulator: a reading is the next
    simulated window, posted, processed by the collector and judged against the truth."""

    def __init__(self, cfg: SimDemoConfig, console: Console, quiet: bool) -> None:
        cfg.check()
        self.cfg = cfg
        self.say = (lambda *_, **__: None) if quiet else console.print
        self.pacing = Pacing(SYNC_BOUND_NS, clear_all=True)
        leaves, spines = cfg.fabric()
        self.topo: Topology = leaf_spine(cfg.hosts, cfg.nics, leaves, spines)
        self.spec = f"leafspine:hosts={cfg.hosts},nics={cfg.nics},leaves={leaves},spines={spines}"
        self.link = cfg.fault_link or _pick_fabric_link(self.topo, cfg.seed)
        if self.link not in self.topo.link_by_id:
            raise ValueError(f"fault link {self.link!r} is not in {self.spec}")
        self.work: Path | None = None
        self.collector: DemoCollector | None = None
        self.stream: CollectorStream | None = None
        self.windows: _SimAhead | None = None
        self.on_window: Callable[[int, SimFabric], None] | None = None  # tests: inject failures
        self.t_s = 0  # simulated seconds judged so far
        self.ready: set[str] = set()  # hosts whose agent has been served a synced model
        self.injected: pa.Table | None = None  # the first window's clock truth
        self.flagged_before_fault = 0

    # ---- start --------------------------------------------------------------------------
    def start(self) -> SimSummary:
        c = self.cfg
        self.t_start = time.monotonic()
        self.say(f"[bold]simulated fabric[/]: {self.spec}, {c.peers} peers per NIC")
        self.sim, self.epoch = self._simulator()
        self.work = Path(tempfile.mkdtemp(prefix="fleetlens-demo-sim-", dir=c.work_parent))
        self.topo.save(self.work / "topology.json")
        interval = c.loop_interval_s or quiet_interval(self.sim.n_flows)
        self.collector = DemoCollector(self.work, self.work / "topology.json", interval)
        s = SimSummary(fabric=self.spec, collector=self.collector.url,
                       hosts=len(self.topo.hosts), nics=len(self.topo.nics),
                       loop_interval_s=interval)  # fmt: skip
        self.s = s
        s.wall_s["setup"] = round(time.monotonic() - self.t_start, 1)
        self.say(f"[bold]collector[/] {self.collector.url} (DuckDB in {self.work})")
        if c.symmetric:
            s.notes.append("fixed path delays made symmetric per link (what the sync bound "
                           "presupposes; symmetric=False shows the raw fabric)")  # fmt: skip
        self._register(s)
        self.windows = _SimAhead(self.sim, c.max_seconds)
        self.counts = self.collector.metrics("starting")
        self.t_window = time.monotonic()
        return s

    def _simulator(self) -> tuple[Simulator, int]:
        c = self.cfg
        # The whole run in the recent past: never "from the future", and every window is
        # settled for triangulation as soon as it is stored (whole seconds: window bounds).
        epoch = (time.time_ns() // WINDOW_NS - c.max_seconds - 30) * WINDOW_NS
        fault = f"{self.link}:loss={c.fault_loss_pct / 100:g}:start_s={c.fault_at_s}"
        # paths_known: real agents report each flow's path (Paris traceroute); without it a
        # loss on one of a leaf's uplinks cannot be told from its sibling uplinks by loss alone.
        cfg = SimConfig(
            peers=c.peers, clock="models", epoch_ns=epoch, paths_known=True,
            symmetric_paths=c.symmetric,
            faults=(f"{fault},end_s={c.heal_at_s}",),
        )  # fmt: skip
        sim = Simulator(self.topo, cfg, seed=c.seed)
        self.say(
            f"  plan: {len(self.topo.nics)} NICs, {sim.pair_src.size:,} peer pairs, "
            f"{sim.n_flows:,} flows (window rows per second); clocks ±50 ms, ±100 ppm"
        )
        return sim, epoch

    def _register(self, s: SimSummary) -> None:
        assert self.collector is not None
        self.stream = CollectorStream(self.collector.url, None, workers=8)
        t0 = time.monotonic()
        try:
            self.stream.register(self.sim.topo, self.sim.cfg.ts_source)
        except (CollectorError, OSError) as e:
            self.collector.check_alive("registering the hosts")
            raise SimDemoError(f"registering the hosts failed: {e}") from e
        s.wall_s["register"] = round(time.monotonic() - t0, 1)
        c = self.cfg
        self.say(f"[bold]streaming windows[/]; fault {self.link} loss {c.fault_loss_pct:g}% "
                 f"from {c.fault_at_s} s to {c.heal_at_s} s (simulated)")  # fmt: skip

    # ---- the story's steps ----------------------------------------------------------------
    def now_s(self) -> float:
        return float(self.t_s)

    def rule(self, step: Step, start_s: float) -> StepRule:
        c = self.cfg
        return {
            "sync": StepRule(c.fault_at_s),  # converged any time before the fault
            "baseline": StepRule(c.fault_at_s, on_event=False),
            "fault": StepRule(c.heal_at_s, on_event=False),
            "heal": StepRule(c.max_seconds),
        }[step]

    def inject_fault(self) -> dict[str, object]:
        """The simulator starts the fault at this simulated second (scheduled at start)."""
        c = self.cfg
        assert self.t_s == c.fault_at_s
        return {"link": self.link, "kind": "loss", "value": c.fault_loss_pct,
                "at_s": c.fault_at_s, "healed_at_s": c.heal_at_s}  # fmt: skip

    def heal(self) -> None:
        """The simulator ends the fault at this simulated second (scheduled at start)."""
        assert self.t_s == self.cfg.heal_at_s

    def observe(self) -> Reading:
        assert self.collector is not None and self.stream is not None and self.windows
        t0 = time.monotonic()
        ahead = self.windows.take()
        if ahead is None:
            raise SimDemoError(f"no simulated window after {self.t_s} s")
        win, synced = ahead
        t1 = time.monotonic()
        self._post(win, synced)
        t2 = time.monotonic()
        models = self._wait_processed(win.index)
        t3 = time.monotonic()
        split = (t1 - t0, t2 - t1, t3 - t2)
        r = self._judge(win, models, round(time.monotonic() - self.t_window, 2), split)
        self.t_window = time.monotonic()
        if self.on_window is not None:
            self.on_window(win.index, self)
        return r

    def _post(self, win: SimWindow, synced: frozenset[str]) -> None:
        """Post ``win``, simulated with the models of the hosts in ``synced`` applied."""
        assert self.collector is not None and self.stream is not None
        # One chunk: the stream splits a window into per-host batches (take per host), which
        # on hundreds of chunks costs an order of magnitude more CPU (docs/notes/demo.md).
        win = replace(win, windows=win.windows.combine_chunks())
        win, withheld = withhold_unsynced_owd(win, synced)
        self.s.owd_withheld_rows += withheld
        rounds = self.collector.metrics("posting").get(_RUNS + "clocks", 0)
        try:
            self.stream.send_window(win, self.cfg.seed)
        except (CollectorError, OSError) as e:
            self.collector.check_alive(f"posting window {win.index}")
            raise SimDemoError(f"posting window {win.index} failed: {e}") from e
        # Window 0 is nobody's judged window (the collector skips each host's first one).
        if win.index and self.collector.metrics("posting").get(_RUNS + "clocks", 0) != rounds:
            self.s.overlapped_windows.append(win.index)
        if self.stream.stats.rejected:
            raise SimDemoError(
                f"collector refused window {win.index}: {self.stream.stats.rejected[:3]}"
            )
        if self.injected is None:
            self.injected = win.truth_clocks

    def _wait_processed(self, w: int) -> dict[str, ClockModel]:
        """Until a collector round has solved the clocks of window ``w`` and triangulated it
        (both steps of the same round, after the window was stored); the served models.

        The served models change at the end of a round, and every model of a solve has the
        reference time of the window solved: a model on window ``w`` means that round is over.
        """
        assert self.collector is not None
        doing = f"processing window {w}"
        deadline = time.monotonic() + self.cfg.window_timeout_s
        gen = self.epoch // WINDOW_NS + w
        while time.monotonic() < deadline:
            self._metrics(doing, w)  # a failed loop is an error, not a wait
            models = self.collector.clocks(doing)
            refs = [(m.t0_ns - round(m.offset_ns)) // WINDOW_NS for m in models.values()]
            if refs and max(refs) >= gen:
                return models
            # Polling /v1/clocks (a page per 1000 hosts) takes CPU from the collector's round.
            time.sleep(min(1.0, max(0.1, self.s.loop_interval_s / 20)))
        raise SimDemoError(
            f"collector did not process window {w} within "
            f"{self.cfg.window_timeout_s:.0f} s{self.collector.log_tail()}"
        )

    def _metrics(self, doing: str, w: int) -> dict[str, float]:
        assert self.collector is not None
        m = self.collector.metrics(doing)
        for loop in ("clocks", "triangulate"):
            key = f"fleetlens_loop_errors_total:{loop}"
            if m.get(key, 0) > self.counts.get(key, 0):
                raise SimDemoError(f"the collector's {loop} loop failed on window {w}"
                                   f"{self.collector.log_tail()}")  # fmt: skip
        return m

    def _judge(
        self,
        win: SimWindow,
        models: dict[str, ClockModel],
        wall: float,
        split: tuple[float, float, float],
    ) -> Reading:
        """The collector's view after window ``win``: the agents' next window uses its models.
        ``split``: wall seconds simulating, posting and waiting for the collector."""
        assert self.collector is not None
        doing = f"reading window {win.index}'s results"
        assert self.windows is not None
        self.windows.use_models(models)
        self.ready |= {h for h, m in models.items() if m.synced}
        hosts = win.truth_clocks["host_id"].to_pylist()
        flagged = np.array([bool(models.get(h) and models[h].synced) for h in hosts])
        err = clock_errors(models, win.truth_clocks, self.ready)
        links, nics = self.collector.faulty(doing)
        self.t_s = win.index + 1  # simulated seconds of probes judged so far
        r = Reading(float(self.t_s), hosts, err, flagged, bool(np.isfinite(err).all()), links,
                    nics)  # fmt: skip
        row = WindowRow(win.index, win.windows.num_rows, r.p99_ns, int(flagged.sum()),
                        r.abs_errors.size, links + nics, wall,
                        *(round(x, 2) for x in split))  # fmt: skip
        self.s.timeline.append(row)
        self._progress(row)
        return r

    def _progress(self, r: WindowRow) -> None:
        bad = ", ".join(r.faulty[:3]) + (" …" if len(r.faulty) > 3 else "") or "none"
        p99 = "—" if r.sync_p99_ns is None else f"{r.sync_p99_ns:.0f}"
        self.say(
            f"  {r.window + 1:>3} s: {r.rows:,} rows, clock p99 {p99} ns "
            f"({r.synced}/{len(self.sim.topo.hosts)} synced), faulty: {bad} "
            f"[dim]({r.wall_s:.1f} s: simulate {r.sim_s:.1f}, post {r.post_s:.1f}, "
            f"collector {r.wait_s:.1f})[/]"
        )

    # ---- the summary ----------------------------------------------------------------------
    def finish(self, s: SimSummary, seen: Evidence) -> None:
        s.faulty_nics, s.other_alarms = seen.faulty_nics, sorted(seen.other_alarms)
        if seen.before_fault is not None:
            self._clock_snapshot(s, seen.before_fault)
        run = [r.abs_errors for r in seen.since_converged]
        if run:
            s.sync_p99_run_ns = percentile(np.concatenate(run), 99)
            s.sync_p99_worst_window_ns = max(percentile(e, 99) or 0.0 for e in run)
            if s.sync_p99_worst_window_ns > SYNC_BOUND_NS:
                s.notes.append(
                    f"clock p99 of some later window reached {s.sync_p99_worst_window_ns} ns "
                    f"(pooled over every host and window since convergence: "
                    f"{s.sync_p99_run_ns} ns); the check judges the clocks as the fault starts"
                )
        self._wall(s)
        if s.overlapped_windows:
            s.notes.append(
                f"a collector round ran while windows {s.overlapped_windows} were being posted: "
                "it may have judged them half-stored (raise loop_interval_s)"
            )
        if s.owd_withheld_rows:
            n = s.owd_withheld_rows
            s.notes.append(f"{n:,} window rows carried no one-way delays: an endpoint had no "
                           "synced clock model yet (withhold_unsynced_owd)")  # fmt: skip
        if s.other_alarms:
            s.notes.append(f"other subjects faulty at some point: {', '.join(s.other_alarms)}")

    def _clock_snapshot(self, s: SimSummary, r: Reading) -> None:
        """The clocks as the fault starts: every solved host scored, the worst ones listed."""
        inj = self.injected
        assert inj is not None
        ok = np.isfinite(r.error_ns)
        a = r.abs_errors
        s.sync_p50_ns, s.sync_p99_ns, s.sync_max_ns = (
            percentile(a, 50), percentile(a, 99), percentile(a, 100),
        )  # fmt: skip
        s.hosts_synced, s.hosts_flagged_synced = int(ok.sum()), int(r.synced.sum())
        # Unsolved hosts first, then the largest errors.
        order = np.argsort(-np.where(ok, np.abs(r.error_ns), np.inf), kind="stable")
        off, drift = inj["offset_ns"].to_numpy(), inj["drift_ppb"].to_numpy()
        s.clocks = [
            ClockRow(r.hosts[i], round(float(off[i])), round(float(drift[i])),
                     round(float(r.error_ns[i]), 1) if ok[i] else None, bool(r.synced[i]))
            for i in order[:WORST_SHOWN]
        ]  # fmt: skip

    def _wall(self, s: SimSummary) -> None:
        assert self.collector is not None
        m = self.collector.metrics("finishing")
        for loop in ("clocks", "triangulate"):
            n = m.get(f"fleetlens_loop_duration_seconds_count:{loop}", 0)
            if n:
                s.wall_s[f"{loop}_per_round"] = round(
                    m[f"fleetlens_loop_duration_seconds_sum:{loop}"] / n, 3
                )
        per = [r.wall_s for r in s.timeline]
        s.wall_s["per_window_mean"] = round(float(np.mean(per)), 2) if per else 0.0
        s.wall_s["per_window_max"] = round(float(np.max(per)), 2) if per else 0.0
        for part in ("sim_s", "post_s", "wait_s"):  # where a window's wall time went
            v = [getattr(r, part) for r in s.timeline]
            s.wall_s[part.replace("_s", "_per_window")] = round(float(np.mean(v)), 2) if v else 0.0
        s.wall_s["windows"] = len(per)
        s.wall_s["total"] = round(time.monotonic() - self.t_start, 1)

    def stop(self, keep: bool, s: SimSummary | None) -> None:
        if self.windows is not None:
            self.windows.close()
        if self.stream is not None:
            self.stream.close()
        if keep and s is not None and self.collector is not None:
            s.workdir, s.collector_pid = str(self.work), self.collector.proc.pid
            self.say(
                f"[bold]kept running[/]: collector {self.collector.url} (docs at /docs), "
                f"pid {s.collector_pid}; stop it with 'kill {s.collector_pid}' and remove "
                f"{self.work}"
            )
            self.collector.release()
            return
        if self.collector is not None:
            self.collector.stop()
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)


class _SimAhead:
    """The simulator one window ahead, in its own thread: window ``w + 1`` is simulated while
    window ``w`` is posted and solved, so the simulator and the collector share the cores
    instead of taking turns. Clock models served after window ``w`` reach the simulator
    before it starts window ``w + 2``: one window later than a lock-step loop, as with real
    agents, whose next window is already being probed while the collector solves the last.
    Each window comes with the hosts whose synced model it was simulated with (their agents
    may report one-way delays)."""

    def __init__(self, sim: Simulator, seconds: int) -> None:
        self._sim, self._it = sim, iter(sim.stream(seconds))
        self._synced: frozenset[str] = frozenset()
        self._models: dict[str, ClockModel] | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="fleetlens-sim-ahead")
        self._next: Future[tuple[SimWindow, frozenset[str]] | None] = self._pool.submit(
            self._step, None
        )

    def _step(
        self, models: dict[str, ClockModel] | None
    ) -> tuple[SimWindow, frozenset[str]] | None:
        if models is not None:
            self._sim.set_clock_models(models)
            self._synced |= {h for h, m in models.items() if m.synced}
        win = next(self._it, None)
        return None if win is None else (win, self._synced)

    def take(self) -> tuple[SimWindow, frozenset[str]] | None:
        """The next window (None after the last), and the next one started."""
        got = self._next.result()
        self._next = self._pool.submit(self._step, self._models)
        self._models = None
        return got

    def use_models(self, models: dict[str, ClockModel]) -> None:
        """Models the agents apply from the next window not yet started."""
        self._models = models

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def quiet_interval(rows_per_window: int, rows_per_s: float = POST_ROWS_PER_S) -> float:
    """The collector's loop period: long enough to post a whole window between two rounds.

    A round judges what is stored when it starts; one that starts while a window is half
    posted solves its clocks and triangulates it on part of the fleet, and never looks at that
    window again. So each window is posted right after a round ends, and the next round must
    not start before the posting is done."""
    return round(1.5 + 2.0 * rows_per_window / rows_per_s, 1)


def _pick_fabric_link(topo: Topology, seed: int) -> str:
    ups = sorted(lk for lk in topo.link_by_id if lk.startswith("leaf") and "->spine" in lk)
    return ups[int(np.random.default_rng(seed).integers(len(ups)))]


def run_sim_demo(
    hosts: int = 1024,
    seed: int = 0,
    keep: bool = False,
    as_json: bool = False,
    console: Console | None = None,
    *,
    config: SimDemoConfig | None = None,
    on_window: Callable[[int, SimFabric], None] | None = None,
) -> dict[str, object]:
    """Tell the story on the simulator; the summary as a dict (``checks`` and ``passed``
    included). Progress and the tables go to ``console`` unless ``as_json`` (the caller prints
    the dict). ``config`` overrides everything but ``hosts``/``seed`` defaults. Raises
    :class:`SimDemoError` when the story cannot be told; the collector and its directory are
    gone by then (``keep`` only keeps a finished run)."""
    cfg = config or SimDemoConfig(hosts=hosts, seed=seed)
    console = console or Console(stderr=as_json)
    fabric = SimFabric(cfg, console, quiet=as_json)
    fabric.on_window = on_window
    summary: SimSummary | None = None
    try:
        summary = Story(fabric, console, quiet=as_json).run()
    finally:
        fabric.stop(keep, summary)
    if not as_json:
        render(summary, console)
    return summary.to_dict()
