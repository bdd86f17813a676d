"""``fleetlens agent`` with its injected clock distortion anchored at a given instant.

The agent distorts its clock as ``raw = real + offset + drift·(real − t0)`` with ``t0`` taken
when its data path is built, which a test cannot know to the µs (and 50 ppm × 1 ms is 50 ns of
truth). This wrapper re-applies the same injection with ``t0`` from ``$SY_INJECT_T0_NS`` right
after the data path is built, so the test's truth is exact. Everything else is the real agent.
"""

from __future__ import annotations

import os
import sys

from fleetlens.probe import agent as agent_mod
from fleetlens.probe.cli import main

_T0 = int(os.environ["SY_INJECT_T0_NS"])
_build = agent_mod.Agent._build


def _build_anchored(self, plan, nics):  # type: ignore[no-untyped-def]
    _build(self, plan, nics)
    self.path.engine.set_injection(self.cfg.clock_offset_ns, self.cfg.clock_drift_ppb, _T0)


agent_mod.Agent._build = _build_anchored  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
