"""``fleetlens demo``: the whole story on the lab fabric, measured against injected truth.

1. Build the fabric (default 8 hosts × 2 NICs, 4 leaves, 2 spines), start the collector and one
   agent per host, each with an injected clock offset and drift.
2. Wait for clock sync to converge; compare every host's served clock model with the truth.
3. Fault one leaf–spine link; time how long until the REST API names it, and check that it
   names nothing else.
4. Heal it; run a LinkPass transfer between two hosts on different leaves while one NIC's
   cable is pulled and restored; report the longest stall and the bytes verified.
5. Heal everything and tear down, unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.status import Status
from rich.table import Table

from fleetlens.fixtures.lab import faults, netns
from fleetlens.fixtures.lab.fabric import Lab
from fleetlens.fixtures.lab.stack import Stack
from fleetlens.fixtures.lab.state import Proc, start_ticks, updating

LINKPASS_BUILD = Path(__file__).resolve().parent.parent / "ext" / "linkpass" / "build"
SYNC_BOUND_NS = 200.0  # the lab's p99 bound for software timestamps (clock-sync issue)
# Reads of every host's clock behind that p99: with 5 (8 hosts, 40 errors) it was the single
# worst error; with 10 the p99 lies between the second and third worst of 80.
SYNC_READS = 10
# Converged: within the bound at every read for this long, not at the first lucky read. The
# agents' start-up (scapy's import, the first traceroutes on a saturated 2-core box) disturbs
# the first ~20 s: a single good read was followed by 173-294 ns in 2 of 6 runs, and in a CI
# run models moved by up to 238 ns after three good reads.
SYNC_SETTLED_S = 5.0


@dataclass
class ClockRow:
    host: str
    injected_offset_ns: float
    injected_drift_ppb: float
    error_ns: float | None  # served model minus truth, common mode removed
    synced: bool


@dataclass
class Summary:
    lab: str
    collector: str
    clocks: list[ClockRow] = field(default_factory=list)
    sync_p99_ns: float | None = None  # over every host and read during the warm-up
    sync_samples: int = 0  # clock reads (all hosts each) behind sync_p99_ns
    sync_read_max_ns: list[float] = field(default_factory=list)  # worst host, read by read
    sync_converged_s: float | None = None
    fault: dict[str, object] = field(default_factory=dict)
    baseline_clean_s: float | None = None
    localized_s: float | None = None
    cleared_s: float | None = None  # from heal until the link's verdict is healthy again
    faulty_links: list[str] = field(default_factory=list)
    linkpass: dict[str, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def checks(self) -> dict[str, bool]:
        lp = self.linkpass
        return {
            "clocks synced": self.sync_p99_ns is not None and self.sync_p99_ns <= SYNC_BOUND_NS,
            "fault localized, nothing else": self.faulty_links == [self.fault.get("link")],
            "verdict cleared after heal": self.cleared_s is not None,
            "LinkPass stall < 1 s, bytes verified": bool(lp)
            and lp.get("errors") == 0
            and lp.get("mismatches") == 0
            and lp.get("bytes_verified") == lp.get("bytes_sent")
            and float(lp.get("max_stall_ms", 1e9)) < 1000,  # type: ignore[arg-type]
        }


class _Quiet:
    """Stands in for a rich status with --json: nothing goes to the terminal."""

    def update(self, *_: object) -> None:
        pass


class Demo:
    def __init__(self, a: argparse.Namespace, console: Console) -> None:
        self.a = a
        self.say = console.print if not a.json else (lambda *_, **__: None)
        self.console = console
        self.rng = np.random.default_rng(a.seed)
        self.lab: Lab | None = None
        self.stack: Stack | None = None

    # ---- steps --------------------------------------------------------------------------
    def run(self) -> Summary:
        a = self.a
        self.say(
            f"[bold]building the lab fabric[/]: {a.hosts} hosts × {a.nics} NICs, "
            f"{a.leaves} leaves, {a.spines} spines"
        )
        Lab.down(a.name)
        self.lab = Lab.up(a.name, a.hosts, a.nics, a.leaves, a.spines)
        work = Path(tempfile.mkdtemp(prefix="fleetlens-demo-"))
        self.stack = Stack(
            self.lab, work, collector_args=["--background-loss", str(a.background_loss)]
        )
        self.stack.start_collector()
        s = Summary(self.lab.name, self.stack.url)
        truth = self._start_agents()
        self._sync(s, truth)
        self._baseline(s, truth)
        self._localize(s)
        self._linkpass(s)
        self.say("[bold]healing every fault[/]")
        faults.heal(self.lab)
        return s

    def _start_agents(self) -> dict[str, tuple[float, float]]:
        assert self.lab is not None and self.stack is not None
        epoch = time.time_ns()
        truth = {}
        for h in self.lab.topo.hosts:
            off, drift = (
                self.rng.uniform(-1e6, 1e6),
                self.rng.uniform(-20e3, 20e3),
            )  # ±1 ms, ±20 ppm
            truth[h] = (off, drift)
            self.stack.start_agent(
                h, "--clock-offset-ns", f"{off:.0f}", "--clock-drift-ppb", f"{drift:.0f}",
                "--clock-epoch-ns", str(epoch),
                "--metrics", f"{self.lab.mgmt_ip(h)}:9478",
            )  # fmt: skip
        self.epoch = epoch
        self.say(
            f"[bold]started {len(truth)} agents[/] with injected clock errors "
            "(offsets ±1 ms, drifts ±20 ppm)"
        )
        return truth

    def _get(self, path: str) -> object:
        assert self.stack is not None
        r = httpx.get(self.stack.url + path, timeout=5)
        r.raise_for_status()
        return r.json()

    def _sync(self, s: Summary, truth: dict[str, tuple[float, float]]) -> None:
        self.say("[bold]waiting for clock sync to converge[/] …")
        t0, deadline = time.monotonic(), time.monotonic() + self.a.sync_timeout
        since: float | None = None  # when the current run of good reads began
        with self._status("clock sync") as status:
            while time.monotonic() < deadline:
                rows = self._clock_rows(truth)
                errs = [abs(r.error_ns) for r in rows if r.error_ns is not None]
                p99 = float(np.percentile(errs, 99)) if errs else None
                synced = sum(r.synced for r in rows)
                status.update(f"clock sync: {synced}/{len(rows)} hosts synced, p99 error {p99} ns")
                good = synced == len(rows) and len(errs) == len(rows) and p99 <= SYNC_BOUND_NS
                now = time.monotonic() - t0
                since = (now if since is None else since) if good else None
                if since is not None and now - since >= SYNC_SETTLED_S:
                    s.sync_converged_s = round(since, 1)
                    break
                time.sleep(0.5)
        s.clocks = self._clock_rows(truth)
        if s.sync_converged_s is None:
            s.notes.append(
                f"clock sync did not reach p99 <= {SYNC_BOUND_NS:.0f} ns "
                f"within {self.a.sync_timeout} s"
            )
        else:
            self.say(f"  converged after {s.sync_converged_s} s")

    def _clock_rows(self, truth: dict[str, tuple[float, float]]) -> list[ClockRow]:
        served = {c["host_id"]: c for c in self._get("/v1/clocks")}  # type: ignore[union-attr]
        now = time.time_ns()
        err: dict[str, float] = {}
        for h, (off, drift) in truth.items():
            c = served.get(h)
            if c is None:
                continue
            true_now = off + drift * 1e-9 * (now - self.epoch)  # raw - real for this host now
            model = c["offset_ns"] + c["drift_ppb"] * 1e-9 * (now + true_now - c["t0_ns"])
            err[h] = model - true_now
        common = float(np.mean(list(err.values()))) if err else 0.0  # fleet time is the fleet mean
        return [
            ClockRow(h, round(off), round(drift), round(err[h] - common, 1) if h in err else None,
                     bool(served.get(h, {}).get("synced")))
            for h, (off, drift) in truth.items()
        ]  # fmt: skip

    def _baseline(self, s: Summary, truth: dict[str, tuple[float, float]]) -> None:
        """Wait until nothing is faulty, at least ``--warmup`` seconds after sync and for
        ``SYNC_READS`` synced clock reads: the collector takes one-way delays as evidence only
        once both hosts' agents apply a synced clock model, and each flow needs a few such
        windows for its delay baseline.

        The clock error is scored meanwhile, every host at every read, as the sync issue's
        bound is meant (steady state after convergence): one read right at convergence is
        the first models, and its p99 over 8 hosts is their single worst moment."""
        self.say("[bold]waiting for a clean baseline[/] (start-up verdicts to clear) …")
        t0, deadline = time.monotonic(), time.monotonic() + self.a.baseline_timeout
        reads: list[list[ClockRow]] = []
        bad: list[str] = []
        with self._status("baseline") as status:
            while time.monotonic() < deadline:
                if s.sync_converged_s is not None and (rows := self._synced_read(truth)):
                    reads.append(rows)
                bad = self._faulty("/v1/links") + self._faulty("/v1/nics")
                scored = s.sync_converged_s is None or len(reads) >= SYNC_READS
                if not bad and scored and time.monotonic() - t0 >= self.a.warmup:
                    s.baseline_clean_s = round(time.monotonic() - t0, 1)
                    break
                status.update(f"still faulty: {', '.join(bad)}")
                time.sleep(0.5)
            else:
                s.notes.append(
                    f"verdicts still not clean after {self.a.baseline_timeout} s: "
                    + (", ".join(bad) or f"only {len(reads)} synced clock reads")
                )
        if reads:
            errs = [abs(r.error_ns) for rows in reads for r in rows]  # type: ignore[arg-type]
            s.clocks, s.sync_samples = reads[-1], len(reads)
            s.sync_read_max_ns = [max(abs(r.error_ns) for r in rows) for rows in reads]  # type: ignore[arg-type]
            s.sync_p99_ns = round(float(np.percentile(errs, 99)), 1)
        self.say(
            f"  clock error p99 vs truth: {s.sync_p99_ns} ns over {s.sync_samples} reads "
            "of every host during the warm-up"
        )

    def _synced_read(self, truth: dict[str, tuple[float, float]]) -> list[ClockRow] | None:
        """One read of every host's clock error, or None while any host is not synced."""
        rows = self._clock_rows(truth)
        return rows if all(r.synced and r.error_ns is not None for r in rows) else None

    def _faulty(self, path: str) -> list[str]:
        rows = self._get(f"{path}?state=faulty&limit=1000")
        return sorted(r.get("link_id") or r.get("nic_id") for r in rows)  # type: ignore[union-attr]

    def _localize(self, s: Summary) -> None:
        assert self.lab is not None
        link, kind, value = self.a.fault_link, self.a.fault, self.a.fault_value
        unit = "% loss" if kind == "loss" else " µs delay"
        self.say(f"[bold]injecting[/] {value:g}{unit} on {link}")
        t0 = time.monotonic()
        if kind == "loss":
            faults.add_loss(self.lab, link, value)
        else:
            (f,) = faults.add_delay(self.lab, link, value)
            s.notes.append(f"delay fault measured at +{f.measured_us} µs")
        s.fault = {"link": link, "kind": kind, "value": value}
        deadline = t0 + self.a.localize_timeout
        with self._status("localizing") as status:
            while time.monotonic() < deadline:
                if link in self._faulty("/v1/links"):
                    s.localized_s = round(time.monotonic() - t0, 1)
                    break
                status.update(f"asking /v1/links for faulty links … {time.monotonic() - t0:.1f} s")
                time.sleep(0.25)
        time.sleep(self.a.settle)  # let every verdict settle before judging "nothing else"
        s.faulty_links = self._faulty("/v1/links")
        self.say(
            f"  faulty links: {', '.join(s.faulty_links) or 'none'}"
            + (f" (found after {s.localized_s} s)" if s.localized_s else " (NOT localized)")
        )
        self._heal_and_clear(s, link)

    def _heal_and_clear(self, s: Summary, link: str) -> None:
        assert self.lab is not None
        faults.heal(self.lab, link)
        t0, deadline = time.monotonic(), time.monotonic() + self.a.clear_timeout
        with self._status("healed") as status:
            while time.monotonic() < deadline:
                if link not in self._faulty("/v1/links"):
                    s.cleared_s = round(time.monotonic() - t0, 1)
                    break
                status.update(f"healed {link}; waiting for its verdict to clear …")
                time.sleep(0.5)
        after = (
            f"healthy again after {s.cleared_s} s" if s.cleared_s is not None else "still faulty"
        )
        self.say(f"  healed {link}: {after}")

    def _status(self, text: str) -> AbstractContextManager[Status | _Quiet]:
        return self.console.status(text) if not self.a.json else nullcontext(_Quiet())

    def _linkpass(self, s: Summary) -> None:
        assert self.lab is not None and self.stack is not None
        topo = self.lab.topo
        a_host, b_host = topo.hosts[0], topo.hosts[-1]
        pulled = topo.nics_by_host[a_host][-1]
        self.say(
            f"[bold]LinkPass transfer[/] {a_host} → {b_host} for {self.a.linkpass_seconds} s; "
            f"pulling {pulled.id} at 2 s, restoring at 5 s"
        )
        result = run_linkpass(
            self.lab, self.stack.workdir, a_host, b_host, self.a.linkpass_seconds, pulled.id
        )
        s.linkpass = result
        self.say(
            f"  max stall {result.get('max_stall_ms')} ms, "
            f"{result.get('bytes_verified')} of {result.get('bytes_sent')} bytes verified"
        )

    def close(self, keep: bool, failed: bool) -> None:
        """Stop and remove everything (the fabric too when it was half built); the collector's
        and agents' logs stay on disk only when something failed."""
        if keep and self.stack is not None and self.lab is not None:
            adopt(self.lab, self.stack)
            self.say(
                f"[bold]kept running[/]: collector {self.stack.url} (docs at /docs); "
                f"'fleetlens lab --name {self.lab.name} down' stops everything"
            )
            return
        if self.stack is not None:
            self.stack.stop_agents()
            self.stack.close()
            if failed:
                print(f"fleetlens demo: logs kept in {self.stack.workdir}", file=sys.stderr)
            else:
                shutil.rmtree(self.stack.workdir, ignore_errors=True)
        Lab.down(self.a.name)


