from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from fleetlens.fixtures.lab import faults
from fleetlens.fixtures.lab.fabric import Lab, lab_fabric

# Unique per test process, so a parallel run (or another developer's lab) never collides.
LAB_NAME = f"t{os.getpid() % 100000}"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("needs root: builds network namespaces (CI runs as root)")
    with lab_fabric(LAB_NAME) as fabric:
        yield fabric


@pytest.fixture
def clean_lab(lab: Lab) -> Iterator[Lab]:
    """The module's fabric, with every fault healed after the test, pass or fail."""
    try:
        yield lab
    finally:
        faults.heal(lab)
