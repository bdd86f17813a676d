"""Issue 28's lab-sweep scenarios on the simulator at 1024 hosts, paths unknown and known.

The engine (``Triangulator``, the collector's default config) is fed the simulator's windows
directly, one 1 s window at a time, no collector process. Clocks are the simulator's
``truth`` (every agent synced and live from the first window), so the collector's clock gate
(``api/clockgate.py``) would pass every row unchanged and is not applied. Every link has a
background loss of ``BASE_LOSS``, so a lost probe alone must raise nothing.

A scenario is the lab sweep's (``test_lab_sweep.py``): rail or host wiring, one fault (loss
1/5/20 %, a black hole, delay 100/500 us) on an uplink (leaf->spine), a downlink
(spine->leaf) or an access link (NIC->leaf). The lab's 4-leaf shapes become the reference
fabric (1024 hosts x 8 NICs, 32 leaves, 8 spines) in their wiring, and run again on their own
leaves and spines at 1024 hosts with one NIC each, where the full timeline is affordable; the
2- and 3-leaf shapes, whose point is the leaf count (ties), keep their leaves and spines at
1024 hosts with one NIC each (the topology addresses at most 512 NICs per leaf; with one NIC,
rail and host wiring are the same fabric). Each runs twice:

- ``unknown``: the agents report no path (a row per source port, ``path`` null): the engine
  has the ECMP candidates only;
- ``known``: the agents' path discovery, a row per (pair, path) with the path given.

Simulated time: ``warm`` clean seconds, the fault for ``fault`` seconds, ``after`` seconds
past the heal. The 1-NIC shapes run the lab sweep's durations (60 s of fault, 30 s after the
heal; ~1 CPU-s a window); the reference fabric, at ~15-20 CPU-s a window, runs what a 2-core
box affords (6 s and 7 s). Against the injected truth, per window (verdicts after a window
count at its end):

- the faulted link is ``faulty`` within ``LOCALIZE_S`` of the fault's start (for an access
  link its NIC's verdict counts too, as in the lab sweep);
- it stays ``faulty`` in every window from then until the heal (hold 100 %);
- nothing outside its ambiguity group (the links sharing the faulted link's ``group_id``,
  which must contain it) is ``faulty`` (links, switches, NICs, hosts) from the fault's start
  to the end of the run (``after`` s past the heal);
- it is not ``faulty`` from at most ``after`` s (<= 30 s) after the heal on.

``pytest`` runs the representative subset (marker ``sweep_ci``): one 2-leaf scenario on a
shortened timeline (10 s of fault, 15 s after), so the suite stays short; ``pytest -m sweep``
runs every scenario on its full timeline, and that short one too.
``python tests/triangulate/test_sim_sweep.py [-k TEXT]`` prints the README's table for the
scenarios whose id contains TEXT.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import pytest
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator
from fleetlens.triangulate.engine import Triangulator
from tri_helpers import SweepResult

from fleetlens.records import WINDOW_SCHEMA, Verdict
from fleetlens.topology import Topology, from_spec

HOSTS = 1024
BASE_LOSS = 1e-5  # per link, as in test_tri_hold.py's 192-link runs
SEED = 28


@dataclass(frozen=True)
class Timeline:
    warm: int  # clean windows before the fault
    fault: int  # windows the fault lasts
    after: int  # windows simulated past the heal

    @property
    def seconds(self) -> int:
        return self.warm + self.fault + self.after


SMALL_RUN = Timeline(warm=5, fault=60, after=30)  # the lab sweep's hold and clear bounds
QUICK_RUN = Timeline(warm=5, fault=10, after=15)  # the CI's representative run
REFERENCE_RUN = Timeline(warm=2, fault=6, after=7)


@dataclass(frozen=True)
class Shape:
    wiring: str
    leaves: int
    spines: int
    nics: int

    @property
    def spec(self) -> str:
        return (
            f"leafspine:hosts={HOSTS},nics={self.nics},leaves={self.leaves},"
            f"spines={self.spines},wiring={self.wiring}"
        )

    @property
    def size(self) -> str:
        return f"{HOSTS}x{self.nics}, {self.leaves}L {self.spines}S"

    @property
    def timeline(self) -> Timeline:
        return REFERENCE_RUN if self.leaves == 32 else SMALL_RUN

    def __str__(self) -> str:
        return f"{self.wiring} {self.leaves}L{self.spines}S{self.nics}N"


def reference(wiring: str) -> Shape:
    return Shape(wiring, 32, 8, 8)


def small(wiring: str, leaves: int, spines: int) -> Shape:
    # one NIC per host: fleetlens.topology addresses at most 512 NICs per leaf
    return Shape(wiring, leaves, spines, 1)


@dataclass(frozen=True)
class Scenario:
    shape: Shape
    kind: str  # "loss" (pct; 100 = black hole) or "delay" (us)
    size: float
    where: str  # "up" | "down" | "access"
    paths: str  # "unknown" | "known"
    quick: bool = False  # on QUICK_RUN, not the shape's timeline

    @property
    def timeline(self) -> Timeline:
        return QUICK_RUN if self.quick else self.shape.timeline

    @property
    def fault(self) -> str:
        if self.kind == "loss":
            return "black hole" if self.size >= 100 else f"loss {self.size:g}%"
        return f"delay {self.size:g}us"

    def spec(self, link: str, tl: Timeline) -> str:
        """The simulator's fault spec for this scenario on ``link``."""
        if self.kind == "delay":
            what = f"delay_us={self.size:g}"
        else:
            what = "blackhole" if self.size >= 100 else f"loss={self.size / 100:g}"
        return f"{link}:{what}:start_s={tl.warm},end_s={tl.warm + tl.fault}"

    def __str__(self) -> str:
        quick = " quick" if self.quick else ""
        return f"{self.shape} {self.fault} {self.where} {self.paths}{quick}".replace(" ", "-")


