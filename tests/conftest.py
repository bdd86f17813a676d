"""Shared pytest setup: root-only tests skip with a clear message elsewhere, and the suite
splits into two phases (``--phase``) so that scripts/test.sh can run the tests that may share
the machine side by side (pytest-xdist) and the others alone.

A test is serial when it carries ``root`` (it builds network namespaces: the lab's timing
bounds flake when another heavy job runs beside it) or ``serial`` (it measures against a
clock, kills and restarts servers, or spawns many processes). Tests that skip unless root or
use the lab fabric fixture get ``root`` here, and tests in a module that builds a lab itself
(``lab_fabric(``, ``lab_stack(``) get ``serial``, so that no test building the lab can slip
into the parallel phase by lacking a marker.

A test that skips unless root only for a socket option (``SO_BINDTODEVICE`` on loopback), builds
no namespace and holds no timing bound may carry ``shares_machine``: it then runs in the
parallel phase (the probe fuzzer: about a minute of Hypothesis generating inputs, counters compared
exactly, no clock read).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import pytest

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not IS_ROOT, reason="needs root: builds network namespaces (CI runs as root)"
)

PHASES = ("all", "parallel", "serial")
LAB_FIXTURES = {"lab", "clean_lab"}
LAB_BUILDERS = ("lab_fabric(", "lab_stack(")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=PHASES,
        default="all",
        help="parallel: only the tests that may run beside others; serial: only the root "
        "and serial ones; all (default): both",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "shares_machine: needs root for a socket option only, no namespace and no timing "
        "bound: runs in the parallel phase",
    )


def _needs_root(item: pytest.Item) -> bool:
    if item.get_closest_marker("shares_machine") and not item.get_closest_marker("root"):
        return False
    if item.get_closest_marker("root") or LAB_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    reasons = (str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))
    return any(r.startswith("needs root") for r in reasons)


@cache
def _builds_a_lab(module: Path) -> bool:
    text = module.read_text(encoding="utf-8")
    return any(b in text for b in LAB_BUILDERS)


# First, so that the root markers added here count for -m "not root" too.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _needs_root(item) and not item.get_closest_marker("root"):
            item.add_marker(pytest.mark.root)
        if _builds_a_lab(item.path) and not item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.serial)
    phase = config.getoption("--phase")
    if phase == "all":
        return
    want_serial = phase == "serial"
    keep, drop = [], []
    for item in items:
        serial = bool(item.get_closest_marker("root") or item.get_closest_marker("serial"))
        (keep if serial == want_serial else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
