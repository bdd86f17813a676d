"""The demo's story (fleetlens.demo.story) over a scripted fabric: each step's facts and when
it ends, under the lab's pacing (a step ends when its event is seen) and the simulator's (the
fault starts and ends at fixed seconds). No collector, no root."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from rich.console import Console

from fleetlens.demo.fabric import Evidence, Pacing, Reading, Step, StepRule
from fleetlens.demo.story import Story
from fleetlens.demo.summary import Summary

LINK = "leaf0->spine0"


@dataclass(kw_only=True)
class _Summary(Summary):
    @property
    def checks(self) -> dict[str, bool]:
        return {"localized": self.localized_s is not None}

    def rows(self) -> list[tuple[str, str]]:
        return []


@dataclass
class _Fabric:
    """Readings one story second apart; ``script(t)`` gives (clock error ns, faulty subjects)."""

    pacing: Pacing
    rules: Callable[[Step, float], StepRule]
    script: Callable[[float, list[str]], tuple[float, list[str]]]
    t: float = 0.0
    events: list[tuple[str, float]] = field(default_factory=list)  # (what, when)
    seen: Evidence | None = None

    def start(self) -> _Summary:
        return _Summary(collector="fake")

    def now_s(self) -> float:
        return self.t

    def observe(self) -> Reading:
        self.t += 1
        done = [w for w, _ in self.events]
        err, faulty = self.script(self.t, done)
        links = [x for x in faulty if "->" in x]
        return Reading(self.t, ["a", "b"], np.array([err, -err]), np.ones(2, bool), True,
                       links, [x for x in faulty if x not in links])  # fmt: skip

    def rule(self, step: Step, start_s: float) -> StepRule:
        return self.rules(step, start_s)

    def inject_fault(self) -> dict[str, object]:
        self.events.append(("fault", self.t))
        return {"link": LINK, "kind": "loss", "value": 5.0}

    def heal(self) -> None:
        self.events.append(("heal", self.t))

    def finish(self, s: _Summary, seen: Evidence) -> None:
        self.seen = seen

    def stop(self, keep: bool, s: _Summary | None) -> None:
        pass


def _tell(fabric: _Fabric) -> _Summary:
    return Story(fabric, Console(quiet=True), quiet=True).run()


def _lab_rules(step: Step, start: float) -> StepRule:
    if step == "fault":
        return StepRule(start + 10, settle_s=2)
    return StepRule(start + 20)


def test_lab_pacing_ends_each_step_when_its_event_is_seen() -> None:
    def script(t: float, done: list[str]) -> tuple[float, list[str]]:
        err = 500.0 if t < 3 else 10.0 if t != 5 else 300.0  # good from 3, a bad read at 5
        faulty = ["h1/eth0"] if t < 8 else []  # start-up verdicts clear at 8
        if done == ["fault"]:
            faulty = [LINK]
        return err, faulty

    f = _Fabric(Pacing(100.0, sync_hold_s=2, clean_reads=3, warmup_s=1), _lab_rules, script)
    s = _tell(f)
    # Good at 3-4, bad at 5, good again from 6: converged at 6, held until 8.
    assert s.sync_converged_s == 6.0
    # The baseline starts with the reading at 8 (clean, but only 1 scored reading): clean at 10.
    assert s.baseline_clean_s == 2.0
    assert f.events[0] == ("fault", 10.0)
    assert s.localized_s == 1.0  # named at the first reading after the fault
    assert s.faulty_links == [LINK]  # read settle_s (2) after it was named
    assert f.events[1] == ("heal", 13.0)
    assert s.cleared_s == 1.0
    assert f.seen is not None
    assert [r.t_s for r in f.seen.baseline] == [8.0, 9.0, 10.0]
    assert f.seen.before_fault is not None and f.seen.before_fault.t_s == 10.0
    assert f.seen.other_alarms == set()
    assert s.notes == []


def test_sim_pacing_runs_the_scheduled_steps_to_their_end() -> None:
    def rules(step: Step, start: float) -> StepRule:
        end = {"sync": 5, "baseline": 5, "fault": 8, "heal": 20}[step]
        return StepRule(end, on_event=step in ("sync", "heal"))

    def script(t: float, done: list[str]) -> tuple[float, list[str]]:
        err = 10.0 if t >= 2 else 500.0
        faulty = {2: ["h1/eth0"], 7: [LINK, "spine0->leaf1"], 8: [LINK], 9: [LINK]}
        return err, faulty.get(int(t), [])

    f = _Fabric(Pacing(100.0, clear_all=True), rules, script)
    s = _tell(f)
    assert s.sync_converged_s == 2.0
    assert s.baseline_clean_s == 1.0  # the converging reading (2) was not clean, 3 was
    assert f.events == [("fault", 5.0), ("heal", 8.0)]  # at the scheduled seconds
    assert s.localized_s == 2.0  # named at 7, the fault started at 5
    assert s.faulty_links == [LINK]  # as the fault ends, at 8
    assert s.cleared_s == 2.0  # every verdict healthy at 10
    assert f.seen is not None
    assert f.seen.other_alarms == {"spine0->leaf1"}
    assert [r.t_s for r in f.seen.since_converged] == [float(t) for t in range(2, 11)]
    assert f.seen.before_fault is not None and f.seen.before_fault.t_s == 5.0


def test_a_fault_never_named_is_never_cleared_and_says_so() -> None:
    def rules(step: Step, start: float) -> StepRule:
        end = {"sync": 2, "baseline": 2, "fault": 4, "heal": 8}[step]
        return StepRule(end, on_event=step in ("sync", "heal"))

    f = _Fabric(Pacing(100.0, clear_all=True), rules, lambda t, done: (10.0, []))
    s = _tell(f)
    assert s.localized_s is None and s.cleared_s is None
    assert f.t == 8.0  # the heal step ran to its end
    assert s.notes == [
        f"{LINK} was not localized within 2 s",
        "verdicts not all healthy 4 s after the heal",
    ]
