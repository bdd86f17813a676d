"""Read side of the REST API: the collector's state and stored rows as response models.

Current state (verdicts, clocks, decisions) is served from the collector's published state,
which equals the newest stored rows; history and pair series come from the store. Lists are
filtered and ordered on light rows and built into models for the requested page only (fleets
have tens of thousands of links and NICs).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from fleetlens.api.models import (
    ClockOut,
    HostOut,
    ImpactOut,
    LinkHistoryPoint,
    LinkOut,
    NicOut,
    OwdPoint,
    as_state,
)
from fleetlens.api.service import Collector
from fleetlens.triangulate import JobImpact

from fleetlens.ids import is_nic_id, split_link_id, split_nic_id
from fleetlens.records import STATES, ClockModel, Verdict

_SEVERITY = {s: i for i, s in enumerate(STATES)}


def worst(states: list[str]) -> str:
    return max(states, key=_SEVERITY.__getitem__, default="healthy")


# ---- links ---------------------------------------------------------------------------------
def link_tier(c: Collector, link: str) -> str:
    inventory = c.served.inventory_links().get(link)
    if inventory is not None:
        return inventory.tier
    a, b = split_link_id(link)
    return "access" if is_nic_id(a) or is_nic_id(b) else "unknown"


def link_out(c: Collector, link: str) -> LinkOut:
    a, b = split_link_id(link)
    v = c.served.verdicts().get(link)
    return LinkOut(
        link_id=link, a=a, b=b, tier=link_tier(c, link),
        state=as_state(v.state) if v else "healthy", since=v.since_ns if v else None,
        excess_delay_ns=v.excess_delay_ns if v else 0.0, loss_rate=v.loss_rate if v else 0.0,
        confidence=v.confidence if v else 0.0, flows=v.evidence if v else 0,
        group_id=v.group_id if v else None, group_size=v.group_size if v else 1,
        group_members=group_members(c, v.group_id) if v and v.group_id else [],
    )  # fmt: skip


def group_members(c: Collector, group: str) -> list[str]:
    """The links of an ambiguity group, from the current verdicts."""
    return sorted(s for s, v in c.served.verdicts().items() if v.group_id == group)


def all_link_ids(c: Collector) -> list[str]:
    ids = {s for s, v in c.served.verdicts().items() if v.kind == "link"}
    return sorted(ids | set(c.served.inventory_links()))


def links(
    c: Collector, state: str | None, tier: str | None, limit: int, offset: int
) -> tuple[int, list[LinkOut]]:
    """(total matching, one page), worst first: the operator's question is "which link is
    hurting". Models are built for the page only (fleets have tens of thousands of links)."""
    rows = []
    verdicts = c.served.verdicts()
    for lk in all_link_ids(c):
        v = verdicts.get(lk)
        st = v.state if v else "healthy"
        if (state and st != state) or (tier and link_tier(c, lk) != tier):
            continue
        rows.append((-_SEVERITY[st], -(v.confidence if v else 0.0), lk))
    rows.sort()
    return len(rows), [link_out(c, lk) for *_, lk in rows[offset : offset + limit]]


def link_known(c: Collector, link: str) -> bool:
    return link in c.served.verdicts() or link in c.served.inventory_links()


def link_history(
    c: Collector, link: str, since: int, until: int, limit: int, offset: int
) -> list[LinkHistoryPoint]:
    rows = c.store.link_history(link, since, until, limit, offset)
    return [
        LinkHistoryPoint(
            updated=updated, state=as_state(state), since=since_ns, excess_delay_ns=delay,
            loss_rate=loss, confidence=confidence, flows=flows,
        )
        for updated, state, since_ns, delay, loss, confidence, flows in rows
    ]  # fmt: skip


# ---- NICs and hosts ------------------------------------------------------------------------
def nic_verdicts(c: Collector) -> dict[str, list[Verdict]]:
    """Verdicts that concern each NIC: its own, and those of its access links."""
    out: dict[str, list[Verdict]] = {}
    for v in c.served.verdicts().values():
        if v.kind == "nic":
            out.setdefault(v.subject, []).append(v)
        elif v.kind == "link":
            for end in split_link_id(v.subject):
                if is_nic_id(end):
                    out.setdefault(end, []).append(v)
    return out


