"""Issue 28's lab sweep: one fault per scenario on lab fabrics of several shapes, judged
through the collector's REST API.

A scenario is a fabric shape (rail or host wiring, 2-4 leaves, 2-4 spines, 8 hosts) and one
fault (loss 1/5/20 %, a black hole = loss 100 %, or delay 100/500 us) on an uplink
(leaf->spine), a downlink (spine->leaf) or an access link (NIC->leaf). The table is a trimmed
cross product: every value of every dimension appears, not every combination. Each scenario
holds the fault ``LOCALIZE_S + HOLD_S`` seconds, heals it, watches ``AFTER_HEAL_S`` more, and
asserts the issue's bounds:

- the faulted link is ``faulty`` within ``LOCALIZE_S`` (for an access link its NIC's verdict
  counts too: the engine may put it on the host side);
- it stays ``faulty`` at every poll from then until the heal (hold 100 %);
- nothing outside its ambiguity group (``group_members`` of the faulted link's row, which must
  contain it) is ever ``faulty`` from injection to ``AFTER_HEAL_S`` after the heal;
- it is not ``faulty`` from at most ``CLEAR_S`` after the heal on.

Each result is recorded before the asserts and the table is printed at the end (``-s``).
Scenarios sharing a shape share one lab and stack; the representative shape's is the one
test_triangulate_lab.py uses too (lab_pool.py), built once for both. ``pytest`` runs only the
representative scenario (marker ``sweep_ci``); ``pytest -m sweep`` runs them all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fleetlens.fixtures.lab import faults
from fleetlens.fixtures.lab.defaults import LAB_BACKGROUND_LOSS
from fleetlens.fixtures.lab.fabric import Lab, lab_fabric
from fleetlens.fixtures.lab.stack import Stack, lab_stack
from lab_pool import BASELINE_S, RAIL, WARMUP_S, RailStack, clean
from tri_helpers import CLEAR_S, LOCALIZE_S, SweepResult

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces"),
]
NAME = f"w{os.getpid() % 100000}"
HOSTS = 8
HOLD_S = 60.0
AFTER_HEAL_S = 30.0
POLL_S = 0.5


@dataclass(frozen=True)
class Shape:
    wiring: str
    leaves: int
    spines: int

    @property
    def nics(self) -> int:
        # rail wiring needs leaves divisible by NICs per host: 3 leaves take one NIC per host
        return 1 if self.wiring == "rail" and self.leaves % 2 else 2

    def __str__(self) -> str:
        return f"{self.wiring} {self.leaves}L{self.spines}S"


@dataclass(frozen=True)
class Scenario:
    shape: Shape
    kind: str  # "loss" (pct; 100 = black hole) or "delay" (us)
    size: float
    where: str  # "up" | "down" | "access"

    @property
    def fault(self) -> str:
        if self.kind == "loss":
            return "black hole" if self.size >= 100 else f"loss {self.size:g}%"
        return f"delay {self.size:g}us"

    def __str__(self) -> str:
        return f"{self.shape} {self.fault} {self.where}".replace(" ", "-")


def _sc(wiring: str, leaves: int, spines: int, kind: str, size: float, where: str) -> Scenario:
    return Scenario(Shape(wiring, leaves, spines), kind, size, where)


REPRESENTATIVE = _sc("rail", 4, 2, "loss", 5, "up")
# The shape whose lab and stack test_triangulate_lab.py shares (lab_pool.RAIL).
POOLED = Shape(RAIL["wiring"], RAIL["leaves"], RAIL["spines"])
assert (RAIL["hosts"], RAIL["nics"]) == (HOSTS, POOLED.nics) and REPRESENTATIVE.shape == POOLED
# Grouped by shape (one lab each); every wiring, leaf/spine count, fault and place appears.
SCENARIOS = [
    REPRESENTATIVE,
    _sc("rail", 4, 2, "delay", 500, "down"),
    _sc("rail", 4, 2, "loss", 20, "access"),
    _sc("rail", 2, 2, "loss", 5, "up"),
    _sc("rail", 2, 2, "delay", 100, "down"),
    _sc("host", 3, 3, "loss", 1, "down"),
    _sc("host", 3, 3, "loss", 100, "up"),
    _sc("host", 4, 4, "loss", 20, "up"),
    _sc("host", 4, 4, "delay", 100, "access"),
    _sc("rail", 3, 4, "loss", 1, "up"),
    _sc("rail", 3, 4, "delay", 500, "up"),
    _sc("host", 2, 3, "loss", 100, "down"),
    _sc("host", 2, 3, "loss", 5, "access"),
]


def _params() -> list[pytest.param]:  # type: ignore[type-arg]
    marks = {True: [pytest.mark.sweep, pytest.mark.sweep_ci], False: [pytest.mark.sweep]}
    return [pytest.param(s, id=str(s), marks=marks[s == REPRESENTATIVE]) for s in SCENARIOS]


@dataclass(kw_only=True)
class Result(SweepResult):
    scenario: Scenario

    def row(self) -> str:
        def f(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        s = self.scenario
        return (
            f"| {s.shape} | {s.fault} | {s.where} | {f(self.localize_s, '.1f')} | "
            f"{f(self.hold_pct, '.0f')} | {', '.join(self.false_links) or 'none'} | "
            f"{f(self.clear_s, '.1f')} | {len(self.group) or 1} | "
            f"{'pass' if self.passed else 'FAIL'} |"
        )


HEADER = (
    "| shape | fault | on | localized (s) | hold % | false links | cleared (s) | group | result |\n"
    "|---|---|---|---|---|---|---|---|---|"
)
RESULTS: list[Result] = []


class Stacks:
    """One lab and stack at a time, rebuilt when the next scenario's shape differs; the pooled
    shape's comes from the pool (and stays there for test_triangulate_lab.py)."""

    def __init__(self, work: Path, pool: RailStack) -> None:
        self.work = work
        self.pool = pool
        self.shape: Shape | None = None
        self.st: Stack | None = None
        self.exits = ExitStack()

    def get(self, shape: Shape) -> Stack:
        if shape == POOLED:
            self.close()
            return self.pool.get()
        if shape != self.shape or self.st is None:
            self.close()
            self.pool.close()
            self.exits = ExitStack()
            self.shape, self.st = shape, self._up(shape)
        return self.st

    def _up(self, shape: Shape) -> Stack:
        dims = {"leaves": shape.leaves, "spines": shape.spines, "wiring": shape.wiring}
        lab = self.exits.enter_context(lab_fabric(NAME, hosts=HOSTS, nics=shape.nics, **dims))
        work = self.work / f"{shape.wiring}{shape.leaves}{shape.spines}"
        args = ["--background-loss", str(LAB_BACKGROUND_LOSS)]
        st = self.exits.enter_context(lab_stack(lab, work, collector_args=args))
        for h in lab.topo.hosts:  # no primers: as in test_triangulate_lab.py, CPU is short
            st.start_agent(h, "--primer", "off")
        _wait(lambda: clean(st), BASELINE_S, f"a clean, synced baseline on {shape}")
        time.sleep(WARMUP_S)
        return st

    def close(self) -> None:
        self.shape, self.st = None, None
        self.exits.close()


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory, rail_pool: RailStack) -> Iterator[Stacks]:
    pool = Stacks(tmp_path_factory.mktemp("sweep"), rail_pool)
    try:
        yield pool
    finally:
        pool.close()
        print("\n" + HEADER + "\n" + "\n".join(r.row() for r in RESULTS))
        for r in RESULTS:
            if r.note:
                print(f"{r.scenario}: {r.note}")


