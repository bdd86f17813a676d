"""Real agents on the namespace lab, a real collector running HuygensSync, truth per host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
from fleetlens.sync import HuygensSync

from fleetlens.records import ClockModel

HERE = Path(__file__).resolve().parent
# A connected socket and send(): about twice the packets per CPU-second of sendto(), so the
# load still crosses the fabric at several times the probe rate when the box is busy.
FLOOD = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((sys.argv[1], 9))
buf, end, send = b"x" * 1200, time.monotonic() + float(sys.argv[2]), s.send
while time.monotonic() < end:
    for _ in range(200):
        try:
            send(buf)
        except OSError:
            pass
    time.sleep(float(sys.argv[3]))
"""


@dataclass
class Injection:
    offset_ns: float
    drift_ppb: float

    def theta(self, real_ns: float, t0_ns: int) -> float:
        """True ``raw − real`` at real time ``real_ns``."""
        return self.offset_ns + self.drift_ppb * 1e-9 * (real_ns - t0_ns)


@dataclass
class Sample:
    mono_s: float  # when the solve returned (time.monotonic)
    real_ns: int  # the real time the models are compared at
    est: dict[str, float]  # model raw − fleet per synced host at that instant


@dataclass
class Recorder:
    """The collector's SolveClocks: HuygensSync, remembering what it published per window."""

    sync: HuygensSync = field(default_factory=HuygensSync)
    samples: list[Sample] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    first_rows_s: float | None = None  # time.monotonic() of the first call that had windows

    def __call__(self, windows, topology, prev):  # type: ignore[no-untyped-def]
        if self.first_rows_s is None and windows.num_rows:
            self.first_rows_s = time.monotonic()
        before = self.sync.generation
        out = self.sync(windows, topology, prev)
        if self.sync.generation != before and self.sync.report.offsets is not None:
            self._record(out)
        return out

    def _record(self, out: list[ClockModel]) -> None:
        t_ref = self.sync.report.t_ref_ns  # fleet time; real time differs by the common mode
        synced = [m for m in out if m.synced]
        if not synced:
            return
        # Real instant: fleet time ≈ real + mean offset, so use the mean model offset (± µs
        # here is harmless: errors change with it only through drift errors of ~100 ppb).
        real = int(t_ref - np.mean([m.offset_ns for m in synced]))
        est = {m.host_id: _offset_at_real(m, real) for m in synced}
        with self.lock:
            self.samples.append(Sample(time.monotonic(), real, est))


def _offset_at_real(m: ClockModel, real_ns: int) -> float:
    """The model's ``raw − fleet`` at the raw reading of a given real instant (iterated)."""
    off = m.offset_ns
    for _ in range(3):
        raw = real_ns + off
        off = m.offset_ns + m.drift_ppb * 1e-9 * (raw - m.t0_ns)
    return off


def errors(sample: Sample, truth: dict[str, Injection], t0_ns: int) -> np.ndarray:
    """|model − truth| per synced host, common mode removed."""
    hosts = sorted(sample.est)
    e = np.array([sample.est[h] - truth[h].theta(sample.real_ns, t0_ns) for h in hosts])
    return np.abs(e - e.mean())


@dataclass
class Procs:
    procs: list[subprocess.Popen] = field(default_factory=list)

    def start(self, ns: str, argv: list[str], log: Path, env: dict | None = None):
        with log.open("wb") as f:
            p = subprocess.Popen(
                ["ip", "netns", "exec", ns, *argv], stdout=f, stderr=subprocess.STDOUT,
                start_new_session=True, env=env,
            )  # fmt: skip
        self.procs.append(p)
        return p

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        self.procs.clear()


@contextmanager
def collector_on(lab, tmp: Path, solve, port: int) -> Iterator[str]:
    """A real collector (uvicorn, DuckDB) on the lab's management bridge running ``solve``."""
    import uvicorn
    from fleetlens.api.app import create_app
    from fleetlens.api.config import Settings
    from fleetlens.api.service import Collector, Engines

    lab.topo.save(tmp / "topology.json")
    settings = Settings(
        db_path=tmp / "fl.duckdb", inventory=str(tmp / "topology.json"), insecure_no_auth=True
    )
    app = create_app(Collector(settings, Engines(solve_clocks=solve)))
    server = uvicorn.Server(
        uvicorn.Config(app, host=lab.collector_ip, port=port, log_level="error")
    )
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not th.is_alive():
            raise RuntimeError("collector did not start")
        time.sleep(0.05)
    try:
        yield f"http://{lab.collector_ip}:{port}"
    finally:
        server.should_exit = True
        th.join(20)


def start_agents(
    lab, procs: Procs, tmp: Path, url: str, truth: dict[str, Injection], t0_ns: int
) -> None:
    env = dict(os.environ, SY_INJECT_T0_NS=str(t0_ns))
    for h, inj in truth.items():
        argv = [
            sys.executable, str(HERE / "lab_agent.py"), "--collector", url, "--host-id", h,
            "--nics", "eth*", "--state-dir", str(tmp / "state"), "--metrics", "127.0.0.1:0",
            "--clock-offset-ns", repr(inj.offset_ns), "--clock-drift-ppb", repr(inj.drift_ppb),
        ]  # fmt: skip
        procs.start(lab.ns(h), argv, tmp / f"agent-{h}.log", env)


def start_flood(lab, procs: Procs, tmp: Path, src: str, dst_nic: str, seconds: float,
                pause_s: float) -> None:  # fmt: skip
    """UDP load from host ``src`` to a NIC across the fabric (bursts of 200, then a pause)."""
    dst = lab.topo.nic_by_id[dst_nic].ip
    argv = [sys.executable, "-c", FLOOD, dst, str(seconds), str(pause_s)]
    procs.start(lab.ns(src), argv, tmp / f"flood-{src}.log")


def rx_packets(ns: str) -> int:
    """Packets received by every interface of a namespace (its switch throughput)."""
    # check=True and a non-empty read: a failed read once showed up as a negative rate.
    out = subprocess.run(
        ["nsenter", f"--net=/run/netns/{ns}", "cat", "/proc/net/dev"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rows = [line for line in out.splitlines() if ":" in line]
    if not rows:
        raise RuntimeError(f"no interfaces read in namespace {ns}")
    return sum(int(line.split(":", 1)[1].split()[1]) for line in rows)


# Agent log lines that mark its start-up stages (the first is its first line: imports done).
_STAGES = {"first probe": " probing ", "first upload": "first batch stored by the collector"}


def agent_stages(tmp: Path, hosts: list[str], spawn_wall_s: float) -> dict[str, float]:
    """Seconds from spawning the agents until the slowest one reached each start-up stage
    (read off the agents' log timestamps; inf for a stage some agent never reached)."""
    out: dict[str, float] = {}
    for h in hosts:
        lines = (tmp / f"agent-{h}.log").read_text(errors="replace").splitlines()
        stamps = {"running": _log_time(lines[0]) if lines else None}
        for name, marker in _STAGES.items():
            stamps[name] = next((_log_time(x) for x in lines if marker in x), None)
        for name, t in stamps.items():
            dt = (t - spawn_wall_s) if t is not None else float("inf")
            out[name] = max(out.get(name, -1.0), dt)
    return out


def _log_time(line: str) -> float | None:
    try:  # "%(asctime)s ...": local time, ms resolution
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None
