"""When a window generation is ready for the clock solve: every live agent's upload is in.

The collector used to solve on a fixed 1 s tick, so a window waited up to a whole tick after
its last upload (and a tick could fall between two agents' uploads and solve half a window).
Agents now upload a window a few ms after it ends (``probe/windows.py``), so the collector
solves as soon as the uploads of a window generation (windows with the same ``start_ns``) are
in from every host expected to send it:

- every host that sent the previous generation (a steady fleet), and
- every host whose agent registered before the window started and has sent nothing since
  (an agent starting up: it probes within a fraction of a second of registering), for up to
  ``starting_ns`` after its registration (an agent that never uploads is not waited for
  forever).

A generation nobody completes (an agent died, an upload is late) is ready ``max_wait_ns``
after it ended anyway: the regular loop tick picks it up, as before. The solve is handed
windows up to the newest ready generation only, so it never solves a half-uploaded one.
"""

from __future__ import annotations

import threading

KEEP_GENERATIONS = 16  # generations remembered (the solve looks back 2 s of 1 s windows)


class WindowArrivals:
    def __init__(self, max_wait_ns: int, starting_ns: int) -> None:
        self.max_wait_ns = max_wait_ns
        self.starting_ns = starting_ns
        self._lock = threading.Lock()
        self._senders: dict[int, set[str]] = {}  # window start_ns -> hosts that sent rows
        self._duration: dict[int, int] = {}  # window start_ns -> duration_ns
        self._registered: dict[str, int] = {}  # host -> when its agent last registered
        self._last_sent: dict[str, int] = {}  # host -> when it last sent rows
        self._signalled = -(1 << 62)  # newest generation already reported complete

    def registered(self, host: str, now_ns: int) -> None:
        with self._lock:
            self._registered[host] = now_ns

    def stored(self, host: str, starts: list[int], duration_ns: int, now_ns: int) -> bool:
        """Note a stored batch; True when it completed a generation newer than any before."""
        with self._lock:
            self._last_sent[host] = now_ns
            for s in starts:
                self._senders.setdefault(s, set()).add(host)
                self._duration[s] = duration_ns
            for old in sorted(self._senders)[:-KEEP_GENERATIONS]:
                del self._senders[old], self._duration[old]
            newest = max(starts)
            if newest > self._signalled and self._complete(newest, now_ns):
                self._signalled = newest
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

    def _ready(self, g: int, now_ns: int) -> bool:
        return g + self._duration[g] + self.max_wait_ns <= now_ns or self._complete(g, now_ns)

    def _complete(self, g: int, now_ns: int) -> bool:
        earlier = [s for s in self._senders if s < g]
        expected = set(self._senders[max(earlier)]) if earlier else set()
        expected |= {
            h
            for h, t in self._registered.items()
            if t < g and now_ns - t < self.starting_ns and self._last_sent.get(h, 0) < t
        }
        return expected <= self._senders[g]
