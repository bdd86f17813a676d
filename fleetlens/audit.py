"""``fleetlens audit``: pre-handover validation of every fabric link and NIC, with a report.

    fleetlens audit --minutes N --report DIR --collector URL [--token-file F]
                    [--inventory FILE] [--db FILE]
    fleetlens audit --minutes N --report DIR --lab [--inject loss:0.5%|delay:50us] [--seed S]

For N minutes the agents probe every planned NIC pair over every ECMP path (the planner gives
each pair enough source ports to cover its paths); then the audit judges every link and NIC
as validated or failed and writes DIR/report.json and DIR/report.html.

Judgement (see ``audit_judge``): loss and delay tomography over per-flow totals for the whole
period — far more sensitive than the collector's per-window verdicts, which are kept in the
report as evidence. Per-flow totals come from the collector's ``GET /v1/flows`` (from any
machine; the topology from ``--inventory`` or, without it, the inventory the collector
serves). ``--lab`` reads its collector's database after stopping it; on the collector's own
machine ``--db FILE`` reads a copy of its live DuckDB file instead of the REST API, which
also leaves out host stalls (seconds an agent lost probes to or from nearly every peer at
once; the REST totals cannot tell them). Only when the collector has no inventory (and none
is given) or predates /v1/flows does the judgement fall back to its verdict history.

Exit code: 0 pass, 1 fail, 2 usage or infrastructure error (collector unreachable, lab not
buildable, interrupted).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from fleetlens.audit_data import (
    AuditInputError,
    RestEvidence,
    RestReader,
    read_flows,
    snapshot,
    topology_from_rest,
)

if TYPE_CHECKING:  # scipy and matplotlib load only when an audit runs (fast usage errors)
    from fleetlens.audit_data import Flows
    from fleetlens.audit_judge import Judgement, Thresholds
    from fleetlens.topology import Topology

MAX_MINUTES = 24 * 60
LIVE_HISTORY = 120  # verdict-history rows kept per link in report.json
SETTLE_S = 3.0  # after the period: last uploads land and the collector's loops catch up


class UsageError(ValueError):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetlens audit", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--minutes", type=float, required=True,
                   help="audit period in minutes (fractions allowed, e.g. 0.5)")  # fmt: skip
    p.add_argument("--report", type=Path, required=True, help="directory for the report")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--collector", help="URL of a running collector, e.g. http://c:8470")
    where.add_argument("--lab", action="store_true", help="build and audit the lab fabric")
    p.add_argument("--token-file", type=Path,
                   help="read token (default: $FLEETLENS_READ_TOKEN)")  # fmt: skip
    p.add_argument("--db", type=Path,
                   help="the collector's DuckDB file, on its machine (copied): per-flow totals "
                   "from it instead of GET /v1/flows, host stalls left out")  # fmt: skip
    p.add_argument("--inventory", type=Path,
                   help="fleet inventory (default: the one the collector serves)")  # fmt: skip
    g = p.add_argument_group("thresholds")
    g.add_argument("--max-loss", type=float, default=0.2,
                   help="percent loss that fails a link (default %(default)s)")  # fmt: skip
    g.add_argument("--max-delay-us", type=float, default=20.0,
                   help="excess one-way delay failing a link (default %(default)s)")  # fmt: skip
    g.add_argument("--background-loss", type=float, default=1e-4,
                   help="probe loss of the measurement itself (default %(default)s)")  # fmt: skip
    g.add_argument("--warmup", type=float, default=None,
                   help="seconds left out first (default 10 with --lab, else 0)")  # fmt: skip
    g.add_argument("--live-fraction", type=float, default=0.5,
                   help="without per-flow data: share of the period the collector must have "
                   "called a link faulty to fail it (default %(default)s)")  # fmt: skip
    lab = p.add_argument_group("lab (--lab)")
    lab.add_argument("--name", default="audit", help="lab name, <= 6 chars (default %(default)s)")
    lab.add_argument("--hosts", type=int, default=8)
    lab.add_argument("--nics", type=int, default=2)
    lab.add_argument("--leaves", type=int, default=4)
    lab.add_argument("--spines", type=int, default=2)
    lab.add_argument("--inject", help="hide a fault on a random leaf-spine link: "
                     "loss:PCT%% or delay:USus")  # fmt: skip
    lab.add_argument("--seed", type=int, default=1, help="picks the faulted link and clocks")
    lab.add_argument("--keep-workdir", action="store_true",
                     help="keep the collector DB and logs (path in report.json)")  # fmt: skip
    return p


def _validate(a: argparse.Namespace) -> None:
    if not math.isfinite(a.minutes) or not 0 < a.minutes <= MAX_MINUTES:
        raise UsageError(f"--minutes must be > 0 and <= {MAX_MINUTES}, got {a.minutes:g}")
    if not 0 < a.max_loss < 100:
        raise UsageError(f"--max-loss is a percentage in (0, 100), got {a.max_loss:g}")
    if not 0 < a.max_delay_us < 1e6:
        raise UsageError(f"--max-delay-us must be in (0, 1e6), got {a.max_delay_us:g}")
    if not 0 <= a.background_loss < a.max_loss / 100:
        raise UsageError("--background-loss must be >= 0 and below --max-loss")
    if a.warmup is not None and not 0 <= a.warmup <= 600:
        raise UsageError(f"--warmup must be in [0, 600] seconds, got {a.warmup:g}")
    if not 0 < a.live_fraction <= 1:
        raise UsageError(f"--live-fraction must be in (0, 1], got {a.live_fraction:g}")
    if a.collector is not None:
        if not a.collector.startswith(("http://", "https://")):
            raise UsageError(f"--collector wants an http(s):// URL, got {a.collector!r}")
        if a.inject:
            raise UsageError("--inject only works with --lab (it faults the lab fabric)")
    if a.lab:
        from fleetlens.audit_lab import parse_inject

        if a.inject:
            try:
                parse_inject(a.inject)
            except ValueError as e:
                raise UsageError(str(e)) from None
        if len(a.name) > 6 or not a.name.isalnum():
            raise UsageError(f"--name: 1-6 letters/digits, got {a.name!r}")
        if min(a.hosts, a.nics, a.leaves, a.spines) < 1 or a.hosts < 2:
            raise UsageError("--hosts >= 2 and --nics/--leaves/--spines >= 1")
        if a.leaves % a.nics:
            raise UsageError(f"rail wiring needs --leaves ({a.leaves}) divisible by --nics")
        if os.geteuid() != 0:
            raise UsageError("--lab needs root (it builds network namespaces)")
    try:
        a.report.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--report {a.report}: {e.strerror}") from None


def _token(a: argparse.Namespace) -> str | None:
    if a.token_file is not None:
        try:
            return a.token_file.read_text().strip() or None
        except OSError as e:
            raise UsageError(f"--token-file {a.token_file}: {e.strerror}") from None
    return os.environ.get("FLEETLENS_READ_TOKEN") or None


def _say(text: str) -> None:
    print(f"[audit {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _wait(seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    next_note = time.monotonic() + 30
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 1.0))
        if time.monotonic() >= next_note and end - time.monotonic() > 1:
            _say(f"{what}: {end - time.monotonic():.0f} s left")
            next_note += 30


def _probed_pairs(rest: RestReader, nics: list[dict]) -> list[tuple[str, str]]:
    """The NIC pairs the agents probe: every host's plan (readable with the read token)."""
    pairs: set[tuple[str, str]] = set()
    for host in sorted({n["host_id"] for n in nics}):
        try:
            plan = rest.get(f"/v1/plan/{host}")
        except AuditInputError:
            continue  # no inventory on the collector: no plans, no pair list
        for e in plan.get("entries", []) if isinstance(plan, dict) else []:
            pairs.add((e["src_nic"], e["dst_nic"]))
    return sorted(pairs)