def run_linkpass(
    lab: Lab, work: Path, src: str, dst: str, seconds: float, pull: str
) -> dict[str, object]:
    """Receiver on ``dst``, sender on ``src`` (NIC i pairs with NIC i); ``pull``'s cable is
    taken down at 2 s and restored at 5 s while the transfer runs."""
    harness, plugin = (
        LINKPASS_BUILD / "linkpass_harness",
        LINKPASS_BUILD / "libnccl-net-linkpass.so",
    )
    if not harness.exists():
        subprocess.run(["make", "-s", "-C", str(LINKPASS_BUILD.parent)], check=True)
    handle = work / "linkpass.handle"
    handle.unlink(missing_ok=True)
    nics = ",".join(n.ifname for n in lab.topo.nics_by_host[src])
    env = {**os.environ, "LINKPASS_NICS": nics, "LINKPASS_TIMEOUT_MS": "10000"}
    common = ["--plugin", str(plugin), "--handle", str(handle), "--sample-ms", "100"]
    procs = {
        role: _spawn_in(lab, host, [str(harness), "--role", role, *common, *extra], env)
        for role, host, extra in (("recv", dst, []), ("send", src, ["--seconds", str(seconds)]))
    }
    link = f"{pull}->{lab.topo.nic_by_id[pull].leaf}"
    time.sleep(2)
    faults.add_down(lab, link)
    time.sleep(3)
    faults.heal(lab, link)
    out = {role: _done_event(p, seconds + 30) for role, p in procs.items()}
    send, recv = out["send"], out["recv"]
    return {
        "src": src, "dst": dst, "pulled": pull,
        "bytes_sent": send.get("bytes"), "bytes_verified": recv.get("bytes_verified"),
        "mismatches": recv.get("mismatches"),
        # A rank that never finished has no "done" event: it counts as an error and a stall.
        "errors": int(send.get("errors", 1)) + int(recv.get("errors", 1)),
        "max_stall_ms": max(float(r.get("max_stall_ms", 1e9)) for r in (send, recv)),
    }  # fmt: skip


