"""What the read API serves from the collector's state: the current verdicts, clock models and
drain decisions, the inventory's names, a host's probe plan and a job's impact.

Current outputs are the published ones (``publish.py``: equal to the newest stored rows). The
published maps are replaced, never mutated, so a caller may iterate a map it was handed while
a loop publishes the next one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleetlens.api.clockgate import ClockGate
from fleetlens.api.config import Settings
from fleetlens.api.known import KnownNics
from fleetlens.api.publish import Published
from fleetlens.api.store import Store
from fleetlens.triangulate import JobImpact, job_impact

from fleetlens.ids import split_nic_id
from fleetlens.plan import host_plan, peer_pairs
from fleetlens.records import ClockModel, Decision, HostPlan, Verdict
from fleetlens.ties import plan_groups
from fleetlens.topology import Link, Nic, Topology

JOB_PATHS_NS = 300_000_000_000  # a job's observed paths: those of the last 5 minutes


@dataclass(frozen=True)
class Served:
    """``newest_start``: the start of the newest stored window (None: none yet)."""

    settings: Settings
    topology: Topology | None
    store: Store
    known: KnownNics
    published: Published
    clock_gate: ClockGate
    newest_start: Callable[[], int | None]

    # ---- current outputs -------------------------------------------------------------------
    def verdicts(self) -> Mapping[str, Verdict]:
        """The current verdicts by subject."""
        return self.published.verdicts

    def clocks(self) -> Mapping[str, ClockModel]:
        """The current clock models by host."""
        return self.published.clocks

    def clock_updated_ns(self, host: str) -> int | None:
        """When the host's current clock model was last stored."""
        return self.published.clock_updated.get(host)

    def delay_evidence_from_ns(self, host: str) -> int | None:
        """From when the host's one-way delays count as triangulation evidence (None: not yet)."""
        return self.clock_gate.trusted_from_ns.get(host)

    def decision(self, host: str) -> Decision:
        """The host's current decision (nothing to drain when none was made yet)."""
        return self.published.decisions.get(host) or Decision(host, time.time_ns(), [])

    def raw_floor_ns(self) -> int:
        """Every window that started at or after this is still stored raw (per flow)."""
        return self.store.raw_floor_ns

    # ---- the inventory ---------------------------------------------------------------------
    def has_inventory(self) -> bool:
        return self.topology is not None

    def in_inventory(self, host: str) -> bool:
        """Whether the inventory names NICs of ``host``."""
        return self.topology is not None and bool(self.topology.nics_by_host.get(host))

    def inventory_links(self) -> Mapping[str, Link]:
        """The inventory's directed links by id (none without an inventory)."""
        return self.topology.link_by_id if self.topology is not None else {}

    def inventory_nics(self) -> Mapping[str, Nic]:
        """The inventory's NICs by id (none without an inventory)."""
        return self.topology.nic_by_id if self.topology is not None else {}

    def interfaces(self) -> dict[str, str]:
        """Switch interface address -> the directed link arriving there (empty without an
        inventory)."""
        return dict(self.topology.interfaces) if self.topology is not None else {}

    # ---- derived -----------------------------------------------------------------------------
    def plan(self, host: str) -> HostPlan:
        """The host's probe plan with its current clock model (needs the inventory)."""
        if self.topology is None:
            raise LookupError("no inventory loaded")
        s, clock = self.settings, self.published.clocks.get(host)
        return host_plan(self.topology, host, s.plan_peers, s.plan_seed, clock)

    def unidentifiable(self) -> list[list[str]] | None:
        """Ambiguity groups of the probe plan (links no fit can tell apart, reported
        together); empty without an inventory, None when the plan is too big to enumerate."""
        if self.topology is None:
            return []
        s = self.settings
        return plan_groups(self.topology, *peer_pairs(self.topology, s.plan_peers, s.plan_seed))

    def job_impact(self, name: str) -> JobImpact | None:
        """What the job's traffic crosses and which of it is bad (None: no such job)."""
        hosts = self.store.job_hosts(name)
        if hosts is None:
            return None
        nics = [n for n in self.known.nics().to_pylist() if split_nic_id(n)[0] in set(hosts)]
        observed: set[str] = set()
        newest = self.newest_start()
        if nics and newest is not None:
            observed = self.store.links_on_paths(nics, newest - JOB_PATHS_NS)
        verdicts = list(self.published.verdicts.values())
        return job_impact(verdicts, self.topology, hosts, nics=nics, observed=observed)
