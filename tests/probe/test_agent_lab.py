"""Real agents on the lab fabric (8 hosts × 2 NICs), real collector, real faults.

One scenario feeds every test of this module: 5 s clean, 5 s with 20 % loss on
``leaf0->spine1`` and a delay on ``leaf3->spine0``, 3 s healed; then the agents stop (draining
their acks and uploads), the collector stops, and the tests read its DuckDB file. Which flows
cross a faulted link is the kernel's own answer (``lab path``), never a formula of ours.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest
from fleetlens.api.store import Store
from fleetlens.fixtures.lab import faults, measure
from fleetlens.fixtures.lab.fabric import Lab, lab_fabric
from fleetlens.fixtures.lab.paths import PathOracle
from fleetlens.fixtures.lab.stack import lab_stack

from fleetlens.plan import PROBE_DPORT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces")
LOSS_LINK, DELAY_LINK = "leaf0->spine1", "leaf3->spine0"
OFFSETS_NS = {"h01": 3_000_000, "h02": -2_000_000}  # injected clock errors
DELAY_US = 300.0
# Software stamps and a userspace delay daemon on a loaded 2-core VM: its lateness differs
# between the lab's 1 kHz calibration datagrams and the probes (a CI run: +375 and +392 us
# measured for 300, +338 seen by the agents), so 30 us or 15 % of the measured delay.
DELAY_TOL_US = 30.0
DELAY_TOL_SHARE = 0.15


Flow = tuple[str, str, int]


@dataclass
class Run:
    lab: Lab
    windows: pa.Table
    planned: set[Flow]
    reps: dict[Flow, Flow]  # planned flow -> the flow its path group reports under
    t_fault: int
    t_heal: int
    delay_us: tuple[float, float]  # measured just after injection and just before heal
    exit_codes: dict[str, int]
    decision_files: list[Path]


def _wait_for_windows(url: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = httpx.get(f"{url}/metrics", timeout=2).text
        stored = [ln for ln in m.splitlines() if ln.startswith("fleetlens_ingest_windows_total")]
        if stored and float(stored[0].split()[-1]) > 0:
            return
        time.sleep(0.2)
    raise AssertionError("no window reached the collector")


def _path_groups(lab: Lab, planned: set[Flow]) -> dict[Flow, Flow]:
    """Per planned flow, the flow its window rows come under once every path is known: the
    lowest source port of its NIC pair on the same kernel path (``fleetlens.pathgroups``)."""
    first: dict[tuple, Flow] = {}
    reps: dict[Flow, Flow] = {}
    with PathOracle(lab) as oracle:
        for f in sorted(planned):  # a group's first flow here is its lowest port
            reps[f] = first.setdefault((f[0], f[1], *oracle.path(*f)), f)
    return reps


def _recent_flows(url: str, since: str) -> list[dict]:
    out: list[dict] = []
    total = 1
    while len(out) < total:
        r = httpx.get(f"{url}/v1/flows", params={"since": since, "limit": 1000, "offset": len(out)})
        r.raise_for_status()
        total, page = int(r.headers["X-Total-Count"]), r.json()
        if not page:
            break
        out += page
    return out


def _wait_for_paths(url: str, reps: set[Flow], timeout_s: float = 30) -> None:
    """Until every path group has a row with its path, and the newest windows hold no row
    without one (a flow whose path is not known yet reports on a row of its own)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with_path = {(f["src_nic"], f["dst_nic"], f["sport"])
                     for f in _recent_flows(url, "-1m") if f["path"]}  # fmt: skip
        recent = _recent_flows(url, "-3s")
        if reps <= with_path and recent and all(f["path"] for f in recent):
            return
        time.sleep(0.5)
    raise AssertionError(f"path groups without a path after {timeout_s} s: "
                         f"{sorted(reps - with_path)[:5]}")  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    work = tmp_path_factory.mktemp("agents")
    with lab_fabric(f"a{os.getpid() % 10000}") as lab, lab_stack(lab, work) as stack:
        planned = set()
        for host in lab.topo.hosts:
            plan = httpx.get(f"{stack.url}/v1/plan/{host}", timeout=5).json()
            planned |= {
                (e["src_nic"], e["dst_nic"], p) for e in plan["entries"] for p in e["sports"]
            }
            extra = ["--clock-offset-ns", str(OFFSETS_NS[host])] if host in OFFSETS_NS else []
            stack.start_agent(host, *extra)
        reps = _path_groups(lab, planned)
        _wait_for_windows(stack.url)
        # The first traceroutes take 2-5 s on a busy box (a fixed 5 s clean period left some
        # flows without a pathful window in CI): wait for every path, then 3 s clean.
        _wait_for_paths(stack.url, set(reps.values()))
        time.sleep(3)
        t_fault = time.time_ns()
        faults.add_loss(lab, LOSS_LINK, 20)
        through = measure.flows_through(lab, DELAY_LINK, want=1)
        base_ns = faults.calibrate(lab, through)
        (delay,) = faults.add_delay(lab, DELAY_LINK, DELAY_US)
        time.sleep(5)
        # The userspace delay daemon's own lateness moves with the box's load (+391 us for 300
        # measured at injection in one run, +357 seen by the agents over the fault): the
        # truth is measured at both ends of the fault.
        late_us = (faults.calibrate(lab, through) - base_ns) / 1000
        t_heal = time.time_ns()
        faults.heal(lab)
        time.sleep(3)
        codes = stack.stop_agents()
        stack.stop_collector()
        store = Store(stack.db)
        windows = store.read_windows()
        store.close()
        decisions = [work / "agents" / h / "decision.json" for h in lab.topo.hosts]
        delay_us = (min(delay.measured_us or 0.0, late_us), max(delay.measured_us or 0.0, late_us))
        yield Run(lab, windows, planned, reps, t_fault, t_heal, delay_us, codes, decisions)


