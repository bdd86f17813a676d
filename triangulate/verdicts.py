"""Verdicts with hysteresis, confidence and flapping.

Per subject: a window with evidence is *bad*, a window where the subject was observed without
evidence is *clean*, a window without data changes nothing.

- healthy -> suspect on the first bad window; -> faulty after ``fault_windows`` consecutive bad
  windows, or at once when the evidence is overwhelming (``strong_llr``: a black hole seen in
  three probing rounds must not wait for a second window);
- faulty/suspect -> healthy after ``clear_ns`` of clean windows;
- flapping: at least ``flap_transitions`` bad<->clean flips within ``flap_horizon_ns``; a
  flapping subject stays faulty through its short clean spells (that is what flapping means).

Confidence is the posterior of "bad" from the log-likelihood ratio with a 1e-3 prior, and the
delay and loss estimates are smoothed over the subject's bad windows.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Set
from dataclasses import dataclass, field

from fleetlens.records import Verdict

from .config import TriangulateConfig

_UNSEEN = -1  # last_bad_ns of a verdict adopted from the collector (time unknown)
_PRIOR_LOGIT = math.log(1e-3 / (1 - 1e-3))


@dataclass
class Evidence:
    kind: str
    strength: float
    loss: float
    delay_ns: float
    flows: list[str]
    n_flows: int


@dataclass
class _Track:
    kind: str
    state: str = "healthy"
    since_ns: int = 0
    streak: int = 0
    last_bad_ns: int = 0
    last_bad: bool = False
    flips: deque = field(default_factory=deque)
    loss: float = 0.0
    delay_ns: float = 0.0
    strength: float = 0.0
    flows: list[str] = field(default_factory=list)
    n_flows: int = 0


def confidence(strength: float) -> float:
    x = strength + _PRIOR_LOGIT
    return 1.0 / (1.0 + math.exp(-x)) if x > -50 else 0.0


def strength_for(conf: float) -> float:
    """The strength whose :func:`confidence` is ``conf`` (inverse, for capped findings)."""
    return math.log(conf / (1.0 - conf)) - _PRIOR_LOGIT


class VerdictTracker:
    def __init__(self, cfg: TriangulateConfig) -> None:
        self.cfg = cfg
        self.tracks: dict[str, _Track] = {}

    def seed(self, prev: dict[str, Verdict]) -> None:
        """Adopt the collector's previous verdicts (e.g. after a restart of the engine)."""
        for v in prev.values():
            if v.subject not in self.tracks and v.state != "healthy":
                self.tracks[v.subject] = _Track(
                    v.kind, v.state, v.since_ns, 1, _UNSEEN, True,
                    loss=v.loss_rate, delay_ns=v.excess_delay_ns,
                )  # fmt: skip

    def update(self, bad: dict[str, Evidence], clean: Set[str], now_ns: int) -> list[str]:
        """Apply one window; returns the subjects whose verdict may have changed."""
        touched = []
        for s, ev in bad.items():
            self._bad(self.tracks.setdefault(s, _Track(ev.kind, since_ns=now_ns)), ev, now_ns)
            touched.append(s)
        # only tracked subjects change when clean (``clean`` is every observed link: ~17 k
        # on the reference fabric, the tracks a few)
        for s, t in self.tracks.items():
            if s in clean and s not in bad:
                self._clean(t, now_ns)
                touched.append(s)
        return touched

    def _flip(self, t: _Track, bad: bool, now: int) -> None:
        if t.last_bad != bad:
            t.flips.append(now)
        t.last_bad = bad
        while t.flips and now - t.flips[0] > self.cfg.flap_horizon_ns:
            t.flips.popleft()

    def flapping(self, t: _Track) -> bool:
        return len(t.flips) >= self.cfg.flap_transitions

    def _bad(self, t: _Track, ev: Evidence, now: int) -> None:
        self._flip(t, True, now)
        t.streak += 1
        t.last_bad_ns = now
        a = 1.0 if t.state == "healthy" else 0.5
        t.loss += a * (ev.loss - t.loss)
        t.delay_ns += a * (ev.delay_ns - t.delay_ns)
        t.strength, t.flows, t.n_flows = ev.strength, ev.flows, ev.n_flows
        strong = ev.strength >= self.cfg.strong_llr
        target = "faulty" if strong or t.streak >= self.cfg.fault_windows else "suspect"
        if self.flapping(t):
            target = "faulty"
        if target != t.state and not (t.state == "faulty" and target == "suspect"):
            t.state, t.since_ns = target, now

    def _clean(self, t: _Track, now: int) -> None:
        self._flip(t, False, now)
        t.streak = 0
        if t.state == "healthy":
            return
        if t.last_bad_ns == _UNSEEN:  # adopted verdict: the clean period starts now
            t.last_bad_ns = now
        hold = self.cfg.clear_ns * (2 if self.flapping(t) else 1)
        if now - t.last_bad_ns >= hold:
            t.state, t.since_ns = "healthy", now
            t.loss = t.delay_ns = t.strength = 0.0

    def verdict(self, subject: str) -> Verdict:
        t = self.tracks[subject]
        return Verdict(
            subject, t.kind, t.state, t.since_ns, float(t.delay_ns), float(t.loss),
            confidence(t.strength) if t.state != "healthy" else 0.0,
            t.n_flows, list(t.flows), self.flapping(t),
        )  # fmt: skip

    def forget_healthy(self) -> None:
        """Drop tracks that are healthy and have not flipped lately (bounded memory)."""
        for s in [s for s, t in self.tracks.items() if t.state == "healthy" and not t.flips]:
            del self.tracks[s]
