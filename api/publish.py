"""What the collector serves as current: clock models, verdicts and drain decisions.

The loops hand over their whole output each round; only what changed is stored (one writer
transaction per stage, so readers never see half of one). Verdicts and decisions are published
once stored, so the served ones always equal the newest stored rows. Clock models are served
as soon as solved and stored behind them: agents map their timestamps with the served model,
and a busy writer (a commit group of ingest ahead of the store, up to a second) must not age
it; the history and a restarted collector have them once the writer reached them, and a failed
store raises in the next clock round (:meth:`Published.flush`).

History keeps every change, and while a subject is not healthy one row per round; a clock
model (and a non-healthy verdict) is also stored at least every ``HEARTBEAT_NS`` so the history
shows it is still current.

The published maps are replaced, never mutated (copy, update, swap): API threads iterate them
while a loop publishes.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from fleetlens.api.store import Store

from fleetlens.records import ClockModel, Decision, Verdict

HEARTBEAT_NS = 60_000_000_000

# Stores one stage's outputs (clocks, verdicts, decisions, now_ns) in one writer transaction;
# the future is done once they are stored.
SaveOutputs = Callable[[list[ClockModel], list[Verdict], list[Decision], int], Future]
STORE_TIMEOUT_S = 60.0


class Published:
    def __init__(self, save: SaveOutputs) -> None:
        self._save = save
        self.clocks: dict[str, ClockModel] = {}
        self.clock_updated: dict[str, int] = {}  # host -> when its model was last stored
        self.verdicts: dict[str, Verdict] = {}
        self.verdict_updated: dict[str, int] = {}  # subject -> when last stored
        self.decisions: dict[str, Decision] = {}
        self._clocks_stored: Future | None = None  # the served models' store, if pending

    def load(self, store: Store) -> None:
        """The newest stored outputs (a restarted collector serves them at once)."""
        for c, updated in store.latest_clocks():
            self.clocks[c.host_id] = c
            self.clock_updated[c.host_id] = updated
        for v, updated in store.latest_verdicts():
            self.verdicts[v.subject] = v
            self.verdict_updated[v.subject] = updated
        self.decisions = {d.host_id: d for d in store.decisions()}

    def clocks_round(self, clocks: list[ClockModel], now_ns: int) -> None:
        """Served at once, stored behind (the module's docstring says why)."""
        new = self._changed_clocks(clocks, now_ns)
        if new:
            self.flush()
            self._clocks_stored = self._save(new, [], [], now_ns)
        self.clocks = {**self.clocks, **{c.host_id: c for c in new}}
        self.clock_updated = {**self.clock_updated, **{c.host_id: now_ns for c in new}}

    def verdicts_round(
        self, verdicts: list[Verdict], decisions: list[Decision], now_ns: int
    ) -> None:
        """Verdicts with the decisions derived from them, stored together."""
        new_verdicts = self._changed_verdicts(verdicts, now_ns)
        new_decisions = [
            d for d in decisions if _drain_key(d) != _drain_key(self.decisions.get(d.host_id))
        ]
        if new_verdicts or new_decisions:
            self._save([], new_verdicts, new_decisions, now_ns).result(timeout=STORE_TIMEOUT_S)
        self.verdicts = {**self.verdicts, **{v.subject: v for v in new_verdicts}}
        self.verdict_updated = {
            **self.verdict_updated, **{v.subject: now_ns for v in new_verdicts}
        }  # fmt: skip
        self.decisions = {**self.decisions, **{d.host_id: d for d in new_decisions}}

    def flush(self) -> None:
        """Wait until the served clock models are stored; raises their store's error."""
        pending, self._clocks_stored = self._clocks_stored, None
        if pending is not None:
            pending.result(timeout=STORE_TIMEOUT_S)

    def _changed_clocks(self, clocks: list[ClockModel], now_ns: int) -> list[ClockModel]:
        return [
            c for c in clocks
            if self.clocks.get(c.host_id) != c
            or now_ns - self.clock_updated.get(c.host_id, 0) >= HEARTBEAT_NS
        ]  # fmt: skip

    def _changed_verdicts(self, verdicts: list[Verdict], now_ns: int) -> list[Verdict]:
        return [v for v in verdicts if self._verdict_changed(v, now_ns)]

    def _verdict_changed(self, v: Verdict, now_ns: int) -> bool:
        old = self.verdicts.get(v.subject)
        if old is None or old.state != v.state:
            return True
        if v.state == "healthy":
            return False
        stale = now_ns - self.verdict_updated.get(v.subject, 0) >= HEARTBEAT_NS
        return old != v or stale


def _drain_key(d: Decision | None) -> tuple[tuple[str, str], ...]:
    return tuple((e.nic_id, e.reason) for e in d.drain) if d else ()
