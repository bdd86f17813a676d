"""Read side of the REST API: links, NICs, hosts, clocks, pair history, job impact.

Current state (verdicts, clocks, decisions) is served from the collector's memory, which the
loops keep equal to the newest stored rows; history and pair series come from DuckDB through
a per-thread read cursor.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pyarrow.compute as pc
from fleetlens.api.config import MINUTE_NS
from fleetlens.api.models import ClockOut, HostOut, LinkHistoryPoint, LinkOut, NicOut, OwdPoint
from fleetlens.api.service import Collector

from fleetlens.ids import is_nic_id, link_id, split_link_id, split_nic_id
from fleetlens.records import STATES, ClockModel, Verdict

_SEVERITY = {s: i for i, s in enumerate(STATES)}


def worst(states: list[str]) -> str:
    return max(states, key=_SEVERITY.__getitem__, default="healthy")


# ---- links ---------------------------------------------------------------------------------
def link_tier(c: Collector, link: str) -> str:
    if c.topology and link in c.topology.link_by_id:
        return c.topology.link_by_id[link].tier
    a, b = split_link_id(link)
    return "access" if is_nic_id(a) or is_nic_id(b) else "unknown"


def link_out(c: Collector, link: str) -> LinkOut:
    a, b = split_link_id(link)
    v = c.state.verdicts.get(link)
    return LinkOut(
        link_id=link, a=a, b=b, tier=link_tier(c, link),
        state=v.state if v else "healthy", since=v.since_ns if v else None,
        excess_delay_ns=v.excess_delay_ns if v else 0.0, loss_rate=v.loss_rate if v else 0.0,
        confidence=v.confidence if v else 0.0, flows=v.evidence if v else 0,
    )  # fmt: skip


def all_link_ids(c: Collector) -> list[str]:
    ids = {s for s, v in c.state.verdicts.items() if v.kind == "link"}
    if c.topology:
        ids |= set(c.topology.link_by_id)
    return sorted(ids)


def links(
    c: Collector, state: str | None, tier: str | None, limit: int, offset: int
) -> tuple[int, list[LinkOut]]:
    """(total matching, one page), worst first: the operator's question is "which link is
    hurting". Models are built for the page only (fleets have tens of thousands of links)."""
    rows = []
    for lk in all_link_ids(c):
        v = c.state.verdicts.get(lk)
        st = v.state if v else "healthy"
        if (state and st != state) or (tier and link_tier(c, lk) != tier):
            continue
        rows.append((-_SEVERITY[st], -(v.confidence if v else 0.0), lk))
    rows.sort()
    return len(rows), [link_out(c, lk) for *_, lk in rows[offset : offset + limit]]


def link_known(c: Collector, link: str) -> bool:
    return link in c.state.verdicts or bool(c.topology and link in c.topology.link_by_id)


def link_history(
    c: Collector, link: str, since: int, until: int, limit: int, offset: int
) -> list[LinkHistoryPoint]:
    rows = (
        c.store.read()
        .execute(
            """SELECT updated_ns, state, since_ns, excess_delay_ns, loss_rate, confidence, evidence
           FROM verdicts WHERE subject = ? AND updated_ns >= ? AND updated_ns < ?
           ORDER BY updated_ns DESC LIMIT ? OFFSET ?""",
            [link, since, until, limit, offset],
        )
        .fetchall()
    )
    keys = ("updated", "state", "since", "excess_delay_ns", "loss_rate", "confidence", "flows")
    return [LinkHistoryPoint(**dict(zip(keys, r, strict=True))) for r in rows]


# ---- NICs and hosts ------------------------------------------------------------------------
def registered_nics(c: Collector) -> dict[str, tuple[str, str]]:
    rows = c.store.read().execute("SELECT nic_id, ifname, ip FROM nics").fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def nic_verdicts(c: Collector) -> dict[str, list[Verdict]]:
    """Verdicts that concern each NIC: its own, and those of its access links."""
    out: dict[str, list[Verdict]] = {}
    for v in c.state.verdicts.values():
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
    reg = registered_nics(c)
    inv = c.topology.nic_by_id if c.topology else {}
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
        state=r.state, since=b.since_ns if b else None, loss_rate=b.loss_rate if b else 0.0,
        excess_delay_ns=b.excess_delay_ns if b else 0.0,
        reason=f"{b.kind} {b.subject} {b.state}" if b else None,
    )  # fmt: skip


def nics(c: Collector, host: str | None = None) -> list[NicOut]:
    return [nic_out(r) for r in nic_rows(c, host)]


def clock_out(c: Collector, m: ClockModel) -> ClockOut:
    return ClockOut(
        host_id=m.host_id, offset_ns=m.offset_ns, drift_ppb=m.drift_ppb,
        error_bound_ns=m.error_bound_ns, synced=m.synced, t0_ns=m.t0_ns,
        updated=c.state.clock_updated.get(m.host_id),
        delay_evidence_from=c.state.clock_trusted_ns.get(m.host_id),
    )  # fmt: skip