def _get(st: Stack, path: str) -> list[dict]:  # type: ignore[type-arg]
    r = httpx.get(st.url + path, timeout=10)
    r.raise_for_status()
    return r.json()


def _faulty(st: Stack) -> tuple[set[str], set[str]]:
    links = _get(st, "/v1/links?state=faulty&limit=1000")
    nics = _get(st, "/v1/nics?state=faulty&limit=1000")
    return {r["link_id"] for r in links}, {r["nic_id"] for r in nics}


def _wait(cond: object, timeout_s: float, what: str) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.25)
    raise AssertionError(f"no {what} within {timeout_s} s")


@dataclass(frozen=True)
class Sample:
    t: float  # s since injection
    links: frozenset[str]
    nics: frozenset[str]
    group: frozenset[str]  # the faulted link's group_members (empty: named alone)


def _sample(st: Stack, t0: float, link: str) -> Sample:
    rows = _get(st, "/v1/links?limit=1000")
    faulty = frozenset(r["link_id"] for r in rows if r["state"] == "faulty")
    group = next((r.get("group_members") or [] for r in rows if r["link_id"] == link), [])
    _, nics = _faulty(st)
    return Sample(time.monotonic() - t0, faulty, frozenset(nics), frozenset(group))


def _observe(st: Stack, t0: float, until: float, link: str) -> list[Sample]:
    out = []
    while time.monotonic() - t0 < until:
        out.append(_sample(st, t0, link))
        time.sleep(POLL_S)
    return out


