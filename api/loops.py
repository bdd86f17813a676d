"""The collector's background loops: one thread per loop, woken early when a window
generation is complete or a loop's next time-out is due, and at least every ``interval_s``.

Triangulation and the clock solve run on separate threads: a solve takes seconds of wall time
on a busy host, and a verdict must not wait for it. A failing round is counted and logged,
and the loop tries again at its next wake-up.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from fleetlens.api.metrics import Metrics

log = logging.getLogger("fleetlens.api")
T = TypeVar("T")

Round = Callable[[int], None]  # one round of a loop, given the wall time (ns)
Due = Callable[[int], int | None]  # given the wall time, when a loop's next round is due (ns)
RECHECK_S = 0.1


class Loops:
    def __init__(self, names: tuple[str, ...], interval_s: float, metrics: Metrics) -> None:
        self.interval_s = interval_s
        self.metrics = metrics
        self._wakes = {name: threading.Event() for name in names}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, rounds: dict[str, Round], due: Mapping[str, Due] | None = None) -> None:
        """One thread per round; ``due`` says, for some loops, when they must wake before
        their next tick (None: at the tick)."""
        for name, fn in rounds.items():
            t = threading.Thread(
                target=self._run, args=(name, fn, (due or {}).get(name)),
                name=f"fleetlens-{name}", daemon=True,
            )  # fmt: skip
            t.start()
            self._threads.append(t)

    def wake(self) -> None:
        """Run every loop's round now, not at its next tick."""
        for w in self._wakes.values():
            w.set()

    def pending(self) -> dict[str, bool]:
        """Per loop, whether a wake-up is pending (it has not started that round yet)."""
        return {name: w.is_set() for name, w in self._wakes.items()}

    def clear(self) -> None:
        """Forget pending wake-ups (rounds driven by hand)."""
        for w in self._wakes.values():
            w.clear()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self.wake()
        for t in self._threads:
            t.join(timeout_s)

    def _run(self, name: str, round_fn: Round, due: Due | None) -> None:
        wake = self._wakes[name]
        while not self._stop.is_set():
            self._wait(wake, due)
            wake.clear()
            if self._stop.is_set():
                return
            try:
                round_fn(time.time_ns())
            except Exception:  # e.g. the writer failed to store a round: try again next time
                self.metrics.loop_errors.labels(name).inc()
                log.exception("%s round failed", name)

    def _wait(self, wake: threading.Event, due: Due | None) -> None:
        """Until woken, the tick, or the loop's due time; the due time is read again every
        ``RECHECK_S``, as a generation seen after the wait began brings its own."""
        tick = time.monotonic() + self.interval_s
        target: int | None = None  # the earliest due time seen (wall ns)
        while not wake.is_set():
            left = tick - time.monotonic()
            if due is not None:
                now = time.time_ns()
                at = due(now)
                target = at if target is None else min(target, at or target)
                if target is not None and now >= target:
                    return
                # a ms late: the wall clock the round reads must have passed the time-out
                until = math.inf if target is None else (target - now) / 1e9 + 0.001
                left = min(left, until, RECHECK_S)
            if left <= 0:
                return
            wake.wait(left)


def timed(metrics: Metrics, loop: str, fn: Callable[..., T], *args: object) -> T | None:
    """``fn(*args)`` counted and timed under ``loop``; None (counted, logged) if it raised."""
    t0 = time.perf_counter()
    try:
        return fn(*args)
    except Exception:
        metrics.loop_errors.labels(loop).inc()
        log.exception("loop %s failed", loop)
        return None
    finally:
        metrics.loop_runs.labels(loop).inc()
        metrics.loop_seconds.labels(loop).observe(time.perf_counter() - t0)
