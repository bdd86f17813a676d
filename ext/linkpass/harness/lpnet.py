"""Python side of the LinkPass harness: a namespace pair joined by veth "NICs", and rank runners.

Used by tests/linkpass and bench/linkpass_bench.py.  Two network namespaces ``lp-a-TAG`` and
``lp-b-TAG`` (TAG unique per run, e.g. the pytest PID) are joined by N veth pairs named
eth0..eth{N-1} on both sides, pair i on its own /30 of 192.168.240.0/24 (a private range that
only exists inside these namespaces).  Faults: link down (``ip link set dev X down``) or a silent
drop-all nft rule that link state does not reveal.  ``close()`` deletes both namespaces, which
also removes the veths and nft tables; the runner kills only the PIDs it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

EXT_DIR = Path(__file__).resolve().parents[1]
BUILD = EXT_DIR / "build"
PLUGIN = BUILD / "libnccl-net-linkpass.so"
HARNESS = BUILD / "linkpass_harness"
TCPBASE = BUILD / "linkpass_tcpbase"


def build() -> None:
    """Builds the plugin, harness and baseline through the Makefile (as the README says)."""
    subprocess.run(["make", "-s", "-C", str(EXT_DIR)], check=True, capture_output=True, text=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def addr(side: str, i: int) -> str:
    """IPv4 address of NIC ``eth{i}`` on side ``a`` or ``b``."""
    return f"192.168.240.{4 * i + (1 if side == 'a' else 2)}"


class NetnsPair:
    def __init__(self, tag: str, nics: int = 4) -> None:
        self.ns = {"a": f"lp-a-{tag}", "b": f"lp-b-{tag}"}
        self.nics = nics
        self.created: list[str] = []

    def __enter__(self) -> NetnsPair:
        try:
            self.up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def up(self) -> None:
        for ns in self.ns.values():
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("-n", ns, "link", "set", "dev", "lo", "up")
        a, b = self.ns["a"], self.ns["b"]
        for i in range(self.nics):
            name = f"eth{i}"
            _ip("link", "add", name, "netns", a, "type", "veth", "peer", "name", name, "netns", b)
            for side, ns in self.ns.items():
                _ip("-n", ns, "addr", "add", f"{addr(side, i)}/30", "dev", name)
                _ip("-n", ns, "link", "set", "dev", name, "up")
        self.wait_carrier()

    def wait_carrier(self, timeout: float = 5.0) -> None:
        """Waits until every veth is operationally UP on both sides: carrier and then the
        kernel's linkwatch (which sets IFF_RUNNING, what the plugin reads) lag admin up."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            out = [
                subprocess.run(
                    ["ip", "-n", ns, "-o", "link", "show"], capture_output=True, text=True
                ).stdout
                for ns in self.ns.values()
            ]
            if all(o.count("state UP") >= self.nics for o in out):
                return
            time.sleep(0.05)

    def close(self) -> None:
        for ns in self.created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created = []

    def link(self, side: str, nic: int, up: bool) -> None:
        _ip("-n", self.ns[side], "link", "set", "dev", f"eth{nic}", "up" if up else "down")

    def silence(self, side: str, nic: int) -> None:
        """Drops every packet on the NIC in both directions; the link stays up."""
        ns, dev = self.ns[side], f"eth{nic}"
        rules = (
            f"add table inet lpfault{nic}\n"
            f"add chain inet lpfault{nic} in {{ type filter hook input priority 0; }}\n"
            f"add chain inet lpfault{nic} out {{ type filter hook output priority 0; }}\n"
            f'add rule inet lpfault{nic} in iifname "{dev}" drop\n'
            f'add rule inet lpfault{nic} out oifname "{dev}" drop\n'
        )
        subprocess.run(
            ["ip", "netns", "exec", ns, "nft", "-f", "-"],
            input=rules,
            check=True,
            capture_output=True,
            text=True,
        )

    def unsilence(self, side: str, nic: int) -> None:
        ns = self.ns[side]
        subprocess.run(
            ["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", f"lpfault{nic}"],
            check=True,
            capture_output=True,
            text=True,
        )

    def popen(self, side: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        full_env = {**os.environ, **env}
        return subprocess.Popen(
            ["ip", "netns", "exec", self.ns[side], *argv],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@dataclass
class Rank:
    """A harness process and the JSON events it printed (collected on a reader thread)."""

    proc: subprocess.Popen
    events: list[dict] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        self._e = threading.Thread(target=self._read_err, daemon=True)
        self._e.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except json.JSONDecodeError:
                self.stderr.append("bad json: " + line)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def wait_event(self, name: str, timeout: float) -> dict | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for e in list(self.events):
                if e.get("event") == name:
                    return e
            if self.proc.poll() is not None and not self._t.is_alive():
                break
            time.sleep(0.02)
        return None

    def finish(self, timeout: float) -> int:
        """Waits for exit; kills this process (by its own PID) if it overruns."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._t.join(timeout=5)
        self._e.join(timeout=5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def of(self, name: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == name]

    def done(self) -> dict | None:
        d = self.of("done")
        return d[-1] if d else None

    def nic_series(self, key: str = "tx_bytes") -> tuple[list[float], dict[str, list[int]]]:
        """(wall times, {nic: counter values}) from the sample events."""
        ts: list[float] = []
        series: dict[str, list[int]] = {}
        for e in self.of("sample"):
            st = e.get("status")
            if not st:
                continue
            ts.append(e["wall"])
            for nic in st["nics"]:
                series.setdefault(nic["name"], []).append(nic[key])
        return ts, series


def start_pair(
    net: NetnsPair,
    workdir: Path,
    seconds: float,
    env_a: dict[str, str] | None = None,
    env_b: dict[str, str] | None = None,
    extra: list[str] | None = None,
    version: int = 12,
) -> tuple[Rank, Rank]:
    """Receiver in namespace b, sender in namespace a; the 128-byte handle goes through a file."""
    handle = workdir / "handle.bin"
    handle.unlink(missing_ok=True)
    nics = ",".join(f"eth{i}" for i in range(net.nics))
    common = ["--plugin", str(PLUGIN), "--handle", str(handle), "--version", str(version)]
    common += extra or []
    base_env = {"LINKPASS_NICS": nics}
    recv = Rank(
        net.popen("b", [str(HARNESS), "--role", "recv", *common], {**base_env, **(env_b or {})})
    )
    send = Rank(
        net.popen(
            "a",
            [str(HARNESS), "--role", "send", "--seconds", str(seconds), *common],
            {**base_env, **(env_a or {})},
        )
    )
    return send, recv
