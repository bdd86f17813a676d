"""The demo's story, told once over any :class:`~fleetlens.demo.fabric.DemoFabric`.

1. **sync**: the clocks converge — every host scored and the p99 error against the injected
   truth within the fabric's bound, held for ``sync_hold_s``.
2. **baseline**: no link or NIC faulty (start-up verdicts cleared), with enough scored clock
   readings and warm-up for the collector's per-flow delay baselines.
3. **fault**: a fault goes on one leaf–spine link; the time until the REST API names it, and
   what it names as the fault ends (the link, and nothing else).
4. **heal**: the fault is removed; the time until the verdicts are healthy again.

Then the fabric scores the clocks its own way and runs its own last steps (LinkPass on the
lab). Anything faulty after the baseline was clean, other than the faulted link, is an alarm.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Generic

from rich.console import Console

from fleetlens.demo.fabric import DemoFabric, Evidence, Reading, S, Step
from fleetlens.demo.summary import Summary


class _Quiet:
    """Stands in for a rich status with --json: nothing goes to the terminal."""

    def update(self, *_: object) -> None:
        pass


class Story(Generic[S]):
    def __init__(self, fabric: DemoFabric[S], console: Console, quiet: bool) -> None:
        self.f, self.console, self.quiet = fabric, console, quiet
        self.say: Callable[..., None] = (lambda *_, **__: None) if quiet else console.print
        self.seen = Evidence()
        self._since: float | None = None  # start of the current run of good clock readings
        self.s: S | None = None

    def run(self) -> S:
        s = self.s = self.f.start()
        self.seen.after_sync = last = self._sync(s)
        self.seen.before_fault = self._baseline(s, last)
        self._fault(s)
        self._heal(s)
        self.f.finish(s, self.seen)
        return s

    # ---- the steps ------------------------------------------------------------------------
    def _sync(self, s: Summary) -> Reading:
        self.say("[bold]waiting for clock sync to converge[/] …")
        bound, hold = self.f.pacing.sync_bound_ns, self.f.pacing.sync_hold_s

        def converged(r: Reading, start: float) -> bool:
            good = r.ready and (p99 := r.p99_ns) is not None and p99 <= bound
            self._since = (r.t_s if self._since is None else self._since) if good else None
            if self._since is not None and r.t_s - self._since >= hold:
                s.sync_converged_s = round(self._since - start, 1)
                return True
            return False

        last, took = self._watch("sync", converged)
        if s.sync_converged_s is None:
            s.notes.append(f"clock sync did not reach p99 <= {bound:.0f} ns within {took:g} s")
        else:
            self.say(f"  converged after {s.sync_converged_s} s")
        return last

    def _baseline(self, s: Summary, first: Reading) -> Reading:
        """The reading that showed convergence is the first of this step."""
        self.say("[bold]waiting for a clean baseline[/] (start-up verdicts to clear) …")
        p, reads = self.f.pacing, self.seen.baseline

        def clean(r: Reading, start: float) -> bool:
            if s.sync_converged_s is not None and r.ready:
                reads.append(r)
            if s.baseline_clean_s is not None:
                self._alarm(r, None)
                return True
            scored = s.sync_converged_s is None or len(reads) >= p.clean_reads
            if not r.faulty and scored and r.t_s - start >= p.warmup_s:
                s.baseline_clean_s = round(r.t_s - start, 1)
                return True
            return False

        last, took = self._watch("baseline", clean, first)
        if s.baseline_clean_s is None:
            why = ", ".join(last.faulty) or f"only {len(reads)} synced clock reads"
            s.notes.append(f"verdicts still not clean after {took:g} s: {why}")
        return last

    def _fault(self, s: Summary) -> None:
        start = self.f.now_s()
        s.fault = self.f.inject_fault()
        link = str(s.fault["link"])
        unit = "% loss" if s.fault["kind"] == "loss" else " µs delay"
        self.say(f"[bold]injecting[/] {s.fault['value']:g}{unit} on {link}")

        def named(r: Reading, start: float) -> bool:
            self._alarm(r, link)
            if s.localized_s is None and link in r.faulty_links:
                s.localized_s = round(r.t_s - start, 1)
            return s.localized_s is not None

        last, took = self._watch("fault", named, start_s=start)
        s.faulty_links, self.seen.faulty_nics = last.faulty_links, last.faulty_nics
        found = f"found after {s.localized_s} s" if s.localized_s is not None else "NOT localized"
        self.say(f"  faulty links: {', '.join(s.faulty_links) or 'none'} ({found})")
        if s.localized_s is None:
            s.notes.append(f"{link} was not localized within {took:g} s")

    def _heal(self, s: Summary) -> None:
        link = str(s.fault["link"])
        self.f.heal()
        everything = self.f.pacing.clear_all

        def cleared(r: Reading, start: float) -> bool:
            self._alarm(r, link)
            healthy = (
                s.localized_s is not None and not r.faulty
                if everything
                else (link not in r.faulty_links)
            )
            if s.cleared_s is None and healthy:
                s.cleared_s = round(r.t_s - start, 1)
            return s.cleared_s is not None

        _, took = self._watch("heal", cleared)
        after = (
            f"healthy again after {s.cleared_s} s" if s.cleared_s is not None else "still faulty"
        )
        self.say(f"  healed {link}: {after}")
        if s.cleared_s is None:
            what = "verdicts not all healthy" if everything else f"{link} still faulty"
            s.notes.append(f"{what} {took:g} s after the heal")

    # ---- reading until a step ends ---------------------------------------------------------
    def _watch(
        self, step: Step, event: Callable[[Reading, float], bool], first: Reading | None = None,
        start_s: float | None = None,
    ) -> tuple[Reading, float]:  # fmt: skip
        """Readings until the fabric's rule ends ``step``; ``event(reading, start)`` keeps the
        step's books and says whether its event holds. The last reading, and the seconds the
        step was given."""
        start = start_s if start_s is not None else first.t_s if first else self.f.now_s()
        rule = self.f.rule(step, start)
        seen: float | None = None
        r = first
        with self._status(step) as status:
            while True:
                if r is None:
                    r = self.f.observe()
                if event(r, start) and seen is None:
                    seen = r.t_s
                self._score(r)
                status.update(_status_line(step, r))
                ends = (seen if seen is not None and rule.on_event else rule.end_s) + rule.settle_s
                if r.t_s >= ends:
                    return r, rule.end_s - start
                time.sleep(rule.poll_s)
                r = None

    def _alarm(self, r: Reading, link: str | None) -> None:
        self.seen.other_alarms.update(x for x in r.faulty if x != link)

    def _score(self, r: Reading) -> None:
        """Every scored reading from convergence on, once (a step's first may be carried)."""
        since = self.seen.since_converged
        assert self.s is not None
        if self.s.sync_converged_s is not None and r.ready and (not since or since[-1] is not r):
            since.append(r)

    def _status(self, step: Step) -> AbstractContextManager[Any]:
        return self.console.status(step) if not self.quiet else nullcontext(_Quiet())


def _status_line(step: Step, r: Reading) -> str:
    synced = int(r.synced.sum())
    return (
        f"{step}: {synced}/{len(r.hosts)} hosts synced, clock p99 {r.p99_ns} ns, "
        f"faulty: {', '.join(r.faulty[:3]) or 'none'}"
    )
