"""Which flows the agent traces, and when: the retry and refresh schedule of path discovery."""

from __future__ import annotations

from fleetlens.probe.pathfind import RETRY_S, PathSchedule, Trace

REFRESH_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _traces(n: int, first_id: int = 0) -> list[Trace]:
    return [
        Trace(first_id + i, "10.0.0.1", "eth0", "10.0.4.1", "h05/eth0", 40000 + i) for i in range(n)
    ]


def _pass(
    s: PathSchedule, clock: Clock, traces: list[Trace], unanswered: set[int]
) -> tuple[list[int], float]:
    """One pass of the agent's loop; the ports of the traced flows and the wait it chose."""
    todo = s.todo(traces)
    s.learned(todo, {t.flow: ["a->b"] for t in todo if t.sport not in unanswered})
    wait = s.wait_s(traces)
    clock.now += wait
    s.woken(False)
    return [t.sport for t in todo], wait


def test_only_unanswered_flows_are_retried_and_ever_less_often() -> None:
    clock, traces = Clock(), _traces(6)
    s = PathSchedule(REFRESH_S, clock)
    traced, wait = _pass(s, clock, traces, unanswered={40001, 40004})
    assert len(traced) == 6 and wait == RETRY_S
    traced, wait = _pass(s, clock, traces, unanswered={40004})  # 40001 answers this time
    assert traced == [40001, 40004] and wait == 2 * RETRY_S
    waits = [_pass(s, clock, traces, unanswered={40004})[1] for _ in range(8)]
    assert waits[:3] == [4 * RETRY_S, 8 * RETRY_S, 16 * RETRY_S]
    assert max(waits) == REFRESH_S  # a black hole is asked again at most every refresh


def test_every_flow_again_on_refresh_and_when_woken() -> None:
    clock, traces = Clock(), _traces(4)
    s = PathSchedule(REFRESH_S, clock)
    assert _pass(s, clock, traces, unanswered=set()) == ([40000, 40001, 40002, 40003], REFRESH_S)
    assert len(_pass(s, clock, traces, unanswered={40002})[0]) == 4  # the refresh: all of them
    # Woken (a route change) while a flow still lacks a path: every flow, and a fresh backoff.
    todo = s.todo(traces)
    s.learned(todo, {})
    s.wait_s(traces)
    s.woken(True)
    assert len(s.todo(traces)) == 4
    s.learned(traces, {t.flow: ["a->b"] for t in traces[:3]})
    assert s.wait_s(traces) == RETRY_S


def test_a_refresh_that_loses_a_path_retries_it() -> None:
    clock, traces = Clock(), _traces(3)
    s = PathSchedule(REFRESH_S, clock)
    _pass(s, clock, traces, unanswered=set())
    traced, wait = _pass(s, clock, traces, unanswered={40000})  # the refresh: 40000 unanswered
    assert len(traced) == 3 and wait == RETRY_S
    assert _pass(s, clock, traces, unanswered=set())[0] == [40000]


def test_flows_are_known_by_identity_across_a_rebuild() -> None:
    clock = Clock()
    s = PathSchedule(REFRESH_S, clock)
    _pass(s, clock, _traces(3), unanswered={40002})
    # The data path was rebuilt (new ids), not woken: the answered flows stay known.
    assert [t.sport for t in s.todo(_traces(3, first_id=10))] == [40002]
