"""Huygens clock sync: purity filter, per-edge max-margin fit, network-effect correction,
drift tracking. The collector plugs in ``HuygensSync()`` (stateful) or ``solve_clocks``."""

from .config import SyncConfig
from .solver import HuygensSync, SolveReport, solve_clocks

__all__ = ["HuygensSync", "SolveReport", "SyncConfig", "solve_clocks"]
