"""FleetLens clock sync vs ptp4l vs chronyd on the namespace lab, idle and under a UDP flood.

Two lab hosts (``fleetlens.fixtures.lab``, one leaf, one spine) share the machine's real clock,
so whatever offset a tool reports between them is its error. Each tool runs alone for
``--seconds`` (default 120) per condition; the first ``--settle`` seconds (default 20) are not
scored. Printed per tool and condition: bias (mean error), std, p50 and p99 of |error|, and
the number of samples.

- ptp4l (Debian linuxptp, software timestamps ``-S``, UDPv4, ``logSyncInterval -4``): master
  in h00, slave in h01 with ``free_running 1`` and ``freq_est_interval 0``, so it measures but
  never steers the clock. PTP multicast does not cross the routed fabric, so the slave uses
  unicast negotiation (``unicast_master_table``) to the master's fabric address. With
  ``free_running`` linuxptp 3.1 does not print "master offset", so the error is the slave's
  ``offsetFromMaster`` read through ``pmc`` (GET CURRENT_DATA_SET) 10 times a second.
- chronyd (Debian chrony, ``-x``: never touches the clock): server in h00 (``local stratum 1``),
  client in h01 with ``server ... minpoll -4 maxpoll -4 xleave``; the error is the "System time"
  line of ``chronyc tracking`` (negative when "slow"), read 4 times a second.
  No ``hwtimestamp``: it is fatal on veth.
- FleetLens: the real probe agents (``fleetlens agent``) in both hosts, a real collector
  (``fleetlens.api``, uvicorn on the lab's management bridge) running ``HuygensSync`` every
  second; the error is the difference of the two hosts' published clock models evaluated at the
  same instant, per solved window. Two hosts give a single edge, so this is the pairwise
  Huygens fit (``SyncConfig(min_edges=1)``); ``--hosts 4`` runs agents on four hosts (two NICs
  each, two leaves) so the h00/h01 pair gets the network effect, the baselines unchanged. Also
  printed: the time from the agents' start to the first synchronized model.
- Load: a UDP flood from h00 to h01 across the fabric (a Python sender per core-ish, 1200-byte
  datagrams as fast as it can, to a port nobody listens on).
- One CPU (``--cpu``, default the lowest one this process may use; ``--cpu -1``: no pinning):
  the bench and everything it starts run there, so that the two hosts' packets cross the veth
  chain on the same CPU. (It was added against a floor asymmetry that turned out to be
  measured in fleet time, i.e. FleetLens's own error; see ``docs/notes/sync.md``.)

Run as root: ``.venv/bin/python bench/sync_vs_ptp_chrony.py [--seconds 120] [--only ptp4l,...]``.
Everything it starts is stopped by PID and the lab ``sy`` is torn down, also on errors.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

LAB = "sy"
ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
TOOLS = ("ptp4l", "chrony", "fleetlens")
PURITY_NS: int | None = None  # --purity-ns: the agents' pair purity threshold (None: default)
FABRIC_HOSTS: list[str] = ["h00", "h01"]  # lab hosts running agents (--hosts)


@dataclass
class Procs:
    """Every process this bench started, stopped by PID (its own session)."""

    procs: list[subprocess.Popen] = field(default_factory=list)

    def start(self, ns: str | None, argv: list[str], log: Path) -> subprocess.Popen:
        cmd = (["ip", "netns", "exec", ns] if ns else []) + argv
        f = log.open("wb")
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        f.close()
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen) -> None:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            self.stop(p)
        self.procs.clear()


@dataclass
class Result:
    errors_ns: np.ndarray
    note: str = ""

    def row(self) -> str:
        e = self.errors_ns
        if e.size == 0:
            return f"{'-':>9s} {'-':>8s} {'-':>8s} {'-':>8s} {0:>6d}  {self.note}"
        a = np.abs(e)
        return (
            f"{e.mean():9.0f} {e.std():8.0f} {np.percentile(a, 50):8.0f} "
            f"{np.percentile(a, 99):8.0f} {e.size:6d}  {self.note}"
        )


# ---- ptp4l ----------------------------------------------------------------------------------
def run_ptp(lab, procs: Procs, tmp: Path, seconds: float, settle: float) -> Result:
    master_ip = lab.topo.nic_by_id["h00/eth0"].ip
    (tmp / "ptp-m.cfg").write_text(
        "[global]\nlogSyncInterval -4\nunicast_listen 1\nmasterOnly 1\n"
        f"uds_address {tmp}/ptp-m.sock\n"
    )
    (tmp / "ptp-s.cfg").write_text(
        "[global]\nlogSyncInterval -4\nfree_running 1\nfreq_est_interval 0\nslaveOnly 1\n"
        f"uds_address {tmp}/ptp-s.sock\n"
        f"[unicast_master_table]\ntable_id 1\nlogQueryInterval 2\nUDPv4 {master_ip}\n"
        "[eth0]\nunicast_master_table 1\n"
    )
    m = procs.start(lab.ns("h00"), _ptp(tmp / "ptp-m.cfg"), tmp / "ptp-m.log")
    s = procs.start(lab.ns("h01"), _ptp(tmp / "ptp-s.cfg"), tmp / "ptp-s.log")
    out, t0 = [], time.monotonic()
    pmc = ["pmc", "-u", "-b", "0", "-s", f"{tmp}/ptp-s.sock", "-i", f"{tmp}/pmc.sock"]
    last = None
    while time.monotonic() - t0 < seconds:
        time.sleep(0.1)
        r = subprocess.run([*pmc, "GET CURRENT_DATA_SET"], capture_output=True, text=True)
        got = re.search(r"offsetFromMaster\s+(-?[\d.]+)", r.stdout)
        state = re.search(r"meanPathDelay\s+(-?[\d.]+)", r.stdout)
        if got and state and float(state.group(1)) != 0.0 and time.monotonic() - t0 >= settle:
            val = float(got.group(1))
            if val != last:  # a new Sync was processed (the data set holds the last one)
                out.append(val)
                last = val
    procs.stop(s)
    procs.stop(m)
    return Result(np.array(out), "" if out else f"no offsets; see {tmp}/ptp-s.log")


def _ptp(cfg: Path) -> list[str]:
    return ["ptp4l", "-i", "eth0", "-S", "-4", "-m", "-f", str(cfg)]


# ---- chrony ---------------------------------------------------------------------------------
def run_chrony(lab, procs: Procs, tmp: Path, seconds: float, settle: float) -> Result:
    server_ip = lab.topo.nic_by_id["h00/eth0"].ip
    dirs = {k: tmp / f"chrony-{k}" for k in ("s", "c")}
    for d in dirs.values():
        d.mkdir(mode=0o700, exist_ok=True)  # chronyd refuses a command socket elsewhere
    common = "cmdport 0\nbindcmdaddress {d}/chronyd.sock\npidfile {d}/chronyd.pid\n"
    (tmp / "chrony-s.conf").write_text(
        "local stratum 1\nallow 10.0.0.0/8\n" + common.format(d=dirs["s"])
    )
    (tmp / "chrony-c.conf").write_text(
        f"server {server_ip} minpoll -4 maxpoll -4 xleave iburst\nport 0\n"
        + common.format(d=dirs["c"])
    )
    argv = ["chronyd", "-x", "-d", "-u", "root", "-f"]
    s = procs.start(lab.ns("h00"), [*argv, str(tmp / "chrony-s.conf")], tmp / "chrony-s.log")
    c = procs.start(lab.ns("h01"), [*argv, str(tmp / "chrony-c.conf")], tmp / "chrony-c.log")
    out, t0 = [], time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(0.25)
        r = subprocess.run(
            ["chronyc", "-h", f"{dirs['c']}/chronyd.sock", "tracking"],
            capture_output=True,
            text=True,
        )
        got = re.search(r"System time\s*:\s*([\d.]+) seconds (slow|fast)", r.stdout)
        ref = re.search(r"Reference ID\s*:\s*(\S+)", r.stdout)
        if got and ref and ref.group(1) != "00000000" and time.monotonic() - t0 >= settle:
            v = float(got.group(1)) * 1e9
            out.append(-v if got.group(2) == "slow" else v)
    procs.stop(c)
    procs.stop(s)
    return Result(np.array(out), "" if out else f"no tracking; see {tmp}/chrony-c.log")


# ---- FleetLens ------------------------------------------------------------------------------
class Recorder:
    """The SolveClocks the collector runs: HuygensSync, remembering every synced output."""

    def __init__(self) -> None:
        from fleetlens.sync import HuygensSync, SyncConfig

        self.sync = HuygensSync(SyncConfig(min_edges=min_edges(len(FABRIC_HOSTS))))
        self.samples: list[tuple[float, float]] = []  # (monotonic s, error ns)
        # (monotonic s, this window's network-solve value before tracking, span pooled)
        self.detail: list[tuple[float, float, float]] = []
        self.first_synced: float | None = None
        self.lock = threading.Lock()

    def __call__(self, windows, topology, prev):
        gen_before = self.sync.generation
        out = self.sync(windows, topology, prev)
        if self.sync.generation == gen_before:  # the same window generation again
            return out
        rep = self.sync.report
        err = pair_error({m.host_id: m for m in out}, rep.t_ref_ns)
        if err is not None:
            idx = [rep.hosts.index(h) for h in ("h00", "h01")]
            raw = float(rep.offsets.x[idx[1]] - rep.offsets.x[idx[0]])
            span = float(np.max(rep.span)) if rep.span is not None and rep.span.size else 1.0
            with self.lock:
                self.samples.append((time.monotonic(), err))
                self.detail.append((time.monotonic(), raw, span))
                if self.first_synced is None:
                    self.first_synced = time.monotonic()
        return out


def min_edges(n_hosts: int) -> int:
    """Two lab hosts give a single edge: the pairwise fit; more get the network effect."""
    return 1 if n_hosts == 2 else 3


def pair_error(models: dict, fleet_ns: int) -> float | None:
    """h01's offset minus h00's at a fleet time, ns: all of it error, the two hosts share one
    clock. None unless both are synchronized."""
    a, b = models.get("h00"), models.get("h01")
    if not (a and b and a.synced and b.synced):
        return None
    return _offset_at(b, fleet_ns) - _offset_at(a, fleet_ns)


def _offset_at(m, fleet_ns: int) -> float:
    """``raw - fleet`` of a model at a fleet time (the model is linear in raw time)."""
    raw = fleet_ns + m.offset_ns
    return m.offset_ns + m.drift_ppb * 1e-9 * (raw - m.t0_ns)


def fleetlens_available() -> str | None:
    """Why the FleetLens column cannot run, or None."""
    if not (ROOT / "probe" / "agent.py").exists():
        return "fleetlens agent not yet available (probe/agent.py missing)"
    try:
        import uvicorn  # noqa: F401
        from fleetlens.api.app import create_app  # noqa: F401
        from fleetlens.probe import agent  # noqa: F401
    except Exception as e:  # the agent's compiled fast path may be missing
        return f"fleetlens agent not importable: {e}"
    return None


def run_fleetlens(lab, procs: Procs, tmp: Path, seconds: float, settle: float) -> Result:
    why = fleetlens_available()
    if why:
        return Result(np.array([]), why)
    import uvicorn
    from fleetlens.api.app import create_app
    from fleetlens.api.config import Settings
    from fleetlens.api.service import Collector, Engines

    rec = Recorder()
    port = 18470
    # A fresh store and agent state per run: the collector would otherwise start from the
    # previous run's windows and clock models (a stale "synced" model at once, then a
    # tracker that had not seen these hosts for minutes).
    run_dir = Path(tempfile.mkdtemp(prefix="fleetlens-", dir=tmp))
    settings = Settings(
        db_path=run_dir / "fl.duckdb",
        inventory=str(tmp / "topology.json"),
        insecure_no_auth=True,
        loop_interval_s=1.0,
    )
    lab.topo.save(tmp / "topology.json")
    collector = Collector(settings, Engines(solve_clocks=rec))
    server = uvicorn.Server(
        uvicorn.Config(create_app(collector), host=lab.collector_ip, port=port, log_level="error")
    )
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.05)
    t_start = time.monotonic()
    agents = [
        procs.start(
            lab.ns(h),
            [
                str(Path(PY).parent / "fleetlens"),
                "agent",
                "--collector",
                f"http://{lab.collector_ip}:{port}",
                "--host-id",
                h,
                "--nics",
                "eth*",
                "--state-dir",
                str(run_dir / "agent-state"),
                "--metrics",
                "127.0.0.1:0",
                *(["--purity-ns", str(PURITY_NS)] if PURITY_NS is not None else []),
            ],
            run_dir / f"agent-{h}.log",
        )
        for h in lab.topo.hosts
    ]
    time.sleep(seconds)
    for p in agents:
        procs.stop(p)
    server.should_exit = True
    th.join(15)
    with rec.lock:
        errs = np.array([e for t, e in rec.samples if t - t_start >= settle])
        first = rec.first_synced
        detail = np.array([(t - t_start, *d) for t, *d in rec.detail]).reshape(-1, 3)
    # Per solved window: seconds since start, the solve's value before tracking, the span.
    np.savetxt(run_dir / "detail.txt", detail, fmt="%.3f")
    conv = f"first synced model {first - t_start:.1f} s after start" if first else "never synced"
    note = conv if errs.size else f"{conv}; see {run_dir}/agent-h00.log"
    return Result(errs, note)


# ---- load -----------------------------------------------------------------------------------
FLOOD = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
buf, dst, end = b"x" * 1200, (sys.argv[1], 9), time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    for _ in range(1000):
        try:
            s.sendto(buf, dst)
        except OSError:
            pass
"""