def _target(lab: Lab, s: Scenario) -> tuple[str, str | None]:
    """The faulted link and, for an access link, the NIC whose verdict also counts."""
    leaf, spine = f"leaf{s.shape.leaves - 1}", f"spine{s.shape.spines - 1}"
    if s.where == "up":
        return f"{leaf}->{spine}", None
    if s.where == "down":
        return f"{spine}->{leaf}", None
    nic = lab.topo.nics_by_host[lab.topo.hosts[HOSTS // 2]][0]
    return f"{nic.id}->{nic.leaf}", nic.id


def _judge(res: Result, link: str, nic: str | None, fault: list[Sample], after: list[Sample],
           heal_t: float) -> None:  # fmt: skip
    def hit(x: Sample) -> bool:
        return link in x.links or (nic is not None and nic in x.nics)

    group = {link}.union(*(x.group for x in fault + after))
    res.group = sorted(group)
    first = next((x for x in fault if hit(x)), None)
    if first is not None:
        res.localize_s = first.t
        if link not in first.links:
            res.note += f"named as NIC {nic}; "
        held = [x for x in fault if x.t >= first.t]
        res.hold_pct = 100.0 * sum(map(hit, held)) / len(held)
        gaps = [round(x.t, 1) for x in held if not hit(x)]
        if gaps:
            res.note += f"not faulty at t={gaps[:5]}{'...' if len(gaps) > 5 else ''}; "
    false: dict[str, list[float]] = {}  # first and last poll it was wrongly faulty
    for x in fault + after:
        others = (x.links - group) | (x.nics - ({nic} if nic else set()))
        for o in others:
            false.setdefault(o, [x.t, x.t])[1] = x.t
    res.false_links = sorted(false)
    if false:
        res.note += f"heal at t={heal_t:.1f}; false: " + ", ".join(
            f"{o} at t={a:.1f}-{b:.1f}" for o, (a, b) in false.items()
        )
    last_hit = max((x.t for x in after if hit(x)), default=None)
    if last_hit is None:
        res.clear_s = after[0].t - heal_t if after else None
    elif after and last_hit < after[-1].t:
        res.clear_s = next(x.t for x in after if x.t > last_hit) - heal_t


def _inject(lab: Lab, s: Scenario, link: str) -> None:
    if s.kind == "loss":
        faults.add_loss(lab, link, s.size)
    else:
        faults.add_delay(lab, link, s.size)


@pytest.mark.parametrize("scenario", _params())
def test_fault_is_localized_held_and_cleared(stacks: Stacks, scenario: Scenario) -> None:
    st = stacks.get(scenario.shape)
    lab = st.lab
    _wait(lambda: not any(_faulty(st)), CLEAR_S, "a clean start")
    link, nic = _target(lab, scenario)
    res = Result(scenario=scenario)
    RESULTS.append(res)
    try:
        t0 = time.monotonic()
        _inject(lab, scenario, link)
        fault = _observe(st, t0, LOCALIZE_S + HOLD_S, link)
    finally:
        faults.heal(lab)
    heal_t = time.monotonic() - t0
    after = _observe(st, t0, heal_t + AFTER_HEAL_S, link)
    _judge(res, link, nic, fault, after, heal_t)
    print(f"\n{HEADER}\n{res.row()}\n{res.note}")
    res.check(link)
