"""The lab fabric and stack that test_triangulate_lab.py and the lab sweep's representative
shape (test_lab_sweep.py) both judge: 8 hosts x 2 NICs, rail wiring, 4 leaves, 2 spines, the
collector with the lab's background loss, one agent per host without primers, clean, synced
and warmed up. conftest.py builds it once for both modules (its start-up, ~17 s, was paid
twice) and closes it as soon as the next test does not use it."""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from pathlib import Path

from collector_waits import all_synced, get_json, until
from fleetlens.fixtures.lab.defaults import LAB_BACKGROUND_LOSS
from fleetlens.fixtures.lab.fabric import lab_fabric
from fleetlens.fixtures.lab.stack import Stack, lab_stack
from fleetlens.fixtures.lab.state import LabShape

HOSTS = 8
RAIL: LabShape = {"hosts": HOSTS, "nics": 2, "leaves": 4, "spines": 2, "wiring": "rail"}
BASELINE_S = 120.0  # clean and synced from the agents' start
# Each flow needs a few windows for its delay baseline once its delays count as evidence.
WARMUP_S = 6.0


def clean(st: Stack) -> bool:
    """No faulty link or NIC, and every host's delays count as evidence."""
    faulty = (get_json(st.url, f"/v1/{what}?state=faulty&limit=1") for what in ("links", "nics"))
    return not any(faulty) and all_synced(st.url, len(st.lab.topo.hosts))


class RailStack:
    """The shared stack, built on first use; :meth:`close` takes it down (a later use builds
    a fresh one)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.builds = 0
        self.st: Stack | None = None
        self.exits = ExitStack()

    def get(self) -> Stack:
        if self.st is None:
            self.builds += 1
            with ExitStack() as exits:
                lab = exits.enter_context(lab_fabric(f"t{os.getpid() % 100000}", **RAIL))
                args = ["--background-loss", str(LAB_BACKGROUND_LOSS)]
                work = self.work / f"run{self.builds}"
                st = exits.enter_context(lab_stack(lab, work, collector_args=args))
                # No primers (``--primer``): eight agents and the collector share two vCPUs
                # here, and the primers' 1.33x agent CPU delayed the collector's rounds: 2 %
                # loss localized in 1.3-5.9 s (once > 7 s) over 7 runs with them, 1.3-2.6 s
                # over 4 without. What these tests check does not need them: the clocks sync
                # and are trusted without (several peers per NIC leave ~half the pairs pure).
                for h in lab.topo.hosts:
                    st.start_agent(h, "--primer", "off")
                until(lambda: clean(st), BASELINE_S, "a clean, synced baseline")
                time.sleep(WARMUP_S)
                self.exits = exits.pop_all()
            self.st = st
        return self.st

    def close(self) -> None:
        self.st = None
        self.exits.close()
