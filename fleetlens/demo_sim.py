"""``fleetlens demo --sim``: the demo's story on the fabric simulator, at fleet scale, no root.

The same steps as the lab demo (:mod:`fleetlens.demo`), with the simulator's agents in place of
real ones and its exact truth to judge against:

1. Start a real collector (``fleetlens collector``: uvicorn on 127.0.0.1, a DuckDB file in a
   temporary directory) with the simulated fabric as its inventory, so the real Huygens sync
   and the real triangulation engine run. Default fabric: the issue's reference leaf–spine,
   1024 hosts, 32 leaves, 8 spines, 16 peers per NIC; one NIC per host (see ``run_sim_demo``).
2. Stream the simulated agents' windows into it over HTTP, window by window, with clock offsets
   (±50 ms) and drifts (±100 ppm, wandering) injected per host. The agents apply the clock
   models the collector serves (``/v1/clocks``) from the next window on, as real agents do —
   the loop is closed through the REST API.
3. Wait for clock sync to converge and score every host's served model against the
   simulator's truth (p50/p99/max).
4. A loss fault on a leaf–spine link starts at a known simulated time (the simulator's fault
   API: a fault spec with ``start_s``/``end_s``); poll ``/v1/links`` after each window until the
   collector names it. Time to localize is counted in simulated windows of probes.
5. The fault ends (heal); wait for the verdict to clear. Stop the collector and remove its
   directory unless ``keep``.

Time: the run lies in the recent past (like ``fleetlens sim --fast``), so the collector never
sees a window "from the future" and judges each one as soon as a round finds it stored. Each
window is posted right after a collector round ends, within the round period
(:func:`quiet_interval`), and the next window waits until the served clock models show that a
round has solved and triangulated it: a collector slower than real time delays the story, it
never drops or half-judges a window (a posting that overlapped a round is reported). Simulated
and wall time are therefore decoupled: every "..._s" figure of the story is simulated seconds
(windows of probes), the wall time is reported separately.

Two things the simulated agents do that the lab's real ones do not (yet):

- They align each window's ``start_ns`` to the fleet-time window boundary, as the real agent
  does (the simulator reports the sender's fleet reading of the true boundary instead).
- They send no one-way-delay statistics until both endpoints' agents have been served a synced
  clock model (:func:`withhold_unsynced_owd`): the collector's first clock solve often catches
  a window half-posted, and raw-clock delays (±50 ms off) would become triangulation's per-flow
  baselines and raise false alarms for many windows.

LinkPass moves real bytes over real NIC sockets: there is nothing for it to run on here, and
the summary says so instead of pretending.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.table import Table

from fleetlens.fixtures.sim import SimConfig, Simulator, SimWindow
from fleetlens.fixtures.sim.stream import CollectorStream
from fleetlens.records import ClockModel, nic_hosts
from fleetlens.topology import Topology, leaf_spine

SYNC_BOUND_NS = 100.0  # the clock-sync issue's simulator bound (software timestamps), p99
LINKPASS = "not applicable in --sim (no sockets: LinkPass moves real bytes over real NICs)"
WORST_SHOWN = 10  # hosts listed in the clock table (and the summary's "clocks")
WINDOW_NS = 1_000_000_000
_RUNS = "fleetlens_loop_runs_total:"
POST_ROWS_PER_S = 40_000.0  # HTTP ingest of simulated windows, busy 2-core box: 25-70 k/s


class SimDemoError(RuntimeError):
    """The story could not be told (e.g. the collector died); everything was cleaned up."""


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
class ClockRow:  # the lab demo's ClockRow, error from the simulator's truth
    host: str
    injected_offset_ns: float
    injected_drift_ppb: float
    error_ns: float | None
    synced: bool


@dataclass
class WindowRow:
    window: int
    rows: int
    sync_p99_ns: float | None  # over the hosts with a solved model
    synced: int  # flagged synced by the collector this window
    solved: int  # hosts with a model from a solve (coasting ones included)
    faulty: list[str]
    wall_s: float  # simulate + post + wait for the collector


@dataclass
class SimSummary:
    fabric: str
    collector: str
    mode: str = "sim"
    time_base: str = "simulated seconds (one window = 1 s of probes)"
    hosts: int = 0
    nics: int = 0
    clocks: list[ClockRow] = field(default_factory=list)  # the worst hosts only
    sync_p50_ns: float | None = None
    sync_p99_ns: float | None = None
    sync_max_ns: float | None = None
    sync_p99_run_ns: float | None = None  # over every (host, window) once converged
    sync_p99_worst_window_ns: float | None = None  # the worst window's p99 once converged
    hosts_synced: int = 0  # hosts with a solved model, all scored
    hosts_flagged_synced: int = 0  # of which the collector flagged synced in that window
    owd_withheld_rows: int = 0  # rows sent without one-way delays: an endpoint never synced
    overlapped_windows: list[int] = field(default_factory=list)  # posted during a round
    loop_interval_s: float = 0.0
    sync_converged_s: float | None = None
    fault: dict[str, object] = field(default_factory=dict)
    baseline_clean_s: float | None = None
    localized_s: float | None = None
    faulty_links: list[str] = field(default_factory=list)
    faulty_nics: list[str] = field(default_factory=list)
    other_alarms: list[str] = field(default_factory=list)  # anything else faulty, any window
    cleared_s: float | None = None
    linkpass: str = LINKPASS
    wall_s: dict[str, float] = field(default_factory=dict)
    timeline: list[WindowRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    workdir: str | None = None  # kept only with keep
    collector_pid: int | None = None  # kept only with keep

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

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "checks": self.checks, "passed": all(self.checks.values())}


# ---- the collector process ------------------------------------------------------------------
class CollectorProcess:
    """A real ``fleetlens collector`` on 127.0.0.1, started and stopped here by PID."""

    def __init__(self, workdir: Path, inventory: Path, loop_interval_s: float) -> None:
        self.workdir, self.inventory, self.loop_interval_s = workdir, inventory, loop_interval_s
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, timeout=60)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "collector.log"

    def start(self, timeout_s: float = 120.0) -> None:
        argv = [
            sys.executable, "-m", "fleetlens.cli", "collector",
            "--db", str(self.workdir / "fleetlens.duckdb"), "--listen", f"127.0.0.1:{self.port}",
            "--inventory", str(self.inventory), "--insecure-no-auth", "--public-metrics",
            "--loop-interval", str(self.loop_interval_s),
            # The run is minutes long and its store is thrown away: no rollup passes in between.
            "--retention-interval", "3600",
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive("starting")
            try:
                if self.http.get("/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SimDemoError(f"collector not healthy after {timeout_s:.0f} s{self.log_tail()}")

    def check_alive(self, doing: str) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise SimDemoError(f"collector exited (code {code}) while {doing}{self.log_tail()}")

    def get(self, path: str, doing: str, **params: object) -> httpx.Response:
        try:
            r = self.http.get(path, params=params or None)
        except httpx.TransportError as e:
            self.check_alive(doing)
            raise SimDemoError(f"collector unreachable while {doing}: {e}") from e
        if r.status_code != 200:
            raise SimDemoError(f"GET {path} while {doing}: HTTP {r.status_code} {r.text[:300]}")
        return r

    def get_all(self, path: str, doing: str, **params: object) -> list[dict]:
        """Every page of a paged list endpoint."""
        out: list[dict] = []
        while True:
            page = self.get(path, doing, limit=1000, offset=len(out), **params).json()
            out += page
            if len(page) < 1000:
                return out

    def metrics(self, doing: str) -> dict[str, float]:
        """The loop counters and timings, from the Prometheus text of ``/metrics``."""
        text = self.get("/metrics", doing).text
        names = "runs_total|errors_total|duration_seconds_sum|duration_seconds_count"
        pat = rf'^(fleetlens_loop_(?:{names}))\{{loop="(\w+)"\}} (\S+)'
        return {f"{m[1]}:{m[2]}": float(m[3]) for m in re.finditer(pat, text, re.M)}

    def log_tail(self, lines: int = 20) -> str:
        try:
            tail = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return ("\n--- collector log (last lines) ---\n" + "\n".join(tail)) if tail else ""

    def stop(self) -> None:
        self.http.close()
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- clocks against the truth ---------------------------------------------------------------
def clock_errors(models: dict[str, ClockModel], truth: pa.Table, ready: set[str]) -> np.ndarray:
    """Per truth host: the served model's ``raw − fleet`` at the true window start minus the
    true offset, common mode removed (fleet time is the fleet mean, so every model carries the
    same unknown constant); NaN for hosts not in ``ready`` (never solved: identity models).

    Every solved host is scored, also one whose model coasts this window (``synced`` false):
    that is the model its agent stamps with. Same scoring as the clock-sync issue's simulator
    figures (tests/sync)."""
    hosts = truth["host_id"].to_pylist()
    start = truth["start_ns"].to_numpy().astype(np.int64)
    off = truth["offset_ns"].to_numpy().astype(np.float64)
    got = [models.get(h) if h in ready else None for h in hosts]
    m_off = np.array([m.offset_ns if m else np.nan for m in got])
    m_drift = np.array([m.drift_ppb if m else np.nan for m in got])
    m_t0 = np.array([m.t0_ns if m else 0 for m in got], np.int64)
    raw = start + np.rint(off).astype(np.int64)
    err = m_off + m_drift * 1e-9 * (raw - m_t0).astype(np.float64) - off
    ok = np.isfinite(err)
    return err - err[ok].mean() if ok.any() else err


def _pct(a: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(a, q)), 1) if a.size else None


def withhold_unsynced_owd(win: SimWindow, ready: set[str]) -> tuple[SimWindow, int]:
    """Null the one-way-delay statistics of rows whose sender or receiver has never been
    served a synced clock model; the number of such rows.

    Before its first synced model an agent stamps with its raw clock (±50 ms here), so its
    fleet-time one-way delays are off by the clock offsets. Fed to triangulation, those
    become the per-flow delay baselines (running minima) and every later, correct window
    looks milliseconds late: persistent false NIC/host alarms (measured: a first clock solve
    that caught half the hosts left 4 hosts faulty for 10+ windows). The collector's first
    solve often catches a window half-posted, so the simulated agents say "no delay
    measurement" until then; loss counts and hulls (what sync needs) are sent as always.
    The real agent does not do this yet (reported)."""
    t = win.windows
    host = {c: nic_hosts(t[c]) for c in ("src_nic", "dst_nic")}
    known = pa.array(sorted(ready), pa.string())
    good = pc.and_(pc.is_in(host["src_nic"], known), pc.is_in(host["dst_nic"], known))
    bad = t.num_rows - pc.sum(good).as_py() if t.num_rows else 0
    if not bad:
        return win, 0
    for c in ("owd_min_ns", "owd_p50_ns", "owd_p99_ns", "owd_max_ns"):
        i = t.schema.get_field_index(c)
        t = t.set_column(i, c, pc.if_else(good, t[c], pa.scalar(None, t.schema.field(c).type)))
    return replace(win, windows=t), int(bad)


def snap_starts(win: SimWindow) -> SimWindow:
    """Window starts on the fleet-time window boundary, as the real agent reports them
    (probe/windows.py: ``start_ns = index * window_ns`` in its fleet clock). The simulator
    gives the sender's fleet reading of the true boundary, a few ns (synced) to 50 ms (not
    yet) off; the collector groups a window's rows by ``start_ns``."""
    t = win.windows
    start = t["start_ns"].to_numpy().astype(np.int64)
    snapped = (start + WINDOW_NS // 2) // WINDOW_NS * WINDOW_NS
    col = t.schema.get_field_index("start_ns")
    t = t.set_column(col, "start_ns", pa.array(snapped, pa.int64()))
    # One chunk: splitting a window of hundreds of chunks into per-host batches (take per
    # host) costs 8 s of CPU at 1024 hosts, 0.5 s on one chunk.
    return replace(win, windows=t.combine_chunks())


# ---- the story ------------------------------------------------------------------------------
class SimDemo:
    def __init__(self, cfg: SimDemoConfig, console: Console, quiet: bool) -> None:
        cfg.check()
        self.cfg = cfg
        self.say = (lambda *_, **__: None) if quiet else console.print
        self.console, self.quiet = console, quiet
        leaves, spines = cfg.fabric()
        self.topo: Topology = leaf_spine(cfg.hosts, cfg.nics, leaves, spines)
        self.spec = f"leafspine:hosts={cfg.hosts},nics={cfg.nics},leaves={leaves},spines={spines}"
        self.link = cfg.fault_link or _pick_fabric_link(self.topo, cfg.seed)
        if self.link not in self.topo.link_by_id:
            raise ValueError(f"fault link {self.link!r} is not in {self.spec}")
        self.work: Path | None = None
        self.collector: CollectorProcess | None = None
        self.on_window: Callable[[int, SimDemo], None] | None = None  # tests: inject failures

    def run(self) -> SimSummary:
        c, t_start = self.cfg, time.monotonic()
        self.say(f"[bold]simulated fabric[/]: {self.spec}, {c.peers} peers per NIC")
        sim, epoch = self._simulator()
        self.work = Path(tempfile.mkdtemp(prefix="fleetlens-demo-sim-", dir=c.work_parent))
        self.topo.save(self.work / "topology.json")
        interval = c.loop_interval_s or quiet_interval(sim.n_flows)
        self.collector = CollectorProcess(self.work, self.work / "topology.json", interval)
        self.collector.start()
        s = SimSummary(self.spec, self.collector.url, hosts=len(self.topo.hosts),
                       nics=len(self.topo.nics), loop_interval_s=interval)  # fmt: skip
        s.fault = {"link": self.link, "kind": "loss", "value": c.fault_loss_pct,
                   "at_s": c.fault_at_s, "healed_at_s": c.heal_at_s}  # fmt: skip
        s.wall_s["setup"] = round(time.monotonic() - t_start, 1)
        self.say(f"[bold]collector[/] {self.collector.url} (DuckDB in {self.work})")
        if c.symmetric:
            s.notes.append("fixed path delays made symmetric per link (what the sync bound "
                           "presupposes; symmetric=False shows the raw fabric)")  # fmt: skip
        _Story(self, sim, epoch, s).run()
        s.wall_s["total"] = round(time.monotonic() - t_start, 1)
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

    def close(self, keep: bool, s: SimSummary | None) -> None:
        if keep and s is not None and self.collector and self.collector.proc:
            s.workdir, s.collector_pid = str(self.work), self.collector.proc.pid
            self.say(
                f"[bold]kept running[/]: collector {self.collector.url} (docs at /docs), "
                f"pid {s.collector_pid}; stop it with 'kill {s.collector_pid}' and remove "
                f"{self.work}"
            )
            self.collector.http.close()
            return
        if self.collector is not None:
            self.collector.stop()
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)


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


