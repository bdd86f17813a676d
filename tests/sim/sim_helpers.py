"""Helpers for the simulator tests."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import SimResult, Simulator

from fleetlens.topology import Topology

SMALL = "leafspine:hosts=8,nics=2,leaves=4,spines=2"


def run(topo: Topology, seconds: float = 2, seed: int = 1, **cfg: object) -> SimResult:
    cfg.setdefault("paths_known", True)
    return Simulator(topo, SimConfig(**cfg), seed=seed).run(seconds)


def column(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


def crosses(table: pa.Table, link: str) -> np.ndarray:
    """Rows whose (true) path crosses ``link``."""
    return np.array([link in p for p in table.column("path").to_pylist()], bool)


def touches(table: pa.Table, nic_or_host: str) -> np.ndarray:
    """Rows sent by or to a NIC (``h01/eth0``) or a host (``h01``)."""

    def hit(col: str) -> np.ndarray:
        v = column(table, col).astype(str)
        return np.char.startswith(v, nic_or_host + ("" if "/" in nic_or_host else "/"))

    return hit("src_nic") | hit("dst_nic")