def _spawn_in(lab: Lab, host: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return netns.popen(
        lab.ns(host), argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )  # type: ignore[return-value]


def _done_event(p: subprocess.Popen[str], timeout_s: float) -> dict[str, object]:
    try:
        out, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    events = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    done = [e for e in events if e.get("event") == "done"]
    return done[-1] if done else {}


def adopt(lab: Lab, stack: Stack) -> None:
    """Hand the stack's processes to the lab, so that 'fleetlens lab down' stops them too."""
    procs = [("collector", stack.collector), *stack.agents.items()]
    with updating(lab.name) as state:
        state.procs += [
            Proc(p.pid, start_ticks(p.pid) or 0, role, "") for role, p in procs if p is not None
        ]


def render(s: Summary, console: Console) -> None:
    t = Table(title="clock error per host vs injected truth")
    for col in ("host", "injected offset", "injected drift", "error", "synced"):
        t.add_column(col, justify="right")
    for r in s.clocks:
        err = "—" if r.error_ns is None else f"{r.error_ns:+.0f} ns"
        t.add_row(
            r.host,
            f"{r.injected_offset_ns / 1e3:+.1f} µs",
            f"{r.injected_drift_ppb / 1e3:+.2f} ppm",
            err,
            "yes" if r.synced else "no",
        )
    console.print(t)
    res = Table(title="FleetLens demo")
    res.add_column("check")
    res.add_column("result")
    res.add_row(
        "clock error p99",
        f"{s.sync_p99_ns} ns over {s.sync_samples} reads (bound {SYNC_BOUND_NS:.0f} ns)",
    )
    unit = "% loss" if s.fault.get("kind") == "loss" else " µs delay"
    res.add_row("fault", f"{s.fault.get('value')}{unit} on {s.fault.get('link')}")
    res.add_row("time to localize", f"{s.localized_s} s")
    res.add_row("faulty links reported", ", ".join(s.faulty_links) or "none")
    res.add_row("verdict cleared after heal", f"{s.cleared_s} s")
    lp = s.linkpass
    res.add_row(
        "LinkPass",
        f"stall {lp.get('max_stall_ms')} ms, {lp.get('bytes_verified')}/{lp.get('bytes_sent')} "
        f"bytes verified, errors {lp.get('errors')}",
    )
    for name, ok in s.checks.items():
        res.add_row(name, "[green]PASS[/]" if ok else "[red]FAIL[/]")
    console.print(res)
    for n in s.notes:
        console.print(f"note: {n}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetlens demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--name", default="demo", help="lab name (default %(default)s)")
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--nics", type=int, default=2)
    p.add_argument("--leaves", type=int, default=4)
    p.add_argument("--spines", type=int, default=2)
    p.add_argument("--fault-link", default="leaf1->spine0")
    p.add_argument("--fault", choices=["loss", "delay"], default="loss")
    p.add_argument("--fault-value", type=float, default=5.0, help="percent loss or µs delay")
    p.add_argument("--sync-timeout", type=float, default=30.0)
    p.add_argument("--baseline-timeout", type=float, default=30.0)
    p.add_argument(
        "--background-loss", type=float, default=1e-3,
        help="loss triangulation treats as normal: software stamps on a loaded 2-core lab "
        "lose ~1e-4 of probes in the measurement itself (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--warmup", type=float, default=6.0,
        help="seconds of clean, synced probing before the fault (delay baselines)",
    )  # fmt: skip
    p.add_argument("--localize-timeout", type=float, default=15.0)
    p.add_argument("--clear-timeout", type=float, default=30.0)
    p.add_argument(
        "--settle", type=float, default=3.0, help="seconds before reading the final verdicts"
    )
    p.add_argument("--linkpass-seconds", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="leave the stack running to explore")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary only")
    p.add_argument(
        "--sim", action="store_true",
        help="tell the story on the simulator at 1024 hosts, no root "
        "('fleetlens demo --sim --help' lists its options)",
    )  # fmt: skip
    return p


def _unwind_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the fabric and every process are torn down. Children
    forked without exec (pyroute2 forks to create namespaces) inherit the handler: they
    must still just die, as by default."""
    me = os.getpid()

    def on_term(*_: object) -> None:
        if os.getpid() != me:
            os._exit(128 + signal.SIGTERM)
        sys.exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)


def main(argv: list[str]) -> int:
    if "--sim" in argv:  # the same story on the simulator: its own options, no root
        from fleetlens import demo_sim

        return demo_sim.main([x for x in argv if x != "--sim"])
    a = _parser().parse_args(argv)
    if os.geteuid() != 0:
        print("fleetlens demo: the lab fabric needs root (network namespaces)", file=sys.stderr)
        return 2
    console = Console(stderr=a.json)
    _unwind_on_sigterm()
    demo = Demo(a, console)
    s: Summary | None = None
    try:
        s = demo.run()
    finally:
        demo.close(a.keep, failed=s is None or not all(s.checks.values()))
    if a.json:
        print(
            json.dumps(
                {**asdict(s), "checks": s.checks, "passed": all(s.checks.values())}, indent=1
            )
        )
    else:
        render(s, console)
    return 0 if all(s.checks.values()) else 1