def _flows(t: pa.Table) -> list[tuple[str, str, int]]:
    return list(
        zip(t["src_nic"].to_pylist(), t["dst_nic"].to_pylist(), t["sport"].to_pylist(), strict=True)
    )


def _cols(t: pa.Table, *names: str) -> list[np.ndarray]:
    return [t[n].to_numpy(zero_copy_only=False) for n in names]


def _between(run: Run, start_ns: int, end_ns: int) -> pa.Table:
    s, d = _cols(run.windows, "start_ns", "duration_ns")
    return run.windows.filter(pa.array((s >= start_ns) & (s + d <= end_ns)))


def test_agents_exit_cleanly_and_every_planned_flow_reports(run: Run) -> None:
    """Each planned flow reports, on a row of its own until its path is known, then through
    its path group: from the fault on (every path known), exactly one row per group."""
    assert run.exit_codes == dict.fromkeys(run.lab.topo.hosts, 0)
    groups = set(run.reps.values())
    assert run.planned and groups < run.planned  # 2 spines: a pair's ~8 ports make <= 2 rows
    assert groups == set(_flows(_between(run, run.t_fault, 2**63 - 1)))
    keys = list(zip(_flows(run.windows), run.windows["start_ns"].to_pylist(), strict=True))
    assert len(keys) == len(set(keys)), "a window was stored twice"
    assert all(p.exists() for p in run.decision_files)


def _classify(
    run: Run, link: str, flows: set[tuple[str, str, int]]
) -> dict[tuple[str, str, int], str]:
    """forward: the probes cross the link; ack: only the acks do; clear: neither."""
    out = {}
    with PathOracle(run.lab) as oracle:
        for src, dst, sport in flows:
            if link in oracle.path(src, dst, sport):
                out[src, dst, sport] = "forward"
            elif link in oracle.path(dst, src, PROBE_DPORT, sport):
                out[src, dst, sport] = "ack"
            else:
                out[src, dst, sport] = "clear"
    return out


