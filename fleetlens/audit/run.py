"""The audit's two modes: against a running collector, or on a lab fabric built for it.

Each waits out the warm-up and the audit period, gathers the collector's evidence, judges the
per-flow totals and returns the report (:func:`fleetlens.audit.report.build_report`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fleetlens.audit.data import (
    AuditInputError,
    RestEvidence,
    RestReader,
    read_flows,
    snapshot,
    topology_from_rest,
)
from fleetlens.audit.options import read_token, thresholds
from fleetlens.audit.report import build_report
from fleetlens.fixtures.lab.defaults import LAB_BACKGROUND_LOSS

if TYPE_CHECKING:
    from fleetlens.topology import Topology

SETTLE_S = 3.0  # after the period: last uploads land and the collector's loops catch up


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


def run_collector(a: argparse.Namespace) -> dict:
    rest = RestReader(a.collector, read_token(a))
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
            pairs = rest.probed_pairs(sorted({n["host_id"] for n in ev.nics}))
            ev.pairs = rest.gather_pairs(since, until, pairs)
    finally:
        rest.close()
    verdict = None
    if flows is not None and topo is not None:
        from fleetlens.audit.judge import judge

        verdict = judge(topo, flows, thresholds(a))
    source = "--db copy" if a.db is not None else "GET /v1/flows"
    return build_report(
        source=a.collector, since_ns=since, until_ns=until, warmup_s=warm,
        th=thresholds(a), rest=ev, verdict=verdict, live_fraction=a.live_fraction,
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
    from fleetlens.audit.judge import judge
    from fleetlens.audit.lab import LabRun, parse_inject

    warm = 10.0 if a.warmup is None else a.warmup
    run = LabRun(a.name, a.hosts, a.nics, a.leaves, a.spines, a.seed, LAB_BACKGROUND_LOSS, _say)
    keep = a.keep_workdir
    try:
        topo = run.up()
        run.inject([parse_inject(text) for text in a.inject])
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
        verdict = judge(topo, flows, thresholds(a))
        lab = {
            "name": a.name, "hosts": a.hosts, "nics": a.nics, "leaves": a.leaves,
            "spines": a.spines, "seed": a.seed, "workdir": str(run.workdir),
            "injected": run.injected,  # the truth: never given to the judgement
        }  # fmt: skip
        return build_report(
            source=f"lab {a.name} ({url})", since_ns=since, until_ns=until, warmup_s=warm,
            th=thresholds(a), rest=ev, verdict=verdict, live_fraction=a.live_fraction,
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
