"""The audit's report as a dict (``report.json``): every link, NIC and host with its status,
reasons and evidence, from the judgement or, without per-flow data, the collector's verdict
history alone. Links the collector reports as one ambiguity group (the probes cannot tell
them apart) carry the group's id and size, and the groups are listed together.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from fleetlens.audit.data import RestEvidence

if TYPE_CHECKING:  # scipy loads only when an audit judges
    from fleetlens.audit.data import Flows
    from fleetlens.audit.judge import Judgement
    from fleetlens.audit.options import Thresholds

LIVE_HISTORY = 120  # verdict-history rows kept per link in report.json


def _live_stats(history: list[dict]) -> dict:
    faulty = [h for h in history if h["state"] == "faulty"]
    return {
        "live_faulty_rounds": len(faulty),
        "live_suspect_rounds": sum(h["state"] == "suspect" for h in history),
        "live_max_loss": max((h["loss_rate"] for h in history), default=0.0),
        "live_max_excess_delay_ns": max((h["excess_delay_ns"] for h in history), default=0.0),
    }


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat(timespec="seconds")


def build_report(
    *, source: str, since_ns: int, until_ns: int, warmup_s: float, th: Thresholds,
    rest: RestEvidence, verdict: Judgement | None, live_fraction: float,
    flows: Flows | None = None, stalls: list[dict] | None = None,
    clock_truth: dict[str, float] | None = None, lab: dict | None = None,
    flows_source: str = "collector database",
) -> dict:  # fmt: skip
    seconds = (until_ns - since_ns) / 1e9
    live_state = {r["link_id"]: r["state"] for r in rest.links}
    live = {r["link_id"]: r for r in rest.links}
    if verdict is not None:
        method = f"tomography over per-flow totals of the whole period ({flows_source})"
        if stalls is None:  # /v1/flows has totals only: no host-second to tell a stall by
            method += "; host stalls not detected"
        links = [asdict(lj) for lj in verdict.links]
        nics = [asdict(nj) for nj in verdict.nics]
    else:
        method = (
            "collector verdict history (no per-flow data: the collector has no inventory "
            "and none was given, or it predates GET /v1/flows)"
        )
        links, nics = _live_only(rest, seconds, live_fraction)
    for lk in links:
        hist = rest.history.get(lk["link_id"], [])
        lk.update(_live_stats(hist))
        lk["live_state_at_end"] = live_state.get(lk["link_id"])
        row = live.get(lk["link_id"], {})
        lk["live_group_id"], lk["live_group_size"] = row.get("group_id"), row.get("group_size", 1)
        lk["live_history"] = hist[:LIVE_HISTORY]  # newest first, as the collector serves it
    nic_state = {n["nic_id"]: n["state"] for n in rest.nics}
    for n in nics:
        n["live_state"] = nic_state.get(n["nic_id"])
    hosts = _hosts(rest, nics, clock_truth)
    _host_warnings(hosts, verdict, stalls or [])
    failed_links = [lk["link_id"] for lk in links if lk["status"] == "failed"]
    failed_nics = [n["nic_id"] for n in nics if n["status"] == "failed"]
    warned = [h["host_id"] for h in hosts if h["warnings"]]
    unobserved = [lk["link_id"] for lk in links if lk["status"] == "unobserved"]
    ok = not (failed_links or failed_nics or unobserved)
    groups = ambiguity_groups(rest.links)
    summary = (
        f"{len(links) - len(failed_links) - len(unobserved)} of {len(links)} links and "
        f"{len(nics) - len(failed_nics)} of {len(nics)} NICs validated; "
        f"failed links: {', '.join(failed_links) or 'none'}; "
        f"failed NICs: {', '.join(failed_nics) or 'none'}; "
        f"hosts with warnings: {', '.join(warned) or 'none'}"
        + (f"; unobserved links: {', '.join(unobserved)}" if unobserved else "")
        + (
            "; links reported as one group (the probes cannot tell them apart): "
            + "; ".join(f"{g['group_id']} = {', '.join(g['links'])}" for g in groups)
            if groups
            else ""
        )
    )
    return {
        "result": "pass" if ok else "fail",
        "summary": summary,
        "source": source,
        "method": method,
        "period": {
            "start_ns": since_ns,
            "end_ns": until_ns,
            "seconds": seconds,
            "start_iso": _iso(since_ns),
            "end_iso": _iso(until_ns),
            "warmup_s": warmup_s,
        },
        "thresholds": asdict(th),
        "failed_links": failed_links,
        "failed_nics": failed_nics,
        "hosts_with_warnings": warned,
        "unobserved_links": unobserved,
        "ambiguity_groups": groups,
        "flows": (
            {
                "count": verdict.flows,
                "known_path": verdict.flows_known_path,
                "dropped": verdict.dropped,
            }
            if verdict
            else None
        ),
        "links": links,
        "nics": nics,
        "hosts": hosts,
        "host_pairs": verdict.pair_excess if verdict else _host_pairs(rest),
        "pairs": flows.pairs() if flows is not None else rest.pairs,
        "host_stalls": stalls or [],
        "lab": lab,
    }


def ambiguity_groups(links: list[dict]) -> list[dict]:
    """The collector's ambiguity groups at the end of the period (``/v1/links`` rows): id,
    size, member links and their states."""
    by: dict[str, list[dict]] = {}
    for r in links:
        if r.get("group_id"):
            by.setdefault(r["group_id"], []).append(r)
    return [
        {
            "group_id": g, "size": max(r.get("group_size", 1) for r in rows),
            "links": sorted(r["link_id"] for r in rows),
            "states": {r["link_id"]: r["state"] for r in rows},
        }
        for g, rows in sorted(by.items())
    ]  # fmt: skip


def _host_warnings(hosts: list[dict], verdict: Judgement | None, stalls: list[dict]) -> None:
    """Host-side trouble that is not the fabric: loss the fit put on the host itself, and
    stalls (seconds its probes were lost to/from nearly every peer at once)."""
    by = {h["host_id"]: h for h in hosts}
    for h in hosts:
        h["host_side_loss"] = (verdict.host_loss.get(h["host_id"]) if verdict else None) or {}
        h["stalls"] = []
        h["warnings"] = [h["clock_warning"]] if h.get("clock_warning") else []
        h["warnings"] += [
            f"host-side {side} probe loss {100 * r:.3g} % (the host or its agent, not a link)"
            for side, r in h["host_side_loss"].items()
            if r > 0
        ]
    for st in stalls:
        stalled = by.get(st["host_id"])
        if stalled is None:
            continue
        stalled["stalls"].append(st)
        what = "left out" if st["excluded"] else "kept: too many to be load artefacts"
        stalled["warnings"].append(
            f"{st['side']} stalls in {st['seconds']} of {st['of_seconds']} s "
            f"(worst {100 * st['worst_loss']:.3g} % of probes lost; {what})"
        )


def _hosts(rest: RestEvidence, nics: list[dict], truth: dict[str, float] | None) -> list[dict]:
    clocks = {c["host_id"]: c for c in rest.clocks}
    names = sorted({n["nic_id"].split("/")[0] for n in nics} | set(clocks))
    out = []
    for h in names:
        c = clocks.get(h, {})
        # Clock trouble is reported, not failed: the audit's delay judgement compares paths of
        # the same NIC pair and does not depend on the clocks.
        out.append({
            "host_id": h, "status": "validated", "reasons": [],
            "clock_warning": None if c.get("synced") else "clock not synced at the end",
            "clock": c, "clock_error_vs_truth_ns": (truth or {}).get(h),
        })  # fmt: skip
    return out


def _host_pairs(rest: RestEvidence) -> list[dict]:
    by: dict[tuple[str, str], list[float]] = {}
    for p in rest.pairs:
        if p.get("owd_p50_ns") is not None:
            key = (p["src_nic"].split("/")[0], p["dst_nic"].split("/")[0])
            by.setdefault(key, []).append(p["owd_p50_ns"])
    return [
        {"src_host": s, "dst_host": d, "owd_median_ns": sorted(v)[len(v) // 2],
         "max_path_excess_ns": None}
        for (s, d), v in sorted(by.items())
    ]  # fmt: skip


def _live_only(rest: RestEvidence, seconds: float, frac: float) -> tuple[list, list]:
    """Without per-flow data: a link fails when the collector called it faulty for at least
    ``frac`` of the period's rounds (1 s each); NICs by their pairs' loss and live state."""
    links = []
    for r in rest.links:
        st = _live_stats(rest.history.get(r["link_id"], []))
        bad = st["live_faulty_rounds"] >= frac * seconds
        links.append({
            "link_id": r["link_id"], "tier": r["tier"],
            "status": "failed" if bad else "validated",
            "reasons": [f"collector: faulty in {st['live_faulty_rounds']} rounds of "
                        f"~{seconds:.0f}"] if bad else [],
            "flows": r["flows"], "probes": 0.0, "lost": 0.0, "loss_rate": st["live_max_loss"],
            "loss_upper": st["live_max_loss"], "loss_llr": 0.0, "delay_flows": 0,
            "excess_delay_ns": st["live_max_excess_delay_ns"],
        })  # fmt: skip
    sent: dict[str, list[float]] = {}
    for p in rest.pairs:
        for nic, k in ((p["src_nic"], 0), (p["dst_nic"], 2)):
            acc = sent.setdefault(nic, [0.0, 0.0, 0.0, 0.0])
            acc[k] += p["sent"]
            acc[k + 1] += p["sent"] - p["received"]
    nics = []
    for r in rest.nics:
        so, lo, si, li = sent.get(r["nic_id"], [0.0, 0.0, 0.0, 0.0])
        reasons = [f"collector: {r['reason']}"] if r["state"] == "faulty" else []
        if so == 0 or si == 0 or lo >= 0.5 * so or li >= 0.5 * si:
            reasons.append(f"silent or unreachable (sent {so:.0f}, lost {lo:.0f}; "
                           f"probed {si:.0f}, lost {li:.0f})")  # fmt: skip
        nics.append({
            "nic_id": r["nic_id"], "status": "failed" if reasons else "validated",
            "reasons": reasons, "flows_out": 0, "flows_in": 0, "sent_out": so, "lost_out": lo,
            "sent_in": si, "lost_in": li,
        })  # fmt: skip
    return links, nics