class _Story:
    """The window loop: post, wait for the collector, read clocks and verdicts, judge."""

    def __init__(self, demo: SimDemo, sim: Simulator, epoch: int, s: SimSummary) -> None:
        self.d, self.sim, self.epoch, self.s = demo, sim, epoch, s
        self.col = demo.collector
        assert self.col is not None
        self.cfg = demo.cfg
        self.errs_run: list[np.ndarray] = []
        self.injected: pa.Table | None = None
        self.ready: set[str] = set()  # hosts whose agent has been served a synced model
        self.counts = self.col.metrics("starting")

    def run(self) -> None:
        c, s, say = self.cfg, self.s, self.d.say
        stream = CollectorStream(self.col.url, None, workers=8)
        try:
            t0 = time.monotonic()
            try:
                stream.register(self.sim.topo, self.sim.cfg.ts_source)
            except (httpx.HTTPError, OSError, RuntimeError) as e:
                self.col.check_alive("registering the hosts")
                raise SimDemoError(f"registering the hosts failed: {e}") from e
            s.wall_s["register"] = round(time.monotonic() - t0, 1)
            say(f"[bold]streaming windows[/]; fault {self.d.link} loss {c.fault_loss_pct:g}% "
                f"from {c.fault_at_s} s to {c.heal_at_s} s (simulated)")  # fmt: skip
            t0 = time.monotonic()
            for win in self.sim.stream(c.max_seconds):  # simulating is part of a window's time
                self._post(stream, win)
                models = self._wait_processed(win.index)
                self._judge(win, models, round(time.monotonic() - t0, 2))
                t0 = time.monotonic()
                if self.d.on_window is not None:
                    self.d.on_window(win.index, self.d)
                if s.cleared_s is not None:
                    break
        finally:
            stream.close()
        self._finish()

    def _post(self, stream: CollectorStream, win: SimWindow) -> None:
        win = snap_starts(win)
        win, withheld = withhold_unsynced_owd(win, self.ready)
        self.s.owd_withheld_rows += withheld
        rounds = self.col.metrics("posting").get(_RUNS + "clocks", 0)
        try:
            stream.send_window(win, self.cfg.seed)
        except (httpx.HTTPError, OSError) as e:
            self.col.check_alive(f"posting window {win.index}")
            raise SimDemoError(f"posting window {win.index} failed: {e}") from e
        # Window 0 is nobody's judged window (the collector skips each host's first one).
        if win.index and self.col.metrics("posting").get(_RUNS + "clocks", 0) != rounds:
            self.s.overlapped_windows.append(win.index)
        if stream.stats.rejected:
            raise SimDemoError(f"collector refused window {win.index}: {stream.stats.rejected[:3]}")
        if self.injected is None:
            self.injected = win.truth_clocks

    def _wait_processed(self, w: int) -> dict[str, ClockModel]:
        """Until a collector round has solved the clocks of window ``w`` and triangulated it
        (both steps of the same round, after the window was stored); the served models.

        The served models change at the end of a round, and every model of a solve has the
        reference time of the window solved: a model on window ``w`` means that round is over.
        """
        doing = f"processing window {w}"
        deadline = time.monotonic() + self.cfg.window_timeout_s
        gen = self.epoch // WINDOW_NS + w
        while time.monotonic() < deadline:
            self._metrics(doing, w)  # a failed loop is an error, not a wait
            models = self._served(doing)
            refs = [(m.t0_ns - round(m.offset_ns)) // WINDOW_NS for m in models.values()]
            if refs and max(refs) >= gen:
                return models
            # Polling /v1/clocks (a page per 1000 hosts) takes CPU from the collector's round.
            time.sleep(min(1.0, max(0.1, self.s.loop_interval_s / 20)))
        raise SimDemoError(f"collector did not process window {w} within "
                           f"{self.cfg.window_timeout_s:.0f} s{self.col.log_tail()}")  # fmt: skip

    def _served(self, doing: str) -> dict[str, ClockModel]:
        return {
            d["host_id"]: ClockModel(d["host_id"], int(d["t0_ns"]), float(d["offset_ns"]),
                                     float(d["drift_ppb"]), d["error_bound_ns"], d["synced"])
            for d in self.col.get_all("/v1/clocks", doing)
        }  # fmt: skip

    def _metrics(self, doing: str, w: int) -> dict[str, float]:
        m = self.col.metrics(doing)
        for loop in ("clocks", "triangulate"):
            key = f"fleetlens_loop_errors_total:{loop}"
            if m.get(key, 0) > self.counts.get(key, 0):
                raise SimDemoError(f"the collector's {loop} loop failed on window {w}"
                                   f"{self.col.log_tail()}")  # fmt: skip
        return m

    def _judge(self, win: SimWindow, models: dict[str, ClockModel], wall: float) -> None:
        w, s, c = win.index, self.s, self.cfg
        doing = f"reading window {w}'s results"
        self.sim.set_clock_models(models)  # the agents' next window uses them
        self.ready |= {h for h, m in models.items() if m.synced}
        hosts = win.truth_clocks["host_id"].to_pylist()
        flagged = np.array([bool(models.get(h) and models[h].synced) for h in hosts])
        err = clock_errors(models, win.truth_clocks, self.ready)
        scored = np.abs(err[np.isfinite(err)])
        p99 = _pct(scored, 99)
        links = sorted(r["link_id"] for r in self.col.get_all("/v1/links", doing, state="faulty"))
        nics = sorted(r["nic_id"] for r in self.col.get_all("/v1/nics", doing, state="faulty"))
        row = WindowRow(w, win.windows.num_rows, p99, int(flagged.sum()), scored.size,
                        links + nics, wall)  # fmt: skip
        s.timeline.append(row)
        end_s = w + 1  # simulated seconds of probes judged so far
        if s.sync_converged_s is None and scored.size == len(hosts) and p99 <= SYNC_BOUND_NS:
            s.sync_converged_s = float(end_s)
        if s.sync_converged_s is not None:
            self.errs_run.append(scored)
        if end_s <= c.fault_at_s:
            self._before_fault(win, err, flagged, links, nics)
        elif end_s <= c.heal_at_s:
            self._during_fault(end_s, links, nics)
        else:
            self._after_heal(end_s, links, nics)
        self._progress(row)

    def _before_fault(self, win, err, synced, links, nics) -> None:
        s = self.s
        if s.sync_converged_s is not None and s.baseline_clean_s is None and not links + nics:
            s.baseline_clean_s = float(win.index + 1)
        elif s.baseline_clean_s is not None:
            self._other(links + nics, exclude=None)
        if win.index + 1 == self.cfg.fault_at_s:  # the clocks as the fault starts
            self._clock_snapshot(err, synced)

    def _during_fault(self, end_s: int, links: list[str], nics: list[str]) -> None:
        s = self.s
        if s.localized_s is None and self.d.link in links:
            s.localized_s = float(end_s - self.cfg.fault_at_s)
        self._other(links + nics, exclude=self.d.link)
        if end_s == self.cfg.heal_at_s:  # the verdicts as the fault ends: settled by now
            s.faulty_links, s.faulty_nics = links, nics

    def _after_heal(self, end_s: int, links: list[str], nics: list[str]) -> None:
        """Cleared: the localized link's verdict, and every other, back to healthy."""
        s = self.s
        self._other(links + nics, exclude=self.d.link)
        if s.cleared_s is None and s.localized_s is not None and not links + nics:
            s.cleared_s = float(end_s - self.cfg.heal_at_s)

    def _other(self, faulty: list[str], exclude: str | None) -> None:
        s = self.s
        s.other_alarms = sorted(set(s.other_alarms) | {x for x in faulty if x != exclude})

    def _clock_snapshot(self, err: np.ndarray, flagged: np.ndarray) -> None:
        s, inj = self.s, self.injected
        assert inj is not None
        hosts = inj["host_id"].to_pylist()
        ok = np.isfinite(err)
        a = np.abs(err[ok])
        s.sync_p50_ns, s.sync_p99_ns, s.sync_max_ns = _pct(a, 50), _pct(a, 99), _pct(a, 100)
        s.hosts_synced, s.hosts_flagged_synced = int(ok.sum()), int(flagged.sum())
        order = np.argsort(-np.where(ok, np.abs(err), np.inf), kind="stable")[:WORST_SHOWN]
        off, drift = inj["offset_ns"].to_numpy(), inj["drift_ppb"].to_numpy()
        s.clocks = [
            ClockRow(hosts[i], round(float(off[i])), round(float(drift[i])),
                     round(float(err[i]), 1) if ok[i] else None, bool(flagged[i]))
            for i in order
        ]  # fmt: skip

    def _progress(self, r: WindowRow) -> None:
        bad = ", ".join(r.faulty[:3]) + (" …" if len(r.faulty) > 3 else "") or "none"
        p99 = "—" if r.sync_p99_ns is None else f"{r.sync_p99_ns:.0f}"
        self.d.say(
            f"  {r.window + 1:>3} s: {r.rows:,} rows, clock p99 {p99} ns "
            f"({r.synced}/{len(self.sim.topo.hosts)} synced), faulty: {bad} "
            f"[dim]({r.wall_s:.1f} s)[/]"
        )

    def _finish(self) -> None:
        s, c = self.s, self.cfg
        if self.errs_run:
            s.sync_p99_run_ns = _pct(np.concatenate(self.errs_run), 99)
            s.sync_p99_worst_window_ns = max(_pct(e, 99) or 0.0 for e in self.errs_run)
            if s.sync_p99_worst_window_ns > SYNC_BOUND_NS:
                s.notes.append(
                    f"clock p99 of some later window reached {s.sync_p99_worst_window_ns} ns "
                    f"(pooled over every host and window since convergence: "
                    f"{s.sync_p99_run_ns} ns); the check judges the clocks as the fault starts"
                )
        m = self.col.metrics("finishing")
        for loop in ("clocks", "triangulate"):
            n = m.get(f"fleetlens_loop_duration_seconds_count:{loop}", 0)
            if n:
                s.wall_s[f"{loop}_per_round"] = round(
                    m[f"fleetlens_loop_duration_seconds_sum:{loop}"] / n, 3
                )
        per = [r.wall_s for r in s.timeline]
        s.wall_s["per_window_mean"] = round(float(np.mean(per)), 2) if per else 0.0
        s.wall_s["per_window_max"] = round(float(np.max(per)), 2) if per else 0.0
        s.wall_s["windows"] = len(per)
        if s.overlapped_windows:
            s.notes.append(
                f"a collector round ran while windows {s.overlapped_windows} were being posted: "
                "it may have judged them half-stored (raise loop_interval_s)"
            )
        if s.sync_converged_s is None:
            s.notes.append(f"clock sync never reached p99 <= {SYNC_BOUND_NS:.0f} ns on all hosts")
        if s.baseline_clean_s is None:
            s.notes.append(f"verdicts were not clean before the fault at {c.fault_at_s} s")
        if s.localized_s is None:
            s.notes.append(f"{self.d.link} was not localized by {c.heal_at_s} s")
        if s.cleared_s is None:
            s.notes.append(f"verdicts not all healthy again by {c.max_seconds} s")
        if s.owd_withheld_rows:
            n = s.owd_withheld_rows
            s.notes.append(f"{n:,} window rows carried no one-way delays: an endpoint had no "
                           "synced clock model yet (withhold_unsynced_owd)")  # fmt: skip
        if s.other_alarms:
            s.notes.append(f"other subjects faulty at some point: {', '.join(s.other_alarms)}")


# ---- rendering and entry points -------------------------------------------------------------
def render(s: SimSummary, console: Console) -> None:
    t = Table(title=f"clock error vs simulator truth: worst {len(s.clocks)} of {s.hosts} hosts")
    for col in ("host", "injected offset", "injected drift", "error", "synced"):
        t.add_column(col, justify="right")
    for r in s.clocks:
        err = "—" if r.error_ns is None else f"{r.error_ns:+.1f} ns"
        off, drift = r.injected_offset_ns / 1e3, r.injected_drift_ppb / 1e3
        t.add_row(r.host, f"{off:+.1f} µs", f"{drift:+.2f} ppm", err, "yes" if r.synced else "no")
    console.print(t)
    res = Table(title="FleetLens demo --sim (times are simulated seconds)")
    res.add_column("check")
    res.add_column("result")
    res.add_row("fabric", f"{s.fabric} ({s.nics} NICs)")
    res.add_row(
        "clock error p50 / p99 / max",
        f"{s.sync_p50_ns} / {s.sync_p99_ns} / {s.sync_max_ns} ns "
        f"(bound p99 {SYNC_BOUND_NS:.0f} ns; {s.hosts_synced}/{s.hosts} hosts solved, "
        f"{s.hosts_flagged_synced} flagged synced in that window)",
    )
    res.add_row(
        "clock error since converged",
        f"p99 {s.sync_p99_run_ns} ns over every host and window; worst window p99 "
        f"{s.sync_p99_worst_window_ns} ns",
    )
    res.add_row("clock sync converged", f"after {s.sync_converged_s} s")
    res.add_row("fault", f"{s.fault.get('kind')} {s.fault.get('value')}% on {s.fault.get('link')}"
                f" at {s.fault.get('at_s')} s")  # fmt: skip
    res.add_row("time to localize", f"{s.localized_s} s of probes")
    res.add_row("faulty links reported", ", ".join(s.faulty_links + s.faulty_nics) or "none")
    res.add_row("verdict cleared", f"{s.cleared_s} s after heal")
    res.add_row("LinkPass", s.linkpass)
    w = s.wall_s
    res.add_row("wall time", f"{w.get('total')} s ({w.get('windows')} windows, "
                f"{w.get('per_window_mean')} s each, triangulation {w.get('triangulate_per_round')}"
                f" s per window)")  # fmt: skip
    for name, ok in s.checks.items():
        res.add_row(name, "[green]PASS[/]" if ok else "[red]FAIL[/]")
    console.print(res)
    for n in s.notes:
        console.print(f"note: {n}")


def run_sim_demo(
    hosts: int = 1024,
    seed: int = 0,
    keep: bool = False,
    as_json: bool = False,
    console: Console | None = None,
    *,
    config: SimDemoConfig | None = None,
    on_window: Callable[[int, SimDemo], None] | None = None,
) -> dict[str, object]:
    """Tell the story on the simulator; the summary as a dict (``checks`` and ``passed``
    included). Progress and the tables go to ``console`` unless ``as_json`` (the caller prints
    the dict). ``config`` overrides everything but ``hosts``/``seed`` defaults. Raises
    :class:`SimDemoError` when the story cannot be told; the collector and its directory are
    gone by then (``keep`` only keeps a finished run)."""
    cfg = config or SimDemoConfig(hosts=hosts, seed=seed)
    console = console or Console(stderr=as_json)
    demo = SimDemo(cfg, console, quiet=as_json)
    demo.on_window = on_window
    summary: SimSummary | None = None
    try:
        summary = demo.run()
    finally:
        demo.close(keep, summary)
    if not as_json:
        render(summary, console)
    return summary.to_dict()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetlens demo --sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = SimDemoConfig()
    p.add_argument("--hosts", type=int, default=d.hosts)
    p.add_argument("--nics", type=int, default=d.nics)
    p.add_argument("--leaves", type=int, help="default: 32 at >= 1024 hosts, else hosts/8")
    p.add_argument("--spines", type=int, help="default: 8 at >= 1024 hosts, else leaves/2")
    p.add_argument("--peers", type=int, default=d.peers)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--fault-link", help="leaf->spine link (default: drawn with the seed)")
    p.add_argument("--fault-value", type=float, default=d.fault_loss_pct, help="percent loss")
    p.add_argument("--fault-at", type=int, default=d.fault_at_s, help="simulated second")
    p.add_argument("--heal-at", type=int, default=d.heal_at_s, help="simulated second")
    p.add_argument("--max-seconds", type=int, default=d.max_seconds)
    p.add_argument("--asymmetric", action="store_true", help="keep the per-direction delays")
    p.add_argument("--keep", action="store_true", help="leave the collector running to explore")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary only")
    return p


def main(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    cfg = SimDemoConfig(
        hosts=a.hosts, nics=a.nics, leaves=a.leaves, spines=a.spines, peers=a.peers,
        seed=a.seed, fault_link=a.fault_link, fault_loss_pct=a.fault_value,
        fault_at_s=a.fault_at, heal_at_s=a.heal_at, max_seconds=a.max_seconds,
        symmetric=not a.asymmetric,
    )  # fmt: skip
    try:
        out = run_sim_demo(a.hosts, a.seed, a.keep, a.json, config=cfg)
    except (SimDemoError, ValueError) as e:
        print(f"fleetlens demo --sim: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(out, indent=1))
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
