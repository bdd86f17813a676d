"""A NIC that appears after the agent started is probed from and answered on; one that goes
away stops being probed, and the agent keeps running (real agents, real collector, the lab).

Host h00's ``eth1`` cable (a veth pair) is deleted before its agent starts, plugged in again
(a new veth, its address and route) once both agents probe, then deleted again once the
collector holds windows of its probes both ways from 2 s after the plug on; the agents stop
once it holds a window of h00's other NIC from 2 s after the unplug on. (Fixed waits of 4, 5
and 4 s did it before: waits on what the checks need, not on a guess of this box's speed.)
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest
from collector_waits import until
from fleetlens.api.store import Store
from fleetlens.fixtures.lab.fabric import HOST_TABLE_BASE, Lab, lab_fabric
from fleetlens.fixtures.lab.stack import lab_stack
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces")
NIC = "h00/eth1"


@dataclass
class Run:
    windows: pa.Table
    t_plug: int  # the new veth is configured (ns, wall clock)
    t_unplug: int
    log: str
    exit_codes: dict[str, int]


def _probing(log: Path) -> bool:
    return log.exists() and "probing" in log.read_text()


def _sent(url: str, since_ns: int, key: str, nic: str) -> int:
    """Probes sent on flows whose ``key`` (src_nic, dst_nic) is ``nic``, over the windows the
    collector holds from ``since_ns`` on (none before a whole window has passed since)."""
    if time.time_ns() < since_ns + 1_000_000_000:
        return 0  # the API refuses a period that starts in the future
    r = httpx.get(f"{url}/v1/flows", params={"since": since_ns, "limit": 1000}, timeout=5)
    r.raise_for_status()
    return sum(f["sent"] for f in r.json() if f[key] == nic)


def _unplug(lab: Lab, nic_id: str) -> None:
    nic = lab.topo.nic_by_id[nic_id]
    with IPRoute(netns=lab.ns(nic.host)) as ipr:
        ipr.link("del", index=ipr.link_lookup(ifname=nic.ifname)[0])  # deletes both ends


def _plug(lab: Lab, nic_id: str) -> None:
    """A new veth between the host and its leaf, configured as the lab builds it."""
    nic = lab.topo.nic_by_id[nic_id]
    leaf_dev = lab.dev(nic.leaf, nic.id)
    with IPRoute(netns=lab.ns(nic.leaf)) as ipr:
        ipr.link("add", ifname=leaf_dev, kind="veth",
                 peer={"ifname": nic.ifname, "net_ns_fd": lab.ns(nic.host)})  # fmt: skip
        idx = ipr.link_lookup(ifname=leaf_dev)[0]
        ipr.addr("add", index=idx, address=nic.gateway, prefixlen=31)
        ipr.link("set", index=idx, state="up")
    k = int(nic.ifname[3:])
    with IPRoute(netns=lab.ns(nic.host)) as ipr:
        idx = ipr.link_lookup(ifname=nic.ifname)[0]
        ipr.addr("add", index=idx, address=nic.ip, prefixlen=31)
        ipr.link("set", index=idx, state="up")
        with contextlib.suppress(NetlinkError):  # the source rule outlived the device
            ipr.rule("add", table=HOST_TABLE_BASE + k, src=nic.ip, src_len=32, iifname="lo",
                     priority=HOST_TABLE_BASE + k)  # fmt: skip
    lab.reconverge()  # host routes through the new NIC


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    work = tmp_path_factory.mktemp("hotplug")
    with lab_fabric(f"cv{os.getpid() % 1000}", hosts=2, nics=2, leaves=2, spines=1) as lab:
        _unplug(lab, NIC)
        with lab_stack(lab, work, port=18472) as stack:
            for host in lab.topo.hosts:
                stack.start_agent(host)
            logs = [work / f"agent-{h}.log" for h in lab.topo.hosts]
            until(lambda: all(map(_probing, logs)), 30, "both agents probing")
            _plug(lab, NIC)
            t_plug = time.time_ns()
            plugged = t_plug + 2_000_000_000
            until(lambda: min(_sent(stack.url, plugged, k, NIC) for k in ("src_nic", "dst_nic"))
                  > 100, 30, f"{NIC}'s probes both ways after the plug")  # fmt: skip
            _unplug(lab, NIC)
            t_unplug = time.time_ns()
            after = t_unplug + 2_000_000_000
            until(lambda: _sent(stack.url, after, "src_nic", "h00/eth0") > 0, 30,
                  "h00's windows after the unplug")  # fmt: skip
            codes = stack.stop_agents()
            stack.stop_collector()
            store = Store(stack.db)
            windows = store.read_windows()
            store.close()
        yield Run(windows, t_plug, t_unplug, (work / "agent-h00.log").read_text(), codes)


def _rows(run: Run, col: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    w = run.windows
    start = w["start_ns"].to_numpy()
    m = (w[col].to_numpy(zero_copy_only=False) == NIC) & (start >= lo) & (start + 1e9 <= hi)
    return w["sent"].to_numpy()[m], w["received"].to_numpy()[m]


def test_a_nic_plugged_in_after_start_is_probed_from_and_answered_on(run: Run) -> None:
    assert run.exit_codes == {"h00": 0, "h01": 0}  # nothing crashed, unplugged twice
    sent, _ = _rows(run, "src_nic", 0, run.t_plug)
    assert sent.sum() == 0  # it really was not there before
    plugged = (run.t_plug + 2_000_000_000, run.t_unplug)
    sent, received = _rows(run, "src_nic", *plugged)
    assert sent.sum() > 100 and received.sum() == sent.sum()  # its probes cross the fabric
    sent, received = _rows(run, "dst_nic", *plugged)
    assert sent.sum() > 100 and received.sum() == sent.sum()  # and it answers the peer's
    assert "NICs changed: added eth1" in run.log


def test_a_nic_that_goes_away_stops_being_probed(run: Run) -> None:
    sent, _ = _rows(run, "src_nic", run.t_unplug + 2_000_000_000, 2**63 - 1)
    assert sent.sum() == 0
    assert "gone eth1" in run.log
