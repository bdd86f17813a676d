"""Waiting on a running collector (or fleet tier) over its REST API, for the lab tests."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx


def get_json(url: str, path: str) -> list[dict]:  # type: ignore[type-arg]
    r = httpx.get(url + path, timeout=10)
    r.raise_for_status()
    return r.json()


def all_synced(url: str, hosts: int) -> bool:
    """Every host's one-way delays count as evidence (a delay seen only on some hosts' flows
    can tie an uplink with a downlink: on this VM some hosts got there 25 s past sync)."""
    clocks, now = get_json(url, "/v1/clocks"), time.time_ns()
    return len(clocks) == hosts and all(
        c["synced"] and c["delay_evidence_from"] is not None and c["delay_evidence_from"] <= now
        for c in clocks
    )


def until(cond: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``cond()`` held, polled every 0.25 s; AssertionError after ``timeout_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.25)
    raise AssertionError(f"no {what} within {timeout_s} s")