def _lab(shape: Shape, kind: str, size: float, where: str) -> list[Scenario]:
    return [Scenario(shape, kind, size, where, p) for p in ("unknown", "known")]


RAIL, HOST = reference("rail"), reference("host")
# The lab sweep's list, in its order, each with paths unknown and known.
SCENARIOS = [
    *_lab(RAIL, "loss", 5, "up"),
    *_lab(RAIL, "delay", 500, "down"),
    *_lab(RAIL, "loss", 20, "access"),
    *_lab(small("rail", 2, 2), "loss", 5, "up"),
    *_lab(small("rail", 2, 2), "delay", 100, "down"),
    *_lab(small("host", 3, 3), "loss", 1, "down"),
    *_lab(small("host", 3, 3), "loss", 100, "up"),
    *_lab(HOST, "loss", 20, "up"),
    *_lab(HOST, "delay", 100, "access"),
    *_lab(small("rail", 3, 4), "loss", 1, "up"),
    *_lab(small("rail", 3, 4), "delay", 500, "up"),
    *_lab(small("host", 2, 3), "loss", 100, "down"),
    *_lab(small("host", 2, 3), "loss", 5, "access"),
    # the 4-leaf scenarios again at one NIC a host: the lab sweep's timeline (60 s + 30 s),
    # which the reference fabric's cost a window does not afford
    *_lab(small("rail", 4, 2), "loss", 5, "up"),
    *_lab(small("rail", 4, 2), "delay", 500, "down"),
    *_lab(small("rail", 4, 2), "loss", 20, "access"),
    *_lab(small("host", 4, 4), "loss", 20, "up"),
    *_lab(small("host", 4, 4), "delay", 100, "access"),
    # CI: a 2-leaf run with paths unknown, shortened (~23 s): a tie group, ECMP-spread rows and
    # the per-hop background at once
    Scenario(small("rail", 2, 2), "loss", 5, "up", "unknown", quick=True),
]
# Measured failures of the engine, diagnosed in docs/notes/triangulate.md (the sim sweep);
# strict, so a fix shows up as XPASS and the marker must go.
FAILS: dict[str, str] = {}  # none at present (the last: spread rows, evidence.py)
REPRESENTATIVE = {s for s in SCENARIOS if s.quick}


