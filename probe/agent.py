"""The probe agent: one per host, probing from every NIC, reporting windows to the collector.

Threads: the main thread runs the probing rounds on absolute 10 ms deadlines (the fast path
releases the GIL while it waits); a control thread refreshes the plan and clock model, writes
the LinkPass decision file and watches NIC link state; the uploader ships window batches; the
metrics server answers Prometheus. The control thread never touches the engine: it queues
changes that the main thread applies between rounds.

Start-up is on the clock (the collector cannot sync a host before its first window), so the
agent probes first and loads the rest afterwards: only NIC discovery (rtnetlink, stdlib), the
stdlib HTTP client, numpy and the fast path are imported before the first probe; the uploader
(pyarrow compute, msgpack), the metrics server (prometheus_client) and path discovery (scapy)
start on a thread while the first window fills. Windows completed before the uploader is up
wait for it.

NICs: rescanned (one rtnetlink dump) every control interval; when one appears or goes away the
control thread re-registers the host's NICs and the main thread rebuilds the data path with
them (a short pause in probing, like a plan change), and their flows are traced.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from fleetlens.probe.datapath import DataPath
from fleetlens.probe.nics import LocalNic, discover, hardware_timestamping, link_states
from fleetlens.probe.pathfind import PathFinder, PathSchedule, Trace
from fleetlens.probe.windows import WindowBuilder

from fleetlens.client import CollectorClient, CollectorError
from fleetlens.ids import nic_id
from fleetlens.records import TS_HARDWARE, TS_SOFTWARE, ClockModel, Decision, HostPlan

if TYPE_CHECKING:
    import pyarrow as pa
    from fleetlens.probe.metrics import AgentMetrics, AgentSnapshot
    from fleetlens.probe.upload import Uploader

log = logging.getLogger("fleetlens.agent")
AGENT_VERSION = "fleetlens-agent/0.1"  # sent when registering
T = TypeVar("T")


@dataclass
class AgentConfig:
    collector: str
    host_id: str
    key: bytes
    token: str | None = None
    nics: str = "eth*"
    dscp: int = 26
    state_dir: Path = Path("/run/fleetlens/agent")
    decision_file: Path | None = None
    metrics_addr: str = "127.0.0.1"
    metrics_port: int = 0
    clock_offset_ns: float = 0.0
    clock_drift_ppb: float = 0.0
    clock_epoch_ns: int | None = None  # the instant the injected drift starts (None: start-up)
    purity_ns: int = 1_000
    primer: str = "auto"  # datapath.PRIMER_MODES
    ack_timeout_ns: int = 500_000_000
    # How long a receiver waits for a pair's second probe before answering without it.
    # Generous on purpose: a busy host (or a delay queue) can hold one probe for milliseconds.
    pair_wait_ns: int = 20_000_000
    control_interval_s: float = 1.0
    path_refresh_s: float = 30.0  # re-learn every flow's path this often (0: never)
    mem_batches: int = 120
    spill_max_bytes: int = 256 << 20
    duration_s: float | None = None
    nats: str | None = None  # NATS servers: batches to JetStream (probe/upload.py), not HTTP
    nats_partition: str = ""  # this host's partition (fleetlens/stream.py)


@dataclass
class _Changes:
    """What the control thread hands the main thread."""

    clock: ClockModel | None = None
    up: set[str] | None = None
    plan: HostPlan | None = None
    paths: dict[int, list[str]] = field(default_factory=dict)
    nics: list[LocalNic] | None = None  # NICs appeared or went away: rebuild with these


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.stop = threading.Event()
        self.client = CollectorClient(cfg.collector, cfg.token)
        self.changes: queue.SimpleQueue[_Changes] = queue.SimpleQueue()
        self.metrics: AgentMetrics | None = None  # both made after the first probe
        self.uploader: Uploader | None = None
        self._unsent: list[pa.Table] = []  # windows completed before the uploader was up
        self._late = threading.Thread(target=self._late_start, name="late-start", daemon=True)
        self.failed = False  # the late start failed: the agent stops with exit code 1
        self.path: DataPath | None = None
        self.clock = ClockModel.identity(cfg.host_id)
        self.rounds_skipped = 0
        self.relearn = threading.Event()  # set when routes may have changed (a NIC went up/down)

    @property
    def datapath(self) -> DataPath:
        """The data path: run() builds it before any other step uses it."""
        assert self.path is not None, "the data path is built first"
        return self.path

    # ---- start-up -----------------------------------------------------------------------
    def _nics(self) -> list[LocalNic]:
        """The NICs to probe from; waits for one to appear (e.g. started before the network)."""
        while True:
            nics = self._discover()
            if nics:
                return self._with_ts_source(nics, [])
            if nics is not None:
                log.warning("no interface matches %r with an IPv4 address: waiting for one",
                            self.cfg.nics)  # fmt: skip
            if self.stop.wait(self.cfg.control_interval_s):
                raise SystemExit(0)

    def _discover(self) -> list[LocalNic] | None:
        try:
            return discover(self.cfg.nics)
        except OSError as e:  # rtnetlink refused: try again later rather than stop probing
            log.error("NIC discovery failed: %s", e)
            return None

    @staticmethod
    def _with_ts_source(nics: list[LocalNic], known: list[LocalNic]) -> list[LocalNic]:
        """Timestamp source per NIC: probed once for NICs not seen before."""
        old = {(n.ifname, n.ip): n.ts_source for n in known}
        for n in nics:
            if (n.ifname, n.ip) in old:
                n.ts_source = old[n.ifname, n.ip]
                continue
            n.ts_source = TS_HARDWARE if hardware_timestamping(n.ifname) else TS_SOFTWARE
            log.info("NIC %s %s: %s timestamps", n.ifname, n.ip, n.ts_source)
        return nics

    def _register(self, nics: list[LocalNic]) -> None:
        src = TS_HARDWARE if all(n.ts_source == TS_HARDWARE for n in nics) else TS_SOFTWARE
        body = [{"ifname": n.ifname, "ip": n.ip} for n in nics]
        self.client.register(self.cfg.host_id, body, src, self.cfg.metrics_port, AGENT_VERSION)

    def _until_ok(self, what: str, call: Callable[[], T]) -> T:
        """Retry a collector call until it works or we are stopped (collector not up yet)."""
        delay = 0.2
        while not self.stop.is_set():
            try:
                return call()
            except CollectorError as e:
                log.warning("%s failed (%s); retrying in %.1fs", what, e, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, 5.0)
        raise SystemExit(0)

    def _setup(self) -> tuple[list[LocalNic], HostPlan]:
        nics = self._nics()
        self._until_ok("register", lambda: self._register(nics))
        plan = self._until_ok("plan", lambda: self.client.plan(self.cfg.host_id))
        return nics, plan

    def _build(self, plan: HostPlan, nics: list[LocalNic]) -> None:
        self.path = DataPath(plan, nics, self.cfg.key, self.cfg.dscp, self.cfg.primer)
        eng = self.path.engine
        epoch = self.cfg.clock_epoch_ns if self.cfg.clock_epoch_ns is not None else time.time_ns()
        eng.set_injection(self.cfg.clock_offset_ns, self.cfg.clock_drift_ppb, epoch)
        eng.set_timeouts(self.cfg.ack_timeout_ns, self.cfg.pair_wait_ns)
        self._set_clock(plan.clock)
        self.path.apply({n for n, nic in self.path.nics.items() if nic.up})
        self.builder = WindowBuilder(self.path.flows, plan.window_ns, self.cfg.purity_ns)
        self._window_end: int | None = None  # fleet time the current window ends at
        if self.metrics is not None:
            self.metrics.set_nics(self.path.nics)

    def _set_clock(self, clock: ClockModel) -> None:
        self.clock = clock
        self.datapath.engine.set_clock_model(clock.t0_ns, clock.offset_ns, clock.drift_ppb)

    # ---- main loop ----------------------------------------------------------------------
    def run(self) -> int:
        nics, plan = self._setup()
        self._build(plan, nics)
        control = threading.Thread(target=self._control_loop, name="control", daemon=True)
        control.start()
        self._late.start()
        dp = self.datapath
        log.info("probing %d flows to %d peers", len(dp.flows), len(dp.entries))
        try:
            self._rounds()
        finally:
            self.stop.set()
            self.relearn.set()
            control.join(timeout=10)  # before the client it uses is closed
            self._late.join(timeout=30)  # the uploader, to hand it the last windows
            self._shutdown()
        return 1 if self.failed else 0

    def _late_start(self) -> None:
        """What the first probe need not wait for: uploader, metrics server, path discovery."""
        self._start_metrics()
        try:
            from fleetlens.probe.upload import Uploader

            state = self.cfg.state_dir / self.cfg.host_id
            uploader = Uploader(
                self.cfg.collector, self.cfg.host_id, self.cfg.token, state / "spill",
                self.cfg.mem_batches, self.cfg.spill_max_bytes,
                nats=self.cfg.nats, partition=self.cfg.nats_partition,
            )  # fmt: skip
            uploader.start()
            self.uploader = uploader
        except Exception:
            log.exception("cannot start the uploader: stopping")
            self.failed = True
            self.stop.set()
            return
        if self.cfg.path_refresh_s > 0:
            threading.Thread(target=self._path_loop, name="paths", daemon=True).start()

    def _start_metrics(self) -> None:
        """Metrics are best effort: probing matters more (e.g. when the port is taken)."""
        try:
            from fleetlens.probe.metrics import AgentMetrics

            metrics = AgentMetrics(self.cfg.host_id)
            metrics.set_nics(self.datapath.nics)
            self.metrics = metrics
            if self.cfg.metrics_port:
                metrics.serve(self.cfg.metrics_addr, self.cfg.metrics_port, self._snapshot)
        except Exception as e:
            log.error("no /metrics on %s:%d: %s", self.cfg.metrics_addr, self.cfg.metrics_port, e)

    def _rounds(self) -> None:
        period = self.datapath.plan.period_ns
        start = time.monotonic()
        deadline = time.monotonic_ns() + period
        rnd = 0
        while not self.stop.is_set():
            if self.cfg.duration_s is not None and time.monotonic() - start >= self.cfg.duration_s:
                return
            self.datapath.engine.run_round(rnd, deadline)
            rnd += 1
            deadline += period
            behind = time.monotonic_ns() - deadline
            if behind > 0:  # missed whole rounds: skip them rather than burst to catch up
                missed = behind // period + 1
                rnd += missed
                deadline += missed * period
                self.rounds_skipped += missed
            self._note_window_end()
            # Every 10th round, and every round while an ended window waits for its last
            # acks: it is uploaded within a round of its last pair being answered.
            if rnd % 10 == 0 or self.builder.ended():
                self._collect(self.cfg.ack_timeout_ns + 200_000_000)
            self._apply_changes()

    def _note_window_end(self) -> None:
        """When fleet time passes a window's end, note how many pairs had been sent by then."""
        eng = self.datapath.engine
        now = eng.fleet_time(eng.raw_now())
        w = self.builder.window_ns
        if self._window_end is None:
            self._window_end = (now // w + 1) * w
        elif now >= self._window_end:
            self.builder.mark_end(self._window_end // w - 1, eng.counters()["pairs_sent"])
            self._window_end = (now // w + 1) * w

    def _collect(self, grace_ns: int) -> None:
        eng = self.datapath.engine
        raw_now = eng.raw_now()
        self.builder.add(eng.take_samples(), self.clock, raw_now)
        table = self.builder.pop_complete(int(self.clock.to_fleet(raw_now)), grace_ns)
        if table is not None and table.num_rows:
            self._unsent.append(table)
        if self._unsent and self.uploader is not None:
            for t in self._unsent:
                if self.metrics is not None:
                    self.metrics.observe_windows(t)
                self.uploader.submit(t)
            self._unsent.clear()

    def _apply_changes(self) -> None:
        while True:
            try:
                ch = self.changes.get_nowait()
            except queue.Empty:
                return
            if ch.plan is not None or ch.nics is not None:
                self._rebuild(ch.plan, ch.nics)
            if ch.clock is not None:
                self._set_clock(ch.clock)
            if ch.up is not None:
                self.datapath.apply(ch.up)
            self.builder.learn_paths(ch.paths)

    def _rebuild(self, plan: HostPlan | None, nics: list[LocalNic] | None = None) -> None:
        plan = plan or self.datapath.plan
        log.info("plan or NICs changed (%d entries): rebuilding the data path", len(plan.entries))
        self._drain()
        nics = nics if nics is not None else list(self.datapath.nics.values())
        self.datapath.close()
        self._build(plan, nics)
        self.relearn.set()  # the new window builder knows no paths yet

    def _drain(self) -> None:
        """Collect the acks still in flight, then every window that can be completed."""
        eng = self.datapath.engine
        eng.serve_until(time.monotonic_ns() + self.cfg.ack_timeout_ns + 50_000_000)
        self._collect(grace_ns=0)

    def _shutdown(self) -> None:
        if self.path is not None:
            self._drain()
            counters = self.path.engine.counters()
            log.info("data path totals: %s", " ".join(f"{k}={v}" for k, v in counters.items() if v))
            self.path.close()
        if self._unsent:
            log.error("%d window batches lost: the uploader never started", len(self._unsent))
        if self.uploader is not None:
            if not self.uploader.flush(timeout_s=5.0):
                log.warning("collector did not take everything; the rest is spilled for next time")
            self.uploader.close(spill_rest=True)
        self.client.close()

    # ---- control thread -----------------------------------------------------------------
    def _control_loop(self) -> None:
        up_before: set[str] | None = None
        nics = list(self.datapath.nics.values())
        registered = _nic_key(nics)
        while not self.stop.wait(self.cfg.control_interval_s):
            ch = _Changes()
            found = self._discover()
            if found is not None and _nic_key(found) != _nic_key(nics):
                self._log_nic_change(nics, found)
                nics = ch.nics = self._with_ts_source(found, nics)
                self.relearn.set()  # new flows: trace them
            if registered != _nic_key(nics):  # the collector learns the NICs (retried)
                try:
                    self._register(nics)
                    registered = _nic_key(nics)
                except CollectorError as e:
                    log.warning("re-registering the NICs failed (%s); retrying", e)
            try:
                plan = self.client.plan(self.cfg.host_id)
                ch.clock = plan.clock
                if self.path is not None and plan.entries != self.path.plan.entries:
                    ch.plan = plan
                self._write_decision(self.client.decision(self.cfg.host_id))
            except CollectorError as e:
                log.debug("control refresh skipped: %s", e)
            states = link_states()
            up = {nic_id(self.cfg.host_id, n.ifname) for n in nics if states.get(n.ifname)}
            if up != up_before:
                if up_before is not None:
                    log.warning("NICs up: %s", ", ".join(sorted(up)) or "none")
                    self.relearn.set()  # routes changed under some flows: trace them again now
                ch.up = up
                up_before = up
            self.changes.put(ch)

    @staticmethod
    def _log_nic_change(old: list[LocalNic], new: list[LocalNic]) -> None:
        before, after = _nic_key(old), _nic_key(new)
        added = ", ".join(f"{i} {a}" for i, a in sorted(after - before)) or "none"
        gone = ", ".join(f"{i} {a}" for i, a in sorted(before - after)) or "none"
        log.warning("NICs changed: added %s; gone %s", added, gone)

    def _path_loop(self) -> None:
        """Learn every flow's path now, then every ``path_refresh_s`` (routes change rarely)."""
        try:
            finder = PathFinder(self.client.interfaces(), self.datapath.plan.dport)
        except CollectorError as e:
            log.warning("no path discovery: %s", e)
            return
        if not finder.interfaces:
            log.warning("no path discovery: the collector has no interface map (inventory)")
            return
        schedule = PathSchedule(self.cfg.path_refresh_s)
        while not self.stop.is_set():
            traces = self._traces()
            todo = schedule.todo(traces)
            found = finder.discover(todo)
            schedule.learned(todo, found)
            log.info("paths learned for %d of %d flows", len(found), len(todo))
            self.changes.put(_Changes(paths=found))
            schedule.woken(self.relearn.wait(schedule.wait_s(traces)))
            self.relearn.clear()

    def _traces(self) -> list[Trace]:
        """One traceroute per flow of every NIC that is up now."""
        p = self.datapath
        up = link_states()
        dst_ip = {e.dst_nic: e.dst_ip for e in p.entries}
        f = p.flows
        return [
            Trace(i, nic.ip, nic.ifname, dst_ip[f.dst_nic[i]], f.dst_nic[i], int(f.sport[i]))
            for i in range(len(f))
            if up.get((nic := p.nics[f.src_nic[i]]).ifname)
        ]

    def _write_decision(self, decision: Decision) -> None:
        if self.cfg.decision_file is None:
            return
        self.cfg.decision_file.parent.mkdir(parents=True, exist_ok=True)
        decision.write_atomic(self.cfg.decision_file)

    def _snapshot(self) -> AgentSnapshot:
        eng = self.path.engine if self.path else None
        return {
            "engine": eng.counters() if eng is not None else {},
            "upload": self.uploader.stats if self.uploader else None,
            "depth": self.uploader.depth if self.uploader else (0, 0),
            "rounds_skipped": self.rounds_skipped,
        }


def _nic_key(nics: list[LocalNic]) -> frozenset[tuple[str, str]]:
    return frozenset((n.ifname, n.ip) for n in nics)
