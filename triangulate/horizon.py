"""Per-flow loss counts accumulated over windows: the horizons the loss fits run on besides
the window itself.

- ``DecayedCounts``, the long horizon (``loss_decay_s``, 30 s, exponential forgetting):
  0.01 % loss needs tens of seconds of probes, and a persisting fault keeps its verdict there.
- ``WindowSums``, the onset horizon: the plain sums of the last ``loss_onset_windows`` (3)
  windows. A fault that starts after a minute of clean traffic is diluted on the long
  horizon, whose counts still hold ~30 s of the link's clean packets: 1 % loss on a link of
  ~450 probes a second (the lab's rail 3L4S uplink; 4-5 lost a window, too few for one
  window at the evidence level) became significant there only after 11-14 s. Summed over
  its first three windows (~13 lost against ~1.3 of background) it passes the same level.
  An exponential short horizon is diluted the same way by its own clean past (4 s: the
  same fault faulty after 4-10 s on the simulator); a window-limited sum is not.
"""

from __future__ import annotations

import math

import numpy as np

from . import _fast
from .incidence import Incidence
from .paths import Frame, PathModel
from .store import FlowStore

_LOST_FLOOR = 1e-3  # decayed lost packets below this are forgotten (after ~7 decay times)
_KEEP_SENT = 0.05  # a flow whose decayed packets fall below this is dropped (gone)


class DecayedCounts:
    """Per-flow (sent, lost) decayed with time constant ``tau_s`` and this window added, the
    per-link packet sums of the same counts, and the lossy rows a fit starts from."""

    def __init__(self, tau_s: float) -> None:
        self.tau_s = tau_s
        self.acc = FlowStore({"sent": (np.float64, 0.0, 0), "lost": (np.float64, 0.0, 0)})
        self._sums: tuple = ()  # (token, per-link sums) of the counts
        self._rows = np.empty((2, 0), np.int64)  # decay_add's output buffers
        self._inc: tuple = ()  # (keys, path version, incidence) when not aligned

    @property
    def sent(self) -> np.ndarray:
        return self.acc.cols["sent"]

    @property
    def lost(self) -> np.ndarray:
        return self.acc.cols["lost"]

    def add(
        self, f: Frame, lost_now: np.ndarray | None = None
    ) -> tuple[float, np.ndarray | None, np.ndarray | None]:
        """Decay, add this window with ``lost_now`` as its rows' lost packets (default: the
        frame's): (the decay factor, this window's lossy rows, the decayed counts' lossy rows
        — each None when this pass did not find them)."""
        lost_now = f.lost if lost_now is None else lost_now
        dt = max(f.end_ns - f.start_ns, 1) * 1e-9
        gamma = math.exp(-dt / self.tau_s)
        acc = self.acc
        sent, lost = self.sent, self.lost
        lossy_now: np.ndarray | None
        lossy_all: np.ndarray | None
        if acc.aligned(f.key):  # the usual case: the same flows as before, in the same order
            # decay, add this window, floor the lost counts: one pass (``_fast.decay_add``)
            if self._rows.shape[1] < f.n:
                self._rows = np.empty((2, f.n), np.int64)
            now, every = self._rows
            keep_all, k_now, k_all = _fast.decay_add(
                sent, lost, f.sent, lost_now, gamma, _LOST_FLOOR, _KEEP_SENT, now, every
            )
            lossy_now, lossy_all = now[:k_now].copy(), every[:k_all].copy()
        else:
            _fast.decay(sent, lost, gamma)
            at = acc.locate(f.key)
            sent, lost = self.sent, self.lost
            sent[at] += f.sent
            lost[at] += lost_now
            lost[lost < _LOST_FLOOR] = 0.0  # long gone; keeps the lossy set small
            keep_all = bool(np.all(sent >= _KEEP_SENT))
            lossy_now = lossy_all = None
        if not keep_all:  # rows move: the lossy rows found and the sums are stale
            acc.drop(sent >= _KEEP_SENT)
            lossy_all, self._sums = None, ()
        return gamma, lossy_now, lossy_all

    def forget(self, rows: np.ndarray) -> None:
        """The counts of ``rows`` forgotten, packets and losses (their link healed): they
        start again from the next window. Forgetting the losses alone would leave the packets
        that lost them counted clean, pulling the background learned over the horizon below
        the fabric's, so that rows at the true background read as lossy against it (the
        history: docs/notes/triangulate.md)."""
        self.sent[rows] = 0.0
        self.lost[rows] = 0.0
        self._sums = ()  # the per-link packet sums summed anew

    def incidence(self, f: Frame, paths: PathModel) -> tuple[Incidence, bool]:
        """The incidence of the stored flows (the frame's when they are its rows, in its
        order) and whether they are."""
        if self.acc.aligned(f.key):
            return f.inc, True
        keys = self.acc.keys
        got = self._inc
        if not got or got[0] is not keys or got[1] != paths.version:
            got = self._inc = (keys, paths.version, paths.incidence(keys))
        return got[2], False

    def link_sums(self, f: Frame, inc: Incidence, aligned: bool, S: np.ndarray, gamma: float):
        """Per link, the decayed packets of its flows: the last window's sums decayed plus
        this window's (``S``) while the flows stay the same, else summed anew."""
        token = (f.token, aligned)
        last = self._sums
        fresh = not (last and last[0] == token)
        sums = inc.link_sums(self.sent) if fresh else gamma * last[1] + S
        self._sums = (token, sums)
        return sums


