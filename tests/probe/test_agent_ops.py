"""The agent under operational trouble: a NIC going down and up, the collector gone for 60 s.

One scenario on a small lab (4 hosts × 2 NICs): clean, then the collector is killed (-9) for
60 s and restarted on the same DuckDB file; 2 s into the outage ``h01/eth1`` loses its cable
for 4 s. Agents hold at most 10 batches in memory, so the outage also proves the spill to
disk. (The cable was pulled before the outage once: the same checks, 7 s more of waiting; an
agent notices its NICs without the collector, and the windows of the cable's outage reach the
collector through the spill.)
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import pyarrow as pa
import pytest
from fleetlens.api.store import Store
from fleetlens.fixtures.lab import faults
from fleetlens.fixtures.lab.fabric import Lab, lab_fabric
from fleetlens.fixtures.lab.stack import lab_stack

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces")
OUTAGE_S = 60
DOWN_LINK = "h01/eth1->leaf1"
METRICS_PORT = 9478


@dataclass
class Ops:
    lab: Lab
    windows: pa.Table
    t_down: int
    t_up: int
    t_kill: int
    t_restart: int
    metrics: dict[str, str]
    decisions: dict[str, dict]  # type: ignore[type-arg]
    exit_codes: dict[str, int]
    logs: dict[str, str]


def _scrape(lab: Lab, host: str) -> str:
    return httpx.get(f"http://{lab.mgmt_ip(host)}:{METRICS_PORT}/metrics", timeout=3).text


def _wait(pred, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ops]:
    work = tmp_path_factory.mktemp("ops")
    lab_args = {"hosts": 4, "nics": 2, "leaves": 2, "spines": 2}
    with lab_fabric(f"o{os.getpid() % 10000}", **lab_args) as lab, lab_stack(lab, work) as stack:
        for h in lab.topo.hosts:
            stack.start_agent(
                h, "--metrics", f"{lab.mgmt_ip(h)}:{METRICS_PORT}", "--mem-batches", "10"
            )
        _wait(
            lambda: all(
                _metric(_scrape(lab, h), "fleetlens_agent_windows_total") > 0
                for h in lab.topo.hosts
            ),
            30,
            "windows",
        )
        time.sleep(2)
        t_kill = time.time_ns()
        stack.stop_collector(kill=True)
        time.sleep(2)
        t_down = time.time_ns()
        faults.add_down(lab, DOWN_LINK)
        # 4 s: the test needs a whole window (starts on whole seconds) that begins 1.5 s into
        # the cable's outage and ends before it; 3 s left a 0.5 s slot that missed every start
        # half of the time.
        time.sleep(4)
        t_up = time.time_ns()
        faults.heal(lab, DOWN_LINK)
        time.sleep(max(0.0, OUTAGE_S - (time.time_ns() - t_kill) / 1e9))
        metrics = {h: _scrape(lab, h) for h in lab.topo.hosts}
        t_restart = time.time_ns()
        stack.start_collector()

        def drained(h: str) -> bool:
            text = _scrape(lab, h)
            disk = _metric(text, "fleetlens_agent_upload_buffer_batches", '{where="disk"}')
            mem = _metric(text, "fleetlens_agent_upload_buffer_batches", '{where="memory"}')
            return disk == 0 and mem <= 1

        _wait(lambda: all(drained(h) for h in lab.topo.hosts), 60, "the backlog to drain")
        time.sleep(2)
        decisions = {
            h: json.loads((work / "agents" / h / "decision.json").read_text())
            for h in lab.topo.hosts
        }
        codes = stack.stop_agents()
        stack.stop_collector()
        store = Store(stack.db)
        windows = store.read_windows()
        store.close()
        logs = {h: (work / f"agent-{h}.log").read_text() for h in lab.topo.hosts}
        yield Ops(lab, windows, t_down, t_up, t_kill, t_restart, metrics, decisions, codes, logs)


def test_every_window_arrives_once_across_a_60s_collector_outage(ops: Ops) -> None:
    assert ops.exit_codes == dict.fromkeys(ops.lab.topo.hosts, 0)
    starts: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    for s, d, p, t in zip(
        *(ops.windows[c].to_pylist() for c in ("src_nic", "dst_nic", "sport", "start_ns")),
        strict=True,
    ):
        starts[s, d, p].append(t)
    for flow, ts in starts.items():
        assert len(ts) == len(set(ts)), f"{flow}: a window stored twice"
    # Per NIC pair: a flow reports on a row of its own until its path is known, then under its
    # path group's lowest port (fleetlens.pathgroups), so the pair is what reports throughout.
    pairs: dict[tuple[str, str], set[int]] = defaultdict(set)
    for (s, d, _), ts in starts.items():
        pairs[s, d].update(ts)
    not_spanning = []
    for pair, ts in pairs.items():
        if pair[0] == "h01/eth1":
            continue  # its cable was down for 4 s: it sent nothing, so it has no windows then
        steps = np.diff(sorted(ts))
        assert np.all(steps == 1_000_000_000), f"{pair}: missing windows"  # contiguous
        if not (min(ts) < ops.t_kill and max(ts) > ops.t_restart):
            not_spanning.append((pair, min(ts) - ops.t_kill, max(ts) - ops.t_restart))
    assert not not_spanning, not_spanning[:5]  # every pair reported straight through the outage
    for h, text in ops.metrics.items():  # during the outage: buffered, spilled, nothing dropped
        assert _metric(text, "fleetlens_agent_upload_buffer_batches", '{where="disk"}') > 0, h
        assert _metric(text, "fleetlens_agent_upload_spilled_batches_total") > 0, h
        assert _metric(text, "fleetlens_agent_upload_dropped_windows_total") == 0, h
        assert "collector unreachable" in ops.logs[h]


def test_a_nic_going_down_stops_its_probes_and_resumes_after(ops: Ops) -> None:
    w = ops.windows
    src, start, sent, received = (
        w[c].to_numpy(zero_copy_only=False) for c in ("src_nic", "start_ns", "sent", "received")
    )
    down = (start >= ops.t_down + 1_500_000_000) & (start + 1_000_000_000 <= ops.t_up)
    after = start >= ops.t_up + 2_000_000_000
    nic = src == "h01/eth1"
    assert down.any() and sent[down & nic].sum() == 0  # nothing sent from the dead NIC
    other = (src == "h01/eth0") & down
    assert sent[other].sum() > 0 and received[other].sum() == sent[other].sum()
    assert sent[after & nic].sum() > 0 and received[after & nic].sum() == sent[after & nic].sum()
    assert "NICs up: h01/eth0" in ops.logs["h01"]  # it noticed, without a restart


def test_agent_metrics_and_decision_files(ops: Ops) -> None:
    for h, text in ops.metrics.items():
        assert _metric(text, "fleetlens_agent_probe_packets_sent_total") > 1000, h
        for nic in ops.lab.topo.nics_by_host[h]:
            assert (
                _metric(
                    text,
                    "fleetlens_agent_timestamp_source",
                    f'{{nic="{nic.id}",source="software"}}',
                )
                == 1
            )
        assert _metric(text, "fleetlens_agent_dropped_packets_total", '{reason="bad_mac"}') == 0
        assert ops.decisions[h]["host_id"] == h and isinstance(ops.decisions[h]["drain"], list)