# ---- the report ------------------------------------------------------------------------------
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
    summary = (
        f"{len(links) - len(failed_links) - len(unobserved)} of {len(links)} links and "
        f"{len(nics) - len(failed_nics)} of {len(nics)} NICs validated; "
        f"failed links: {', '.join(failed_links) or 'none'}; "
        f"failed NICs: {', '.join(failed_nics) or 'none'}; "
        f"hosts with warnings: {', '.join(warned) or 'none'}"
        + (f"; unobserved links: {', '.join(unobserved)}" if unobserved else "")
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
        h = by.get(st["host_id"])
        if h is None:
            continue
        h["stalls"].append(st)
        what = "left out" if st["excluded"] else "kept: too many to be load artefacts"
        h["warnings"].append(
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


# ---- the two modes ---------------------------------------------------------------------------
def _thresholds(a: argparse.Namespace) -> Thresholds:
    from fleetlens.audit_judge import Thresholds

    return Thresholds(
        max_loss=a.max_loss / 100, max_delay_ns=a.max_delay_us * 1e3,
        background_loss=a.background_loss,
    )  # fmt: skip


def run_collector(a: argparse.Namespace) -> dict:
    rest = RestReader(a.collector, _token(a))
    try:
        rest.check()
        warm = a.warmup or 0.0
        _say(f"collector {a.collector} answers; auditing {a.minutes:g} min")
        _wait(warm, "warm-up")
        since = time.time_ns()
        _wait(a.minutes * 60, "audit")
        until = time.time_ns()
        _wait(SETTLE_S, "settling")
        ev = rest.gather(since, until, [])
        topo = _topology(a, ev)
        flows = stalls = None
        if a.db is not None:
            with tempfile.TemporaryDirectory(prefix="fleetlens-audit-") as tmp:
                flows, stalls = read_flows(snapshot(a.db, Path(tmp)), since, until)
        elif topo is not None:
            _say("reading per-flow totals (GET /v1/flows)")
            flows = rest.flows(since, until)
        if flows is None or topo is None:  # only the live verdicts: per-pair figures for them
            _say("no per-flow data: judging from the collector's verdict history")
            ev.pairs = rest.gather_pairs(since, until, _probed_pairs(rest, ev.nics))
    finally:
        rest.close()
    verdict = None
    if flows is not None and topo is not None:
        from fleetlens.audit_judge import judge

        verdict = judge(topo, flows, _thresholds(a))
    source = "--db copy" if a.db is not None else "GET /v1/flows"
    return build_report(
        source=a.collector, since_ns=since, until_ns=until, warmup_s=warm,
        th=_thresholds(a), rest=ev, verdict=verdict, live_fraction=a.live_fraction,
        flows=flows if verdict else None, stalls=stalls, flows_source=source,
    )  # fmt: skip


def _topology(a: argparse.Namespace, ev: RestEvidence) -> Topology | None:
    """--inventory when given, else the inventory the collector serves (None: it has none)."""
    from fleetlens.topology import Topology

    if a.inventory is None:
        return topology_from_rest(ev.links, ev.nics)
    try:
        return Topology.load(a.inventory)
    except (OSError, ValueError, KeyError) as e:
        raise AuditInputError(f"--inventory {a.inventory}: {e}") from None


def run_lab(a: argparse.Namespace) -> dict:
    from fleetlens.audit_judge import judge
    from fleetlens.audit_lab import LabRun, parse_inject

    warm = 10.0 if a.warmup is None else a.warmup
    run = LabRun(a.name, a.hosts, a.nics, a.leaves, a.spines, a.seed, 1e-3, _say)
    keep = a.keep_workdir
    try:
        topo = run.up()
        if a.inject:
            run.inject(parse_inject(a.inject))
        url = run.start()
        _wait(warm, "warm-up (agents start, clocks converge)")
        since = time.time_ns()
        _say(f"auditing {a.minutes:g} min")
        _wait(a.minutes * 60, "audit")
        until = time.time_ns()
        _wait(SETTLE_S, "settling")
        _say("reading the collector's verdicts and clocks")
        rest = RestReader(url)
        try:
            ev = rest.gather(since, until, [])
        finally:
            rest.close()
        truth = run.clock_errors(ev.clocks, time.time_ns())
        _say("stopping agents and collector")
        db = run.stop_stack()
        assert db is not None
        _say("judging every link and NIC")
        flows, stalls = read_flows(db, since, until)
        if flows.n == 0:  # the stack itself failed: nothing here says anything of the fabric
            raise AuditInputError(
                "no probe windows reached the collector during the audit period; "
                f"agent and collector logs kept in {run.workdir}"
            )
        verdict = judge(topo, flows, _thresholds(a))
        lab = {
            "name": a.name, "hosts": a.hosts, "nics": a.nics, "leaves": a.leaves,
            "spines": a.spines, "seed": a.seed, "workdir": str(run.workdir),
            "injected": run.injected,  # the truth: never given to the judgement
        }  # fmt: skip
        return build_report(
            source=f"lab {a.name} ({url})", since_ns=since, until_ns=until, warmup_s=warm,
            th=_thresholds(a), rest=ev, verdict=verdict, live_fraction=a.live_fraction,
            flows=flows, stalls=stalls, clock_truth=truth, lab=lab,
        )  # fmt: skip
    except KeyboardInterrupt:
        raise
    except BaseException:
        keep = run.workdir is not None  # the logs say what went wrong
        raise
    finally:
        _say("tearing the lab down")
        run.close(keep_workdir=keep)


_MAIN_PID = os.getpid()


def _sigterm(signum: int, frame: object) -> None:
    if os.getpid() != _MAIN_PID:  # a forked helper (pyroute2's netns workers): just die
        os._exit(128 + signum)
    raise KeyboardInterrupt  # same clean-up path as Ctrl-C


def main(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    try:
        _validate(a)
        if a.collector:
            _token(a)  # a bad token file is a usage error before any waiting
    except UsageError as e:
        print(f"fleetlens audit: {e}", file=sys.stderr)
        return 2
    old = signal.signal(signal.SIGTERM, _sigterm)
    try:
        report = run_lab(a) if a.lab else run_collector(a)
    except AuditInputError as e:
        print(f"fleetlens audit: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fleetlens audit: interrupted; everything it started was stopped", file=sys.stderr)
        return 2
    except Exception as e:  # lab build/stack failures: a sentence, not a traceback
        log = a.report / "audit-error.log"
        log.write_text(traceback.format_exc())
        print(f"fleetlens audit: {type(e).__name__}: {e} (details: {log})", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, old)
    from fleetlens.audit_report import write_html, write_json

    write_json(report, a.report)
    write_html(report, a.report)
    print(("PASS: " if report["result"] == "pass" else "FAIL: ") + report["summary"])
    print(f"report: {a.report / 'report.html'}, {a.report / 'report.json'}")
    return 0 if report["result"] == "pass" else 1
