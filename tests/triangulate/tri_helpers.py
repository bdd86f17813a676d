"""Drive the simulator window by window through a Triangulator and score against truth."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator, SimWindow
from fleetlens.triangulate.config import TriangulateConfig
from fleetlens.triangulate.engine import Triangulator

from fleetlens.records import WINDOW_SCHEMA, Verdict
from fleetlens.topology import Topology, from_spec

SMALL = "leafspine:hosts=32,nics=2,leaves=8,spines=4"
# The sweeps' bounds (issue 28), the lab sweep's and the simulator sweep's
LOCALIZE_S = 5.0  # the faulted link (or its group) faulty within this many s of the start
CLEAR_S = 30.0  # and no longer faulty from at most this many s after the heal on


@dataclass
class SweepResult:
    """One sweep scenario against the bounds: localized within ``LOCALIZE_S`` (s from the
    fault's start), faulty in every sample from then to the heal (``hold_pct`` 100), nothing
    outside the faulted link's ambiguity group (``group``, which contains it) ever faulty
    (``false_links``), not faulty from ``clear_s`` <= ``CLEAR_S`` after the heal on (None:
    still faulty at the end). ``note`` says what went wrong, and when."""

    localize_s: float | None = None
    hold_pct: float | None = None
    false_links: list[str] = field(default_factory=list)
    clear_s: float | None = None
    group: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def passed(self) -> bool:
        return (
            self.localize_s is not None
            and self.localize_s <= LOCALIZE_S
            and self.hold_pct == 100.0
            and not self.false_links
            and self.clear_s is not None
            and self.clear_s <= CLEAR_S
        )

    def check(self, link: str) -> None:
        """The bounds as asserts, each with what failed."""
        assert link in self.group, (link, self.group)
        assert self.localize_s is not None, f"{link} never faulty"
        assert self.localize_s <= LOCALIZE_S, f"{link} localized after {self.localize_s:.1f} s"
        assert self.hold_pct == 100.0, f"{link} held {self.hold_pct:.0f} %: {self.note}"
        assert not self.false_links, f"faulty outside {self.group}: {self.note}"
        assert self.clear_s is not None, f"{link} still faulty at the end: {self.note}"
        assert self.clear_s <= CLEAR_S, f"{link} cleared after {self.clear_s:.1f} s"


def small() -> Topology:
    return from_spec(SMALL)


def fabric_links(topo: Topology) -> list[str]:
    return [lk.id for lk in topo.links if lk.tier == "fabric"]


@dataclass
class Step:
    window: SimWindow
    verdicts: list[Verdict]
    bad: dict[str, Verdict] = field(default_factory=dict)  # non-healthy, by subject

    def faulty(self, kinds=("link", "switch")) -> set[str]:
        return {s for s, v in self.bad.items() if v.state == "faulty" and v.kind in kinds}

    def reported(self, kinds=("link", "switch", "nic", "host")) -> set[str]:
        return {s for s, v in self.bad.items() if v.kind in kinds}


def drive(
    topo: Topology,
    faults: tuple[str, ...] = (),
    seconds: float = 3.0,
    window_s: float = 1.0,
    seed: int = 0,
    paths: str = "known",  # 'known' | 'first' (reported once, then null) | 'unknown'
    config: TriangulateConfig | None = None,
    mutate: Callable[[pa.Table], pa.Table] | None = None,
    **sim: object,
) -> list[Step]:
    cfg = SimConfig(
        faults=faults, paths_known=paths != "unknown", window_ns=round(window_s * 1e9), **sim
    )
    tri = Triangulator(topo, config)
    prev: dict[str, Verdict] = {}
    out = []
    for w in Simulator(topo, cfg, seed=seed).stream(seconds):
        t = w.windows.select(WINDOW_SCHEMA.names)
        if paths == "first" and w.index > 0:
            t = t.set_column(
                t.schema.get_field_index("path"), "path", pa.nulls(t.num_rows, t["path"].type)
            )
        if mutate is not None:
            t = mutate(t)
        verdicts = tri(t, topo, prev)
        prev = {v.subject: v for v in verdicts}
        out.append(Step(w, verdicts, {v.subject: v for v in verdicts if v.state != "healthy"}))
    return out


def truth_links(step: Step) -> set[str]:
    t = step.window.truth_links
    return set(np.array(t["link_id"].to_pylist())[t["faulty"].to_numpy(zero_copy_only=False)])


def prf(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    p = tp / (tp + fp) if tp + fp else 1.0
    r = tp / (tp + fn) if tp + fn else 1.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def score(found: set[str], truth: set[str]) -> tuple[int, int, int]:
    return len(found & truth), len(found - truth), len(truth - found)
