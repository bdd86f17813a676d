"""The lab's command line, and teardown that leaves no trace — even after kill -9."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from fleetlens.fixtures.lab import awake, netns
from fleetlens.fixtures.lab.fabric import Lab
from fleetlens.fixtures.lab.state import LabState

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces")
NAME = f"c{os.getpid() % 100000}"


def _fleetlens(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "fleetlens.cli", "lab", "--name", NAME, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed: {proc.stderr}")
    return proc


def _trace() -> dict[str, object]:
    """Everything this lab could leave behind (other labs may come and go meanwhile)."""
    procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return {
        "netns": netns.list_names(f"{NAME}-"),
        "links": sorted(
            p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith(NAME)
        ),
        "nft": subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout,
        "helpers": sorted(ln for ln in procs.splitlines() if re.search(f"--lab {NAME}( |$)", ln)),
        "state": LabState.path(NAME).parent.exists(),
        "cpu_latency_target_us": awake.current_target_us(),
    }


@pytest.fixture
def tidy() -> object:
    before = _trace()
    try:
        yield before
    finally:
        Lab.down(NAME)


def test_cli_round_trip_leaves_no_trace(tidy: dict) -> None:  # type: ignore[type-arg]
    _fleetlens("up", "--hosts", "4", "--nics", "2", "--leaves", "2", "--spines", "2")
    status = json.loads(_fleetlens("status", "--json").stdout)
    assert [h["host"] for h in status["hosts"]] == ["h00", "h01", "h02", "h03"]
    assert status["hosts"][1]["nics"][0] == {
        "nic": "h01/eth0", "ifname": "eth0", "ip": "10.0.0.3", "leaf": "leaf0", "up": True,
    }  # fmt: skip
    assert status["collector_ip"].startswith("10.254.")
    assert json.loads(_fleetlens("ping", "--json").stdout)["unreachable"] == []
    path = json.loads(
        _fleetlens("path", "h00/eth0", "h02/eth1", "--sport", "40000", "--json").stdout
    )
    assert path["links"][0] == "h00/eth0->leaf0" and path["links"][-1] == "leaf1->h02/eth1"
    mgmt = _fleetlens("exec", "h02", "--", "cat", "/proc/net/dev").stdout
    assert "mgmt" in mgmt and "eth1" in mgmt
    # The management network reaches the collector address in the root namespace.
    reach = _fleetlens("exec", "h02", "--", sys.executable, "-c",
                       f"import socket; s=socket.create_connection(('{status['collector_ip']}', 9)"
                       ", timeout=2)", check=False)  # fmt: skip
    assert "ConnectionRefused" in reach.stderr  # a RST from the root namespace: reachable
    # The delay first: its calibration needs a path through leaf1->spine1, which on two leaves
    # only exists while the flapping leaf0-spine1 cable is up.
    _fleetlens("fault", "leaf1->spine1", "--delay", "100")
    _fleetlens("fault", "leaf0->spine1", "--flap", "100")
    _fleetlens("fault", "leaf1->spine0", "--loss", "5")
    faults = json.loads(_fleetlens("status", "--json").stdout)["faults"]
    assert {f["kind"] for f in faults} == {"flap", "loss", "delay"}
    # Counted from the lab's own records: 'ps' also catches pyroute2's short-lived forks of
    # the flapper (they carry its command line while they open a socket in a namespace).
    helpers = json.loads(_fleetlens("status", "--json").stdout)["helpers"]
    assert sorted(h["role"] for h in helpers if h["alive"]) == ["awake", "delay", "flap"], helpers
    # Healing stops the fault helpers only: the CPUs stay awake while the lab is up.
    _fleetlens("heal", "--all")
    helpers = json.loads(_fleetlens("status", "--json").stdout)["helpers"]
    assert [h["role"] for h in helpers if h["alive"]] == ["awake"], helpers
    assert awake.current_target_us() == 0
    assert "cpus: kept awake" in _fleetlens("status").stdout
    _fleetlens("down")
    assert _trace() == tidy


def test_cli_errors_are_clear(tidy: dict) -> None:  # type: ignore[type-arg]
    not_up = _fleetlens("status", check=False)
    assert not_up.returncode == 2 and "not up" in not_up.stderr
    _fleetlens("up", "--hosts", "2", "--nics", "1", "--leaves", "2", "--spines", "1")
    again = _fleetlens("up", check=False)
    assert again.returncode == 1 and "already up" in again.stderr
    bad = _fleetlens("fault", "leaf0->nowhere", "--loss", "5", check=False)
    assert bad.returncode == 1 and "no such link" in bad.stderr
    bad = _fleetlens("path", "h00/eth0", "h09/eth0", "--sport", "1", check=False)
    assert bad.returncode == 1 and "unknown NIC" in bad.stderr
    _fleetlens("down")
    assert _trace() == tidy


def test_kill_9_during_up_then_down_leaves_no_trace(tidy: dict) -> None:  # type: ignore[type-arg]
    cmd = [sys.executable, "-m", "fleetlens.cli", "lab", "--name", NAME, "up",
           "--hosts", "32", "--nics", "4", "--leaves", "8", "--spines", "4"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    # Kill once the build is well under way: namespaces exist but the fabric isn't finished.
    while time.monotonic() < deadline:
        if len(netns.list_names(f"{NAME}-")) >= 40 and proc.poll() is None:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = LabState.load(NAME)
    assert state is not None and not state.built, "kill landed after the build finished"
    down = _fleetlens("down")
    assert "removed" in down.stdout
    assert _trace() == tidy


def test_two_labs_whose_names_hash_alike_get_different_management_subnets() -> None:
    base = f"m{os.getpid() % 1000}"
    seen: dict[int, str] = {}
    for i in range(36 * 36):
        name = base + "".join("abcdefghijklmnopqrstuvwxyz0123456789"[d] for d in divmod(i, 36))
        bucket = zlib.crc32(name.encode()) % 250
        if bucket in seen:
            break
        seen[bucket] = name
    first, second = seen[bucket], name
    try:
        a = Lab.up(first, hosts=2, nics=1, leaves=2, spines=1)
        b = Lab.up(second, hosts=2, nics=1, leaves=2, spines=1)
        assert a.state.mgmt_subnet != b.state.mgmt_subnet
        assert a.collector_ip != b.collector_ip
    finally:
        Lab.down(second)
        Lab.down(first)
