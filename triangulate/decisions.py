"""From verdicts to actions: per-host drain decisions for LinkPass, and a job's impact.

A NIC's traffic crosses its own access links, its leaf, and — through ECMP — every fabric link
going up from its leaf or coming down to it (in a fat-tree, the pod's aggregation and core
links too). A NIC is drained when it is faulty itself (or its host), when one of its access
links or its leaf is faulty, or when a faulty fabric link / switch lies on those paths. A host
never drains all its NICs: with nothing healthy left, the least affected ones stay up.

Ambiguity groups (links the probes cannot tell apart, ``identify``): when one member is
faulty, every member that is not healthy counts as faulty, so a decision names every NIC the
group could affect (whichever member it is), and each reason names the group.

Without a topology (a collector with no inventory) NICs are known only by id and links only
from the paths agents report: :func:`decisions_by_nic` drains a NIC for its own verdict or a
faulty link with the NIC at one end, and never every known NIC of a host.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache

from fleetlens.ids import is_nic_id, link_id, split_link_id, split_nic_id
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


def drain_worthy(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """The faulty verdicts, and every non-healthy member of a group with a faulty member."""
    vs = list(verdicts)
    groups = {v.group_id for v in vs if v.state == "faulty" and v.group_id is not None}
    return [
        v for v in vs
        if v.state == "faulty" or (v.state != "healthy" and v.group_id in groups)
    ]  # fmt: skip


def decisions(verdicts: list[Verdict], topology: Topology, now_ns: int) -> list[Decision]:
    """One Decision per host of the topology (empty drain lists included)."""
    bad = drain_worthy(verdicts)
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


def decisions_by_nic(verdicts: list[Verdict], nics: Iterable[str], now_ns: int) -> list[Decision]:
    """One Decision per host of the known ``nics`` (and per host of a drained NIC), for a
    collector without a topology."""
    per_host = Counter(split_nic_id(n)[0] for n in nics)
    drain: dict[str, dict[str, DrainEntry]] = {h: {} for h in sorted(per_host)}
    for v in drain_worthy(verdicts):
        reason = f"{v.kind} {v.subject} faulty (loss {v.loss_rate:.1%}, evidence {v.evidence}"
        reason += f"{_group(v)})"
        for nic in _nics_of(v):
            entries = drain.setdefault(split_nic_id(nic)[0], {})
            entries.setdefault(nic, DrainEntry(nic, reason, v.since_ns))
    out = []
    for host, entries in drain.items():
        drained = sorted(entries.values(), key=lambda e: e.nic_id)
        if 0 < per_host[host] <= len(drained):  # nothing healthy left to fail over to
            drained = []
        out.append(Decision(host, now_ns, drained))
    return out


def _nics_of(v: Verdict) -> list[str]:
    """The NICs a verdict names: a NIC's own, or the NIC ends of a link."""
    if v.kind == "nic":
        return [v.subject]
    if v.kind == "link":
        return [n for n in _ends(v.subject) if is_nic_id(n)]
    return []


def _describe(v: Verdict) -> str:
    parts = []
    if v.loss_rate > 0:
        parts.append(f"loss {v.loss_rate:.2%}")
    if v.excess_delay_ns > 0:
        parts.append(f"+{v.excess_delay_ns / 1e3:.1f} us")
    return f"faulty ({', '.join(parts) or 'no data'}; {v.evidence} flows{_group(v)})"


def _group(v: Verdict) -> str:
    if v.group_id is None or v.group_size < 2:
        return ""
    return f"; one of {v.group_size} links the probes cannot tell apart, group {v.group_id}"


@dataclass
class JobImpact:
    hosts: list[str]
    links: list[Verdict] = field(default_factory=list)  # bad links the job's traffic crosses
    switches: list[Verdict] = field(default_factory=list)
    nics: list[Verdict] = field(default_factory=list)  # bad NICs / hosts of the job
    unknown_hosts: list[str] = field(default_factory=list)
    crossed: set[str] = field(default_factory=set)  # every link the job's traffic can cross

    @property
    def impacted(self) -> bool:
        return bool(self.links or self.switches or self.nics)


def job_impact(
    verdicts: list[Verdict],
    topology: Topology | None,
    hosts: list[str],
    states: tuple[str, ...] = ("faulty", "suspect"),
    *,
    nics: Iterable[str] = (),
    observed: Iterable[str] = (),
) -> JobImpact:
    """Bad links, switches and NICs on the paths between the job's hosts.

    The links crossed are the access links of the job's NICs in the topology, every ECMP path
    between their leaves, and the ``observed`` links (those on the job's recently reported
    probe paths); ``nics`` are job NICs known beyond the topology (registered by agents), so
    a collector without an inventory still knows the job's hosts and access links."""
    extra = set(nics)
    in_topo = topology.nics_by_host if topology is not None else {}
    extra_hosts = {split_nic_id(n)[0] for n in extra}
    known = [h for h in hosts if h in in_topo or h in extra_hosts]
    imp = JobImpact(known, unknown_hosts=[h for h in hosts if h not in known])
    topo_nics = [n for h in known for n in in_topo.get(h, [])]
    nic_ids = {n.id for n in topo_nics} | extra
    imp.crossed = set(observed)
    for n in topo_nics:
        imp.crossed |= {link_id(n.id, n.leaf), link_id(n.leaf, n.id)}
    leaves = sorted({n.leaf for n in topo_nics})
    switches: set[str] = set(leaves)
    for a, b in itertools.permutations(leaves, 2):
        for p in topology.switch_paths(a, b) if topology is not None else []:
            switches |= set(p)
            imp.crossed |= {link_id(u, v) for u, v in itertools.pairwise(p)}
    for v in verdicts:
        if v.state not in states:
            continue
        if v.kind == "link" and (v.subject in imp.crossed or set(_ends(v.subject)) & nic_ids):
            imp.links.append(v)
        elif v.kind == "switch" and v.subject in switches:
            imp.switches.append(v)
        elif (v.kind == "nic" and v.subject in nic_ids) or (
            v.kind == "host" and v.subject in known
        ):
            imp.nics.append(v)
    return imp
