"""``fleetlens demo --json`` end to end on the lab fabric: the README's main job, judged by
its own summary against the truth it injected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fleetlens.fixtures.lab import netns
from fleetlens.fixtures.lab.fabric import Lab

from fleetlens.demo.lab import SYNC_BOUND_NS

pytestmark = [
    pytest.mark.root,  # deselected by -m "not root"
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces"),
]
NAME = f"d{os.getpid() % 100000}"


@pytest.fixture(scope="module")
def summary() -> dict:  # type: ignore[type-arg]
    cmd = [sys.executable, "-m", "fleetlens.cli", "demo", "--json", "--name", NAME]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    finally:
        Lab.down(NAME)  # a crash mid-way must not leave the fabric behind for the next test
    assert proc.stdout.strip(), f"demo printed no summary (rc {proc.returncode}): {proc.stderr}"
    s = json.loads(proc.stdout)
    s["returncode"] = proc.returncode
    return s


def test_every_check_passes_and_the_exit_code_says_so(summary: dict) -> None:  # type: ignore[type-arg]
    assert summary["checks"] and all(summary["checks"].values()), summary["checks"]
    assert summary["passed"] is True and summary["returncode"] == 0


def test_every_host_synced_within_the_lab_bound(summary: dict) -> None:  # type: ignore[type-arg]
    clocks = summary["clocks"]
    assert len(clocks) == 8
    assert all(c["synced"] and c["error_ns"] is not None for c in clocks)
    assert max(abs(c["error_ns"]) for c in clocks) <= 2 * SYNC_BOUND_NS
    assert summary["sync_samples"] >= 5  # the p99 is over the warm-up, not one read
    assert summary["sync_p99_ns"] <= SYNC_BOUND_NS


def test_the_faulted_link_and_nothing_else_is_localized(summary: dict) -> None:  # type: ignore[type-arg]
    link = summary["fault"]["link"]
    assert summary["faulty_links"] == [link]
    assert summary["localized_s"] is not None and summary["localized_s"] <= 5.0
    assert summary["baseline_clean_s"] is not None, "start-up verdicts never cleared"
    assert summary["cleared_s"] is not None and summary["cleared_s"] <= 30.0, "still faulty"


def test_linkpass_moved_every_byte_across_the_pulled_nic(summary: dict) -> None:  # type: ignore[type-arg]
    lp = summary["linkpass"]
    assert lp["bytes_sent"] > 0 and lp["bytes_verified"] == lp["bytes_sent"]
    assert lp["errors"] == 0 and lp["mismatches"] == 0
    assert lp["max_stall_ms"] < 1000


def test_nothing_is_left_behind(summary: dict) -> None:  # type: ignore[type-arg]
    assert netns.list_names(f"{NAME}-") == []
    assert not [p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith(NAME)]
    # The collector listens on, and every agent uploads to, this lab's collector address.
    addr = summary["collector"].removeprefix("http://")
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [ln for ln in ps.splitlines() if addr in ln]
