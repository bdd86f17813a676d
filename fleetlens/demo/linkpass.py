"""LinkPass on the lab: a transfer between two hosts while one NIC's cable is pulled and
restored; the longest stall and the bytes verified. Real bytes over real NIC sockets, so the
story runs it on the lab fabric only.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from fleetlens.fixtures.lab import faults, netns
from fleetlens.fixtures.lab.fabric import Lab

LINKPASS_BUILD = Path(__file__).resolve().parents[2] / "ext" / "linkpass" / "build"


def run_linkpass(
    lab: Lab, work: Path, src: str, dst: str, seconds: float, pull: str
) -> dict[str, object]:
    """Receiver on ``dst``, sender on ``src`` (NIC i pairs with NIC i); ``pull``'s cable is
    taken down at 2 s and restored at 5 s while the transfer runs."""
    harness, plugin = (
        LINKPASS_BUILD / "linkpass_harness",
        LINKPASS_BUILD / "libnccl-net-linkpass.so",
    )
    if not harness.exists():
        subprocess.run(["make", "-s", "-C", str(LINKPASS_BUILD.parent)], check=True)
    handle = work / "linkpass.handle"
    handle.unlink(missing_ok=True)
    nics = ",".join(n.ifname for n in lab.topo.nics_by_host[src])
    env = {**os.environ, "LINKPASS_NICS": nics, "LINKPASS_TIMEOUT_MS": "10000"}
    common = ["--plugin", str(plugin), "--handle", str(handle), "--sample-ms", "100"]
    procs = {
        role: _spawn_in(lab, host, [str(harness), "--role", role, *common, *extra], env)
        for role, host, extra in (("recv", dst, []), ("send", src, ["--seconds", str(seconds)]))
    }
    link = f"{pull}->{lab.topo.nic_by_id[pull].leaf}"
    time.sleep(2)
    faults.add_down(lab, link)
    time.sleep(3)
    faults.heal(lab, link)
    out = {role: _done_event(p, seconds + 30) for role, p in procs.items()}
    send, recv = out["send"], out["recv"]
    return {
        "src": src, "dst": dst, "pulled": pull,
        "bytes_sent": send.get("bytes"), "bytes_verified": recv.get("bytes_verified"),
        "mismatches": recv.get("mismatches"),
        # A rank that never finished has no "done" event: it counts as an error and a stall.
        "errors": int(send.get("errors", 1)) + int(recv.get("errors", 1)),
        "max_stall_ms": max(float(r.get("max_stall_ms", 1e9)) for r in (send, recv)),
    }  # fmt: skip


def _spawn_in(lab: Lab, host: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return netns.popen(
        lab.ns(host), argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )


def _done_event(p: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    try:
        out, _ = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    events = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    done = [e for e in events if e.get("event") == "done"]
    return done[-1] if done else {}