@dataclass(frozen=True)
class NicRow:
    """A NIC before it becomes a response model: lists filter and page on these."""

    nic_id: str
    host_id: str
    ifname: str
    ip: str | None
    leaf: str | None
    bad: Verdict | None  # the worst non-healthy verdict concerning it

    @property
    def state(self) -> str:
        return self.bad.state if self.bad else "healthy"


def nic_rows(c: Collector, host: str | None = None) -> list[NicRow]:
    reg = c.store.registered_nics()
    inv = c.served.inventory_nics()
    concern = nic_verdicts(c)
    out = []
    for nic in sorted(set(reg) | set(inv)):
        h, ifname = split_nic_id(nic)
        if host and h != host:
            continue
        vs = [v for v in concern.get(nic, []) if v.state != "healthy"]
        bad = max(vs, key=lambda v: (_SEVERITY[v.state], v.loss_rate), default=None)
        ip = reg[nic][1] if nic in reg else inv[nic].ip
        out.append(NicRow(nic, h, ifname, ip, inv[nic].leaf if nic in inv else None, bad))
    return out


def nic_out(r: NicRow) -> NicOut:
    b = r.bad
    return NicOut(
        nic_id=r.nic_id, host_id=r.host_id, ifname=r.ifname, ip=r.ip, leaf=r.leaf,
        state=as_state(r.state), since=b.since_ns if b else None,
        loss_rate=b.loss_rate if b else 0.0,
        excess_delay_ns=b.excess_delay_ns if b else 0.0,
        reason=f"{b.kind} {b.subject} {b.state}" if b else None,
    )  # fmt: skip


def nics(c: Collector, host: str | None = None) -> list[NicOut]:
    return [nic_out(r) for r in nic_rows(c, host)]


def clock_out(c: Collector, m: ClockModel) -> ClockOut:
    return ClockOut(
        host_id=m.host_id, offset_ns=m.offset_ns, drift_ppb=m.drift_ppb,
        error_bound_ns=m.error_bound_ns, synced=m.synced, t0_ns=m.t0_ns,
        updated=c.served.clock_updated_ns(m.host_id),
        delay_evidence_from=c.served.delay_evidence_from_ns(m.host_id),
    )  # fmt: skip


def hosts(c: Collector, state: str | None, limit: int, offset: int) -> tuple[int, list[HostOut]]:
    """(total matching, one page); models only for the page (fleets have 10^4 hosts)."""
    meta = c.store.registered_hosts()
    by_host = {h: list(g) for h, g in itertools.groupby(nic_rows(c), key=lambda n: n.host_id)}
    listed = []
    for h in sorted(set(c.known_hosts()) | set(meta)):
        st = worst([n.state for n in by_host.get(h, [])])
        if not state or st == state:
            listed.append((h, st))
    out = []
    for h, st in listed[offset : offset + limit]:
        reg, version, ts = meta.get(h, (None, None, None))
        clock = c.served.clocks().get(h)
        out.append(
            HostOut(
                host_id=h, state=as_state(st), nics=[nic_out(n) for n in by_host.get(h, [])],
                registered=reg, agent_version=version, ts_source=ts,
                clock=clock_out(c, clock) if clock else None,
            )
        )  # fmt: skip
    return len(listed), out


# ---- one pair's one-way-delay series ---------------------------------------------------------
def pair_owd(c: Collector, src: str, dst: str, since: int, until: int, step: int) -> list[OwdPoint]:
    rows = c.store.pair_series(src, dst, since, until, step)
    return [
        OwdPoint(
            t=t, windows=w, sent=s, received=r,
            loss_rate=(s - r) / s if s else None,
            owd_min_ns=mn, owd_p50_ns=p50, owd_p99_ns=p99, owd_max_ns=mx,
        )
        for t, w, s, r, mn, p50, p99, mx in rows
    ]  # fmt: skip


# ---- jobs ------------------------------------------------------------------------------------
def impact_out(c: Collector, name: str, hosts: Iterable[str], imp: JobImpact) -> ImpactOut:
    """The bad links the job crosses, and the job's NICs that are not healthy."""
    job_nics = [n for h in hosts for n in nics(c, h)]
    return ImpactOut(
        name=name, hosts=list(hosts), links_crossed=len(imp.crossed),
        bad_links=[link_out(c, v.subject) for v in sorted(imp.links, key=lambda v: v.subject)],
        bad_nics=[n for n in job_nics if n.state != "healthy"],
    )  # fmt: skip