@dataclass(kw_only=True)
class Result(SweepResult):
    scenario: Scenario
    link: str = ""
    timeline: Timeline
    cpu_s: float = 0.0

    def row(self) -> str:
        def f(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        s, tl = self.scenario, self.timeline
        false = ", ".join(self.false_links[:4]) + (" ..." if len(self.false_links) > 4 else "")
        return (
            f"| {s.shape.wiring} | {s.shape.size} | {s.fault} | {s.where} "
            f"`{self.link}` | {s.paths} | {f(self.localize_s, '.0f')} | "
            f"{f(self.hold_pct, '.0f')} | {false or 'none'} | "
            f"{f(self.clear_s, '.0f')} (of {tl.after}) | {len(self.group) or 1} | "
            f"{'pass' if self.passed else 'FAIL'} |"
        )


HEADER = (
    "| wiring | shape | fault | on | paths | localized (s) | hold % | false links | "
    "cleared (s) | group | result |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def target(topo: Topology, s: Scenario) -> tuple[str, str | None]:
    """The faulted link (the lab sweep's: last leaf, last spine, a NIC of the middle host)
    and, for an access link, the NIC whose verdict also counts."""
    leaf, spine = f"leaf{s.shape.leaves - 1}", f"spine{s.shape.spines - 1}"
    if s.where == "up":
        return f"{leaf}->{spine}", None
    if s.where == "down":
        return f"{spine}->{leaf}", None
    nic = topo.nics_by_host[topo.hosts[HOSTS // 2]][0]
    return f"{nic.id}->{nic.leaf}", nic.id


@dataclass(frozen=True)
class Seen:
    """The verdicts after one window: faulty subjects and the faulted link's group."""

    t: int  # s from the fault's start to the window's end
    faulty: frozenset[str]  # links, switches, NICs and hosts
    group: frozenset[str]  # links sharing the faulted link's group_id (empty: none)


def _seen(t: int, verdicts: list[Verdict], link: str) -> Seen:
    faulty = frozenset(v.subject for v in verdicts if v.state == "faulty")
    gid = next((v.group_id for v in verdicts if v.subject == link), None)
    group = frozenset(v.subject for v in verdicts if gid is not None and v.group_id == gid)
    return Seen(t, faulty, group)


def run(s: Scenario, base_loss: float = BASE_LOSS) -> Result:
    """Simulate the scenario window by window through one Triangulator and judge it."""
    cpu0 = time.process_time()
    tl = s.timeline
    topo = from_spec(s.shape.spec)
    link, nic = target(topo, s)
    cfg = SimConfig(faults=(s.spec(link, tl),), paths_known=s.paths == "known", base_loss=base_loss)
    tri = Triangulator(topo)
    prev: dict[str, Verdict] = {}
    seen = []
    for w in Simulator(topo, cfg, seed=SEED).stream(tl.seconds):
        t = w.windows.select(WINDOW_SCHEMA.names)
        if s.paths == "unknown":  # what the simulator leaves null already; made explicit
            assert t["path"].null_count == t.num_rows
        verdicts = tri(t, topo, prev)
        prev = {v.subject: v for v in verdicts}
        seen.append(_seen(w.index + 1 - tl.warm, verdicts, link))
    res = judge(Result(scenario=s, link=link, timeline=tl), seen, nic)
    res.cpu_s = time.process_time() - cpu0
    return res


def judge(res: Result, seen: list[Seen], nic: str | None) -> Result:
    """Score the windows from the fault's start on (``t`` > 0) against the bounds."""
    link, tl = res.link, res.timeline
    fault = [x for x in seen if 0 < x.t <= tl.fault]
    after = [x for x in seen if x.t > tl.fault]

    def hit(x: Seen) -> bool:
        return link in x.faulty or (nic is not None and nic in x.faulty)

    group = {link}.union(*(x.group for x in fault + after))
    res.group = sorted(group)
    first = next((x for x in fault if hit(x)), None)
    if first is not None:
        res.localize_s = float(first.t)
        if link not in first.faulty:
            res.note += f"named as NIC {nic}; "
        held = [x for x in fault if x.t >= first.t]
        res.hold_pct = 100.0 * sum(map(hit, held)) / len(held)
        gaps = [x.t for x in held if not hit(x)]
        if gaps:
            res.note += f"not faulty at t={gaps}; "
    false: dict[str, list[int]] = {}  # first and last window end it was wrongly faulty
    for x in fault + after:
        for o in x.faulty - group - ({nic} if nic else set()):
            false.setdefault(o, [x.t, x.t])[1] = x.t
    res.false_links = sorted(false)
    warm = [x for x in seen if x.t <= 0]  # the last clean window: alarms the fault did not raise
    before = sorted(set(false) & warm[-1].faulty) if warm else []
    if before:
        res.note += f"faulty before the fault too: {', '.join(before[:8])}; "
    if false:
        res.note += f"heal at t={tl.fault}; false: " + ", ".join(
            f"{o} t={a}-{b}" for o, (a, b) in sorted(false.items())[:8]
        )
    last_hit = max((x.t for x in after if hit(x)), default=None)
    if last_hit is None:
        res.clear_s = 0.0 if after else None
    elif last_hit < after[-1].t:
        res.clear_s = float(last_hit + 1 - tl.fault)
    return res


def _marks(s: Scenario) -> list[pytest.MarkDecorator]:
    marks = [pytest.mark.sweep] + ([pytest.mark.sweep_ci] if s in REPRESENTATIVE else [])
    if str(s) in FAILS:
        marks.append(pytest.mark.xfail(strict=True, reason=FAILS[str(s)]))
    return marks


def _params() -> list[pytest.param]:  # type: ignore[type-arg]
    return [pytest.param(s, id=str(s), marks=_marks(s)) for s in SCENARIOS]


@pytest.mark.parametrize("scenario", _params())
def test_sim_fault_is_localized_held_and_cleared(scenario: Scenario) -> None:
    res = run(scenario)
    print(f"\n{HEADER}\n{res.row()}\n{res.note}")
    res.check(res.link)


def main() -> None:
    ap = argparse.ArgumentParser(description="the simulator sweep's table (README)")
    ap.add_argument("-k", default="", help="only scenarios whose id contains this text")
    ap.add_argument("--base-loss", type=float, default=BASE_LOSS, help="per link (diagnosis)")
    args = ap.parse_args()
    print(HEADER, flush=True)
    for s in SCENARIOS:
        if args.k in str(s):
            res = run(s, args.base_loss)
            print(f"{res.row()} <!-- {res.cpu_s:.0f} CPU-s -->", flush=True)
            if res.note:
                print(f"<!-- {s}: {res.note} -->", flush=True)


if __name__ == "__main__":
    main()
