"""When a window generation is ready for the clock solve: every live agent's upload is in.

Agents upload a window a few ms after it ends (``probe/windows.py``), so the collector solves
as soon as the uploads of a window generation (windows with the same ``start_ns``) are in from
every host expected to send it, rather than on a fixed tick (which would make a window wait up
to a tick after its last upload, or solve half a window when it fell between two uploads):

- every host that sent the previous generation (a steady fleet), and
- every host whose agent registered and has sent no earlier window since (an agent starting
  up), for up to ``starting_ns`` after its registration (one that never uploads is not
  waited for forever).
  Waiting for one that only starts probing in a later window costs little: that window
  completes about when this one times out, and both are solved then; not waiting for one that
  did probe in this window would solve it without that host's first data and cost a whole
  window (agents register while the first window runs). The simulator replays past windows
  after registering its hosts, so registration times say nothing about which window a host
  sends first.

With nobody to expect (a collector that just restarted: no registrations, no previous window)
a generation is never complete early: it waits for the time-out, as a single upload says
nothing about the others still coming.

A generation nobody completes (an agent died, an upload is late) is ready ``max_wait_ns``
after it ended anyway: the clock loop wakes at that time-out (:meth:`next_timeout`), not at its
next tick, which would add up to a tick to every model's age while one agent is missing. The
solve is handed windows up to the newest ready generation only, so it never solves a
half-uploaded one.
"""

from __future__ import annotations

import threading

KEEP_GENERATIONS = 16  # generations remembered (the solve looks back 2 s of 1 s windows)
# A generation whose uploads were in flight at its time-out wakes the loop again once this
# share of the hosts expected has sent it: the solve skips a generation holding under 80 % of
# the fullest one's rows (``complete_generations``), so one still coming in at the time-out
# would otherwise wait for the next generation's time-out, a window later. One first seen past
# its time-out (a replay of past windows) comes in a burst: it waits to be complete, or for the
# tick, as the solve folds each generation in once and would never see its last hosts' rows.
LATE_QUORUM = 0.9


class WindowArrivals:
    def __init__(self, max_wait_ns: int, starting_ns: int) -> None:
        self.max_wait_ns = max_wait_ns
        self.starting_ns = starting_ns
        self._lock = threading.Lock()
        self._senders: dict[int, set[str]] = {}  # window start_ns -> hosts that sent rows
        self._duration: dict[int, int] = {}  # window start_ns -> duration_ns
        self._first_at: dict[int, int] = {}  # window start_ns -> when its first rows came
        self._registered: dict[str, int] = {}  # host -> when its agent last registered
        self._first_sent: dict[str, int] = {}  # host -> first window it sent since registering
        self._signalled = -(1 << 62)  # newest generation already reported (complete or late)

    def registered(self, host: str, now_ns: int) -> None:
        with self._lock:
            self._registered[host] = now_ns
            self._first_sent.pop(host, None)

    def stored(self, sent: list[tuple[str, list[int], int]], now_ns: int) -> bool:
        """Note a commit group's stored batches (host, window starts and duration of each, in
        commit order); True when they completed a generation newer than any before, or
        brought one in flight at its time-out to ``LATE_QUORUM`` of the hosts expected. It is
        checked once per group for each generation the group reached: a check walks the
        fleet's hosts, too much to do per batch at 1,024 batches a second."""
        with self._lock:
            for host, starts, duration_ns in sent:
                self._first_sent.setdefault(host, min(starts))
                for s in starts:
                    self._senders.setdefault(s, set()).add(host)
                    self._duration[s] = duration_ns
                    self._first_at.setdefault(s, now_ns)
            for old in sorted(self._senders)[:-KEEP_GENERATIONS]:
                del self._senders[old], self._duration[old], self._first_at[old]
            # Newest first: one batch of the next generation must not hide a completed one.
            for g in sorted({max(starts) for _, starts, _ in sent}, reverse=True):
                if g > self._signalled and (
                    self._complete(g, now_ns) or self._late_quorum(g, now_ns)
                ):
                    self._signalled = g
                    return True
            return False

    def solve_upto(self, now_ns: int, newest_start: int | None) -> int | None:
        """The newest window start the clock solve may see now (None: nothing stored)."""
        with self._lock:
            gens = sorted(self._senders)
            ready = [g for g in gens if self._ready(g, now_ns)]
        if ready:
            return ready[-1]
        if gens:  # tracked generations all still arriving: only what came before them
            return gens[0] - 1
        return newest_start  # nothing tracked (e.g. history from before a restart)

    def next_timeout(self, now_ns: int) -> int | None:
        """When the next generation not yet complete turns ready by its time-out, after
        ``now_ns`` (None: none pending): the clock loop wakes then, not at its next tick."""
        with self._lock:
            due = [self._timeout(g) for g in self._senders if g > self._signalled]
        later = [d for d in due if d > now_ns]
        return min(later) if later else None

    def complete(self, g: int, now_ns: int) -> bool:
        """Every host expected to send generation ``g`` has sent it (False when untracked)."""
        with self._lock:
            return g in self._senders and self._complete(g, now_ns)

    def first_arrival(self, g: int) -> int | None:
        """When the first rows of generation ``g`` were stored (None when untracked)."""
        with self._lock:
            return self._first_at.get(g)

    def _ready(self, g: int, now_ns: int) -> bool:
        return self._timeout(g) <= now_ns or self._complete(g, now_ns)

    def _timeout(self, g: int) -> int:
        """When generation ``g`` is ready whoever has not sent it: ``max_wait_ns`` after its
        end."""
        return g + self._duration[g] + self.max_wait_ns

    def _complete(self, g: int, now_ns: int) -> bool:
        expected = self._expected(g, now_ns)
        return bool(expected) and expected <= self._senders[g]

    def _late_quorum(self, g: int, now_ns: int) -> bool:
        if not self._first_at[g] < self._timeout(g) <= now_ns:
            return False
        expected = self._expected(g, now_ns)
        return bool(expected) and len(expected & self._senders[g]) >= LATE_QUORUM * len(expected)

    def _expected(self, g: int, now_ns: int) -> set[str]:
        earlier = [s for s in self._senders if s < g]
        expected = set(self._senders[max(earlier)]) if earlier else set()
        expected |= {  # starting: registered lately, nothing older than g sent since
            h
            for h, t in self._registered.items()
            if now_ns - t < self.starting_ns and self._first_sent.get(h, g) >= g
        }
        return expected
