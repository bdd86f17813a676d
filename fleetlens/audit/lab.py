"""``fleetlens audit --lab``: build the lab fabric, optionally hide a fault, run the stack.

The fault goes on a random (seeded) leaf–spine link *before* any agent starts, so nothing the
audit reads was measured without it (a pre-handover fabric with a bad cable); which link it is
is returned to the caller for the report's ``lab.injected`` section and is never passed to the
judgement. Everything built here is torn down by :meth:`LabRun.close`, also after a failure
or Ctrl-C.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pyroute2 import IPRoute

from fleetlens.audit.data import AuditInputError
from fleetlens.fixtures.lab import faults
from fleetlens.fixtures.lab.fabric import Lab, default_mgmt_subnet
from fleetlens.fixtures.lab.stack import InjectedClocks, Stack
from fleetlens.topology import Topology

_INJECT = re.compile(r"^(loss|delay):([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(%|us|µs)?$")


def _check_mgmt_subnet(name: str) -> None:
    """The lab's management /24 is derived from its name (a hash mod 250): two names can
    share it, and a second bridge on a subnet already in use here silently breaks the
    agents' way to the collector. Refuse before building anything."""
    net = ipaddress.ip_network(default_mgmt_subnet(name))
    with IPRoute() as ipr:
        for msg in ipr.get_addr(family=socket.AF_INET):
            addr = msg.get_attr("IFA_ADDRESS")
            if addr and ipaddress.ip_address(addr) in net:
                dev = msg.get_attr("IFA_LABEL") or f"interface {msg['index']}"
                raise AuditInputError(
                    f"lab name {name!r} maps to management subnet {net}, already used by "
                    f"{dev} (another lab?): pick another --name"
                )


@dataclass(frozen=True)
class Injection:
    kind: str  # loss | delay
    value: float  # percent or µs


def parse_inject(text: str) -> Injection:
    """``loss:0.5%`` (percent) or ``delay:50us`` (microseconds); ValueError with a reason."""
    m = _INJECT.match(text.strip())
    if not m:
        raise ValueError(f"--inject wants loss:PCT% or delay:USus, got {text!r}")
    kind, value, unit = m.group(1), float(m.group(2)), m.group(3)
    if kind == "loss" and unit not in (None, "%"):
        raise ValueError(f"--inject loss takes a percentage (loss:0.5%), got {text!r}")
    if kind == "delay" and unit not in (None, "us", "µs"):
        raise ValueError(f"--inject delay takes microseconds (delay:50us), got {text!r}")
    if kind == "loss" and not 0 < value <= 100:
        raise ValueError(f"--inject loss must be in (0, 100] %, got {value:g}")
    if kind == "delay" and not 0 < value <= 1_000_000:
        raise ValueError(f"--inject delay must be in (0, 1e6] µs, got {value:g}")
    return Injection(kind, value)


@dataclass
class LabRun:
    name: str
    hosts: int
    nics: int
    leaves: int
    spines: int
    seed: int
    background_loss: float
    say: Callable[[str], object] = print
    lab: Lab | None = None
    stack: Stack | None = None
    injected: list[dict] = field(default_factory=list)
    clocks: InjectedClocks = field(default_factory=lambda: InjectedClocks(0, {}))
    workdir: Path | None = None

    def up(self) -> Topology:
        self.say(
            f"building lab {self.name!r}: {self.hosts} hosts x {self.nics} NICs, "
            f"{self.leaves} leaves, {self.spines} spines"
        )
        _check_mgmt_subnet(self.name)
        self.lab = Lab.up(self.name, self.hosts, self.nics, self.leaves, self.spines)
        return self.lab.inventory()

    def inject(self, injections: list[Injection]) -> None:
        """The hidden faults, each on its own random fabric link (seeded: the first fault's
        link depends on the seed alone), recorded as truth only."""
        assert self.lab is not None
        free = sorted(lk.id for lk in self.lab.topo.links if lk.tier == "fabric")
        if len(injections) > len(free):
            raise AuditInputError(f"{len(injections)} faults to hide, {len(free)} fabric links")
        rng, fabric = np.random.default_rng(self.seed), len(free)
        for inj in injections:
            link = free.pop(int(rng.integers(len(free))))
            if inj.kind == "loss":
                faults.add_loss(self.lab, link, inj.value)
                self.injected.append({"link": link, "kind": "loss", "value": inj.value,
                                      "unit": "%"})  # fmt: skip
            else:
                (f,) = faults.add_delay(self.lab, link, inj.value)
                self.injected.append({"link": link, "kind": "delay", "value": inj.value,
                                      "unit": "us", "measured_us": f.measured_us})  # fmt: skip
            self.say(f"hid a {inj.kind} fault on one of {fabric} fabric links")

    def start(self) -> str:
        """Collector and one agent per host (with injected clock errors); the collector URL."""
        assert self.lab is not None
        self.workdir = Path(tempfile.mkdtemp(prefix=f"fleetlens-audit-{self.name}-"))
        self.stack = Stack(
            self.lab, self.workdir, collector_args=["--background-loss", str(self.background_loss)]
        )
        self.stack.start_collector()
        self.clocks = self.stack.start_skewed_agents(np.random.default_rng(self.seed + 1))
        self.say(f"collector {self.stack.url}; {len(self.lab.topo.hosts)} agents started")
        return self.stack.url

    def clock_errors(self, clocks: list[dict], now_ns: int) -> dict[str, float]:
        """Served model minus injected truth per host, common mode removed (fleet time is the
        fleet's mean, not real time)."""
        err = {}
        for c in clocks:
            e = self.clocks.error_ns(
                c["host_id"], now_ns, c["offset_ns"], c["drift_ppb"], c["t0_ns"]
            )
            if e is not None:
                err[c["host_id"]] = e
        common = float(np.mean(list(err.values()))) if err else 0.0
        return {h: round(e - common, 1) for h, e in err.items()}

    def stop_stack(self) -> Path | None:
        """Stop agents (they flush their last windows) then the collector; its DuckDB file."""
        if self.stack is None:
            return None
        self.stack.stop_agents()
        self.stack.stop_collector()
        return self.stack.db

    def close(self, keep_workdir: bool = False) -> None:
        if self.stack is not None:
            self.stack.close()
        if self.lab is not None:
            Lab.down(self.lab.name)
            self.lab = None
        if self.workdir is not None and not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
