"""From verdicts to actions: per-host drain decisions for LinkPass, and a job's impact.

A NIC's traffic crosses its own access links, its leaf, and — through ECMP — every fabric link
going up from its leaf or coming down to it (in a fat-tree, the pod's aggregation and core
links too). A NIC is drained when it is faulty itself (or its host), when one of its access
links or its leaf is faulty, or when a faulty fabric link / switch lies on those paths. A host
never drains all its NICs: with nothing healthy left, the least affected ones stay up.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cache

from fleetlens.ids import split_link_id
from fleetlens.records import Decision, DrainEntry, Verdict
from fleetlens.topology import Topology

# severity of a reason to drain; when a host would lose every NIC, the mildest stay up
_SEVERITY = {"nic": 4, "host": 4, "access": 3, "leaf": 3, "fabric": 1, "switch": 1}


def _reach(topo: Topology):
    """Per leaf: the switch-to-switch links on some ECMP path up from it or down to it."""
    tier = {s.id: s.tier for s in topo.switches}
    up: dict[str, list[str]] = {}
    for lk in topo.links:
        if lk.a in tier and lk.b in tier and tier[lk.b] > tier[lk.a]:
            up.setdefault(lk.a, []).append(lk.b)

    @cache
    def links_above(sw: str) -> frozenset[str]:
        out: set[str] = set()
        for nxt in up.get(sw, []):
            out |= {f"{sw}->{nxt}", f"{nxt}->{sw}"} | links_above(nxt)
        return frozenset(out)

    @cache
    def switches_above(sw: str) -> frozenset[str]:
        out = {sw}
        for nxt in up.get(sw, []):
            out |= switches_above(nxt)
        return frozenset(out)

    return links_above, switches_above


def _nic_exposure(topo: Topology, bad: list[Verdict]) -> dict[str, tuple[Verdict, str]]:
    """NIC id -> (the verdict that makes it drain, severity class)."""
    links_above, switches_above = _reach(topo)
    out: dict[str, tuple[Verdict, str]] = {}

    def put(nic: str, v: Verdict, why: str) -> None:
        old = out.get(nic)
        if old is None or _SEVERITY[why] > _SEVERITY[old[1]]:
            out[nic] = (v, why)

    for nic in topo.nics:
        for v in bad:
            if v.kind == "nic" and v.subject == nic.id:
                put(nic.id, v, "nic")
            elif v.kind == "host" and v.subject == nic.host:
                put(nic.id, v, "host")
            elif v.kind == "switch" and v.subject == nic.leaf:
                put(nic.id, v, "leaf")
            elif v.kind == "switch" and v.subject in switches_above(nic.leaf):
                put(nic.id, v, "switch")
            elif v.kind == "link" and nic.id in _ends(v.subject):
                put(nic.id, v, "access")
            elif v.kind == "link" and v.subject in links_above(nic.leaf):
                put(nic.id, v, "fabric")
    return out


def _ends(link: str) -> tuple[str, ...]:
    try:
        return split_link_id(link)
    except ValueError:
        return ()


def decisions(verdicts: list[Verdict], topology: Topology, now_ns: int) -> list[Decision]:
    """One Decision per host of the topology (empty drain lists included)."""
    bad = [v for v in verdicts if v.state == "faulty"]
    exposure = _nic_exposure(topology, bad)
    out = []
    for host, nics in topology.nics_by_host.items():
        hit = [(n.id, *exposure[n.id]) for n in nics if n.id in exposure]
        if nics and len(hit) == len(nics):
            worst = max(_SEVERITY[w] for _, _, w in hit)
            mildest = min(_SEVERITY[w] for _, _, w in hit)
            # keep the mildest NICs up; if all are equally bad, drain nothing
            hit = [h for h in hit if _SEVERITY[h[2]] > mildest] if worst > mildest else []
        drain = [
            DrainEntry(nic, f"{why}: {v.kind} {v.subject} {_describe(v)}", v.since_ns)
            for nic, v, why in sorted(hit)
        ]
        out.append(Decision(host, now_ns, drain))
    return out


def _describe(v: Verdict) -> str:
    parts = []
    if v.loss_rate > 0:
        parts.append(f"loss {v.loss_rate:.2%}")
    if v.excess_delay_ns > 0:
        parts.append(f"+{v.excess_delay_ns / 1e3:.1f} us")
    return f"faulty ({', '.join(parts) or 'no data'}; {v.evidence} flows)"


@dataclass
class JobImpact:
    hosts: list[str]
    links: list[Verdict] = field(default_factory=list)  # bad links the job's traffic crosses
    switches: list[Verdict] = field(default_factory=list)
    nics: list[Verdict] = field(default_factory=list)  # bad NICs / hosts of the job
    unknown_hosts: list[str] = field(default_factory=list)

    @property
    def impacted(self) -> bool:
        return bool(self.links or self.switches or self.nics)


def job_impact(
    verdicts: list[Verdict], topology: Topology, hosts: list[str], states=("faulty", "suspect")
) -> JobImpact:
    """Bad links, switches and NICs on the paths between the job's hosts."""
    known = [h for h in hosts if h in topology.nics_by_host]
    imp = JobImpact(known, unknown_hosts=[h for h in hosts if h not in topology.nics_by_host])
    nics = [n for h in known for n in topology.nics_by_host[h]]
    nic_ids = {n.id for n in nics}
    leaves = sorted({n.leaf for n in nics})
    on_path: set[str] = set()
    switches: set[str] = set(leaves)
    for a in leaves:
        for b in leaves:
            for p in topology.switch_paths(a, b) if a != b else []:
                switches |= set(p)
                on_path |= {f"{u}->{v}" for u, v in itertools.pairwise(p)}
    for v in verdicts:
        if v.state not in states:
            continue
        if v.kind == "link" and (v.subject in on_path or set(_ends(v.subject)) & nic_ids):
            imp.links.append(v)
        elif v.kind == "switch" and v.subject in switches:
            imp.switches.append(v)
        elif (v.kind == "nic" and v.subject in nic_ids) or (
            v.kind == "host" and v.subject in known
        ):
            imp.nics.append(v)
    return imp