def test_loss_shows_on_exactly_the_flows_through_the_link(run: Run) -> None:
    during = _between(run, run.t_fault + 1_000_000_000, run.t_heal)
    kind = _classify(run, LOSS_LINK, set(_flows(during)))
    sent, received = _cols(during, "sent", "received")
    which = np.array([kind[f] for f in _flows(during)])

    def loss(k: str) -> tuple[float, int]:
        m = which == k
        return 1 - received[m].sum() / sent[m].sum(), int(sent[m].sum())

    fwd, n_fwd = loss("forward")
    assert n_fwd >= 2000 and abs(fwd - 0.20) <= 0.05, (fwd, n_fwd)
    # Seen: 0 or ~6e-6 (one probe of ~160 k counted late, cause not yet pinned down).
    assert loss("clear")[0] <= 1e-4
    # Acks crossing the lossy link are repaired by the next ack on the flow (three records).
    assert loss("ack")[0] <= 0.03
    # Healed: back to the clear flows' background (a clean-clone CI run counted 1 of 70 824).
    after = _between(run, run.t_heal + 1_000_000_000, 2**63 - 1)
    s2, r2 = _cols(after, "sent", "received")
    assert s2.sum() > 0 and 1 - r2.sum() / s2.sum() <= 1e-4, (int(s2.sum()), int(r2.sum()))


def test_delay_shows_on_the_flows_through_the_link_as_injected(run: Run) -> None:
    before = _between(run, 0, run.t_fault)
    during = _between(run, run.t_fault + 1_000_000_000, run.t_heal)
    kind = _classify(run, DELAY_LINK, set(_flows(during)) & set(_flows(before)))

    def median_p50(t: pa.Table, k: str) -> float:
        (p50,) = _cols(t, "owd_p50_ns")
        m = np.array([kind.get(f) == k for f in _flows(t)])
        return float(np.nanmedian(p50[m])) / 1000

    added = median_p50(during, "forward") - median_p50(before, "forward")
    lo, hi = run.delay_us
    tol = max(DELAY_TOL_US, DELAY_TOL_SHARE * hi)
    assert lo - tol <= added <= hi + tol, (added, run.delay_us)
    assert lo >= DELAY_US - DELAY_TOL_US, run.delay_us  # the daemon holds at least that long
    assert abs(median_p50(during, "clear") - median_p50(before, "clear")) <= DELAY_TOL_US / 2


def test_injected_clock_offsets_shift_raw_delays_by_exactly_their_difference(run: Run) -> None:
    """With no clock model applied, raw one-way delay = true delay + (offset dst - offset src)."""
    t = _between(run, 0, run.t_fault)
    src, dst = _cols(t, "src_nic", "dst_nic")
    hull = t["hull_owd_ns"].to_pylist()
    shift: dict[float, list[float]] = {}
    for s, d, h in zip(src, dst, hull, strict=True):
        if h:
            expect = OFFSETS_NS.get(d.split("/")[0], 0) - OFFSETS_NS.get(s.split("/")[0], 0)
            shift.setdefault(expect, []).append(min(h) - expect)
    assert {3e6, -3e6, 5e6, -5e6, 2e6, -2e6, 0} <= set(shift)
    true_owd = np.median(shift[0])
    assert 0 < true_owd < 200_000
    for expect, residual in shift.items():
        assert abs(np.median(residual) - true_owd) < 20_000, expect  # within 20 µs of the truth


def test_discovered_paths_equal_the_kernels(run: Run) -> None:
    """Paris traceroute per flow: every path group's windows carry its path, equal to
    ``lab path`` (so are those of the groups formed while paths were still being learned)."""
    rows = _between(run, 0, run.t_fault).select(["src_nic", "dst_nic", "sport", "path"]).to_pylist()
    learned = {(r["src_nic"], r["dst_nic"], r["sport"]): r["path"] for r in rows if r["path"]}
    assert set(run.reps.values()) <= set(learned)
    with PathOracle(run.lab) as oracle:
        for (src, dst, sport), path in learned.items():
            assert path == oracle.path(src, dst, sport), (src, dst, sport)
