"""What the demo's story needs from a fabric: the interface a lab and a simulated fabric share.

A fabric starts a real collector and agents with injected clock errors, and answers, reading by
reading, what the collector's REST API says (clock models scored against the injected truth,
faulty links and NICs). Time is the fabric's own "story seconds": real seconds on the lab,
simulated seconds of probes on the simulator. :class:`StepRule` says when each step of the
story ends on that fabric.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

import numpy as np

from fleetlens.demo.summary import Summary

Step = Literal["sync", "baseline", "fault", "heal"]
S = TypeVar("S", bound=Summary)


@dataclass(frozen=True)
class Reading:
    """One look at the collector, judged against the injected truth."""

    t_s: float  # story seconds
    hosts: list[str]
    error_ns: np.ndarray  # served clock model minus truth, common mode removed; NaN: unscored
    synced: np.ndarray  # bool: the collector flags the host's model synced
    ready: bool  # every host's clock is scored (what "ready" needs is the fabric's)
    faulty_links: list[str]
    faulty_nics: list[str]

    @property
    def faulty(self) -> list[str]:
        return self.faulty_links + self.faulty_nics

    @property
    def abs_errors(self) -> np.ndarray:
        return np.abs(self.error_ns[np.isfinite(self.error_ns)])

    @property
    def p99_ns(self) -> float | None:
        return percentile(self.abs_errors, 99)


def percentile(a: np.ndarray, q: float) -> float | None:
    """The q-th percentile to 0.1 ns (the figure shown is the figure judged); None if empty."""
    return round(float(np.percentile(a, q)), 1) if a.size else None


@dataclass(frozen=True)
class StepRule:
    """When one step ends. Readings continue until ``end_s`` (story seconds); with
    ``on_event`` the step ends ``settle_s`` after its event is first seen instead (the lab:
    react as soon as it is seen). Without, it runs to ``end_s`` and records when the event
    was first seen (the simulator: its fault starts and ends at scheduled seconds)."""

    end_s: float
    on_event: bool = True
    settle_s: float = 0.0
    poll_s: float = 0.0  # pause between readings


@dataclass(frozen=True)
class Pacing:
    """The story's judgement rules that differ between fabrics."""

    sync_bound_ns: float  # clock error p99 the clocks must reach
    sync_hold_s: float = 0.0  # converged: within the bound at every reading for this long
    clean_reads: int = 0  # scored clock readings the baseline needs before it is clean
    warmup_s: float = 0.0  # the baseline is clean no sooner than this after it began
    # Cleared: the link was named and every verdict is healthy again (else: the link's is).
    clear_all: bool = False


@dataclass
class Evidence:
    """What the story saw, for the fabric's summary: the readings it scores its clocks from
    (by its own rule: pooled, or one reading), and every alarm besides the faulted link."""

    after_sync: Reading | None = None  # the last reading of the sync step
    before_fault: Reading | None = None  # the last reading before the fault
    baseline: list[Reading] = field(default_factory=list)  # scored, of the baseline step
    since_converged: list[Reading] = field(default_factory=list)  # every scored one from then
    faulty_nics: list[str] = field(default_factory=list)  # as the fault ends
    other_alarms: set[str] = field(default_factory=set)  # after a clean baseline, link aside


class DemoFabric(Protocol[S]):
    pacing: Pacing

    def start(self) -> S:
        """Build the fabric, start the collector and the agents; the summary to fill."""
        ...

    def now_s(self) -> float:
        """Story seconds now (the time of the newest reading on the simulator)."""
        ...

    def observe(self) -> Reading:
        """The next reading: now on the lab, the next judged window on the simulator."""
        ...

    def rule(self, step: Step, start_s: float) -> StepRule: ...

    def inject_fault(self) -> dict[str, object]:
        """Put the fault on its link (the simulator's is scheduled to start now); its record."""
        ...

    def heal(self) -> None:
        """Remove the fault (the simulator's is scheduled to end now)."""
        ...

    def finish(self, s: S, clocks: Evidence) -> None:
        """Score the clocks into ``s``, run the fabric's own last steps, add its notes."""
        ...

    def stop(self, keep: bool, s: S | None) -> None:
        """Stop and remove everything (``keep``: leave a finished stack running)."""
        ...