class WindowSums:
    """Per-flow (sent, lost) summed over the last ``n`` windows (a ring of the windows'
    counts, one slot per window), with the same reads as :class:`DecayedCounts`. Flows
    absent from a window count 0 in its slot; a flow absent from all ``n`` is dropped."""

    def __init__(self, n: int, n_links: int) -> None:
        names = ["sent", "lost"] + [f"{c}{i}" for i in range(n) for c in "sl"]
        cols: dict[str, tuple[np.dtype | type, object, int]] = {
            c: (np.float64, 0.0, 0) for c in names
        }
        self.n = n
        self.acc = FlowStore(cols)
        self.slot = 0
        self._link_slots = np.zeros((n, n_links))  # per slot, its per-link packet sums
        self._token: object = None  # the frame token the per-link slot sums were made for
        self._inc: tuple = ()

    @property
    def sent(self) -> np.ndarray:
        return self.acc.cols["sent"]

    @property
    def lost(self) -> np.ndarray:
        return self.acc.cols["lost"]

    def add(self, f: Frame, lost_now: np.ndarray | None = None) -> np.ndarray | None:
        """This window's counts in (``lost_now`` its rows' lost packets, default the
        frame's), the oldest window's out; the lossy rows (None: not listed, a fit finds
        them)."""
        lost_now = f.lost if lost_now is None else lost_now
        self.slot = (self.slot + 1) % self.n
        acc, c = self.acc, self.acc.cols
        s_old, l_old = f"s{self.slot}", f"l{self.slot}"
        c["sent"] -= c[s_old]
        c["lost"] -= c[l_old]
        if acc.aligned(f.key):
            c[s_old][:] = f.sent
            c[l_old][:] = lost_now
        else:
            at = acc.locate(f.key)
            c = acc.cols
            c[s_old][:] = 0.0
            c[l_old][:] = 0.0
            c[s_old][at] = f.sent
            c[l_old][at] = lost_now
        c["sent"] += c[s_old]
        c["lost"] += c[l_old]
        if not acc.aligned(f.key):
            gone = ~np.any([c[f"s{i}"] > 0 for i in range(self.n)], axis=0)
            if gone.any():
                acc.drop(~gone)
        return None

    def forget(self, rows: np.ndarray) -> None:
        """The counts of ``rows`` forgotten, packets and losses (as
        :meth:`DecayedCounts.forget`), in the sums and in every window's slot (a slot keeping
        them would be taken out of the sums again when it leaves the ring)."""
        for col in ["sent", "lost"] + [f"{c}{i}" for i in range(self.n) for c in "sl"]:
            self.acc.cols[col][rows] = 0.0
        self._token = None  # the per-link slot sums summed anew

    def incidence(self, f: Frame, paths: PathModel) -> tuple[Incidence, bool]:
        if self.acc.aligned(f.key):
            return f.inc, True
        keys = self.acc.keys
        got = self._inc
        if not got or got[0] is not keys or got[1] != paths.version:
            got = self._inc = (keys, paths.version, paths.incidence(keys))
        return got[2], False

    def link_sums(self, f: Frame, inc: Incidence, aligned: bool, S: np.ndarray) -> np.ndarray:
        """Per link, the packets of its flows over the ring: the slots' sums while the
        frame's flows and paths stay the same (this window's is ``S``), else anew."""
        if aligned and self._token == f.token:
            self._link_slots[self.slot] = S
        else:
            # the whole ring's sums in this window's slot: until the ring has turned once,
            # windows that left it still count (more packets: weaker evidence, never more)
            self._link_slots[:] = 0.0
            self._link_slots[self.slot] = inc.link_sums(self.sent)
            self._token = f.token if aligned else None
        return self._link_slots.sum(axis=0)