@contextmanager
def flood(lab, procs: Procs, tmp: Path, on: bool, seconds: float):
    if not on:
        yield
        return
    dst = lab.topo.nic_by_id["h01/eth0"].ip
    p = procs.start(lab.ns("h00"), [PY, "-c", FLOOD, dst, str(seconds + 30)], tmp / "flood.log")
    try:
        yield
    finally:
        procs.stop(p)


# ---- main -----------------------------------------------------------------------------------
RUNNERS = {"ptp4l": run_ptp, "chrony": run_chrony, "fleetlens": run_fleetlens}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="per tool and condition")
    ap.add_argument("--settle", type=float, default=20.0, help="unscored start-up seconds")
    ap.add_argument("--only", default=",".join(TOOLS), help="comma list of " + ",".join(TOOLS))
    ap.add_argument("--conditions", default="idle,load")
    ap.add_argument("--purity-ns", type=int, help="agents' purity threshold (default: theirs)")
    ap.add_argument(
        "--hosts", type=int, default=2,
        help="lab hosts (default 2). With 4 (2 NICs each, 2 leaves) FleetLens agents run on all "
        "of them and get the network effect; the baselines and the scored pair stay h00/h01",
    )  # fmt: skip
    ap.add_argument(
        "--cpu",
        type=int,
        default=min(os.sched_getaffinity(0)),
        help="run the bench and all it starts on this CPU (-1: no pinning)",
    )
    a = ap.parse_args(argv)
    if a.cpu >= 0:  # inherited by every process it starts (see the module doc)
        os.sched_setaffinity(0, {a.cpu})
    global PURITY_NS
    PURITY_NS = a.purity_ns
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    tools = [t for t in a.only.split(",") if t]
    missing = [b for b, t in (("ptp4l", "ptp4l"), ("pmc", "ptp4l"), ("chronyd", "chrony"))
               if t in tools and shutil.which(b) is None]  # fmt: skip
    if missing:
        print(f"missing {missing}: apt-get install linuxptp chrony", file=sys.stderr)
        return 2
    from fleetlens.fixtures.lab.fabric import lab_fabric

    results: dict[tuple[str, str], Result] = {}
    procs = Procs()
    tmp = Path(tempfile.mkdtemp(prefix="sy-bench-"))
    try:
        shape = (
            dict(hosts=2, nics=1, leaves=1)
            if a.hosts == 2
            else dict(hosts=a.hosts, nics=2, leaves=2)
        )
        with lab_fabric(LAB, spines=1, **shape) as lab:
            FABRIC_HOSTS[:] = lab.topo.hosts
            for cond in a.conditions.split(","):
                for tool in tools:
                    print(f"running {tool} ({cond}) for {a.seconds:g} s ...", flush=True)
                    with flood(lab, procs, tmp, cond == "load", a.seconds):
                        r = RUNNERS[tool](lab, procs, tmp, a.seconds, a.settle)
                    results[(tool, cond)] = r
                    np.savetxt(tmp / f"errors-{tool}-{cond}.txt", r.errors_ns, fmt="%.1f")
    finally:
        procs.stop_all()
    print(f"\nerror between two hosts sharing one clock (ns), {a.seconds:g} s each, first "
          f"{a.settle:g} s not scored; logs in {tmp}")  # fmt: skip
    print(f"{'tool':10s} {'cond':5s} {'bias':>9s} {'std':>8s} {'p50|e|':>8s} {'p99|e|':>8s} "
          f"{'n':>6s}")  # fmt: skip
    for (tool, cond), r in results.items():
        print(f"{tool:10s} {cond:5s} {r.row()}")
    _ratios(results)
    return 0


def _ratios(results: dict[tuple[str, str], Result]) -> None:
    for cond in sorted({c for _, c in results}):
        fl = results.get(("fleetlens", cond))
        if fl is None or fl.errors_ns.size == 0:
            continue
        p99 = np.percentile(np.abs(fl.errors_ns), 99)
        for tool in ("ptp4l", "chrony"):
            r = results.get((tool, cond))
            if r is not None and r.errors_ns.size:
                other = max(np.percentile(np.abs(r.errors_ns), 99), abs(r.errors_ns.mean()))
                print(f"{cond}: {tool} worst of (p99 |e|, |bias|) / FleetLens p99 |e| = "
                      f"{other / max(p99, 1e-9):.1f}x")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