def hosts(c: Collector, state: str | None, limit: int, offset: int) -> tuple[int, list[HostOut]]:
    """(total matching, one page); models only for the page (fleets have 10^4 hosts)."""
    rows = (
        c.store.read()
        .execute("SELECT host_id, registered_ns, agent_version, ts_source FROM hosts")
        .fetchall()
    )
    meta = {r[0]: r[1:] for r in rows}
    by_host = {h: list(g) for h, g in itertools.groupby(nic_rows(c), key=lambda n: n.host_id)}
    listed = []
    for h in sorted(set(c.known_hosts()) | set(meta)):
        st = worst([n.state for n in by_host.get(h, [])])
        if not state or st == state:
            listed.append((h, st))
    out = []
    for h, st in listed[offset : offset + limit]:
        reg, version, ts = meta.get(h, (None, None, None))
        clock = c.state.clocks.get(h)
        out.append(
            HostOut(
                host_id=h, state=st, nics=[nic_out(n) for n in by_host.get(h, [])],
                registered=reg, agent_version=version, ts_source=ts,
                clock=clock_out(c, clock) if clock else None,
            )
        )  # fmt: skip
    return len(listed), out


# ---- one pair's one-way-delay series ---------------------------------------------------------
_OWD_SQL = """
WITH raw AS (
    SELECT $since + (start_ns - $since) // $step * $step AS t, count(*) AS windows,
           sum(sent) AS sent, sum(received) AS received, min(owd_min_ns) AS mn,
           median(owd_p50_ns) AS p50, max(owd_p99_ns) AS p99, max(owd_max_ns) AS mx
    FROM windows
    WHERE src_nic = $src AND dst_nic = $dst AND start_ns >= $raw_lo AND start_ns < $until
    GROUP BY 1),
agg AS (
    SELECT $since + (greatest(minute_ns, $since) - $since) // $step * $step AS t,
           sum(windows) AS windows, sum(sent) AS sent, sum(received) AS received,
           min(owd_min_ns) AS mn, sum(owd_p50_ns * windows) / sum(windows) AS p50,
           max(owd_p99_ns) AS p99, max(owd_max_ns) AS mx
    FROM windows_minute
    WHERE src_nic = $src AND dst_nic = $dst AND minute_ns >= $min_lo AND minute_ns < $split
      -- a minute that raw rows also cover (split inside it) is read from raw only
      AND (minute_ns + $minute <= $split OR $split >= $until)
    GROUP BY 1)
SELECT t, sum(windows)::BIGINT, sum(sent)::BIGINT, sum(received)::BIGINT, min(mn),
       sum(p50 * windows) / sum(windows), max(p99), max(mx)
FROM (SELECT * FROM raw UNION ALL SELECT * FROM agg)
GROUP BY t ORDER BY t
"""


def pair_owd(c: Collector, src: str, dst: str, since: int, until: int, step: int) -> list[OwdPoint]:
    """Minutes come from windows_minute, the rest from raw windows, split at a minute boundary
    both tables cover: the rollup watermark when buckets are whole minutes from a minute
    boundary (exact; a long history then reads ~60x fewer rows), else the oldest raw minute."""
    store = c.store
    aligned = since % MINUTE_NS == 0 and step % MINUTE_NS == 0
    split = min(max(store.watermark_ns if aligned else store.raw_floor_ns, since), until)
    params = {
        "src": src, "dst": dst, "since": since, "until": until, "step": step,
        "raw_lo": split, "split": split, "min_lo": since // MINUTE_NS * MINUTE_NS,
        "minute": MINUTE_NS,
    }  # fmt: skip
    rows = store.read().execute(_OWD_SQL, params).fetchall()
    return [
        OwdPoint(
            t=t, windows=w, sent=s, received=r,
            loss_rate=(s - r) / s if s else None,
            owd_min_ns=mn, owd_p50_ns=p50, owd_p99_ns=p99, owd_max_ns=mx,
        )
        for t, w, s, r, mn, p50, p99, mx in rows
    ]  # fmt: skip


# ---- jobs ------------------------------------------------------------------------------------
def job_links(c: Collector, job_nics: list[str]) -> set[str]:
    """Links the job's traffic can cross: every ECMP path between its NICs' leaves (from the
    inventory) plus every link on the recently observed paths between its NICs."""
    out: set[str] = set()
    topo = c.topology
    if topo:
        inv = [topo.nic_by_id[n] for n in job_nics if n in topo.nic_by_id]
        for n in inv:
            out |= {link_id(n.id, n.leaf), link_id(n.leaf, n.id)}
        leaves = sorted({n.leaf for n in inv})
        for la, lb in itertools.permutations(leaves, 2):
            for sw in topo.switch_paths(la, lb):
                out |= {link_id(a, b) for a, b in itertools.pairwise(sw)}
    if job_nics and c.state.max_start_ns is not None:
        lo = c.state.max_start_ns - 300_000_000_000
        seen = c.store.read_windows(
            "start_ns >= ? AND list_contains(?, src_nic) AND list_contains(?, dst_nic)",
            [lo, job_nics, job_nics],
        )
        out |= set(pc.unique(seen["path"].combine_chunks().flatten()).to_pylist())
    return out
