"""The single writer: one thread owns the DuckDB write connection, fed by a bounded queue.

Ingest handlers validate a batch, then ``submit`` it and wait for its future: the future
resolves only after the transaction has committed, so a ``200`` means the rows are in the
DuckDB WAL and survive ``kill -9``. When the queue is full (by batches or by rows), ``submit``
raises :class:`Backpressure` at once and the handler answers ``429`` with ``Retry-After`` —
memory stays bounded however far the writer falls behind.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from fleetlens.api.store import Store

from fleetlens.batch import Batch

log = logging.getLogger("fleetlens.api.writer")


# A commit's fixed cost dwarfs its rows': one agent batch (~910 rows) alone took 9.5 ms of
# CPU to insert and commit, 3.1 ms in groups of 4 and 1.3 ms in groups of 64. So a group
# waits for batches arriving less than GROUP_GAP_S apart, up to GROUP_WAIT_S after its first
# one was queued: a lone client's ack waits one gap at most; 1,024 agents a second make
# groups of tens of batches for at most 50 ms of added ack latency.
GROUP_WAIT_S = 0.05
GROUP_GAP_S = 0.005


class Backpressure(Exception):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"writer queue full, retry after {retry_after_s:.0f} s")
        self.retry_after_s = retry_after_s


@dataclass
class _Queued:
    rows: int
    enqueued: float
    future: Future


@dataclass
class _BatchItem(_Queued):
    batch: Batch


@dataclass
class _CallItem(_Queued):
    call: Callable[[Store], Any]


class Writer:
    def __init__(
        self,
        store: Store,
        max_batches: int = 256,
        max_rows: int = 4_000_000,
        on_commit: Callable[[list[tuple[Batch, bool]], float], None] | None = None,
        group_rows: int = 500_000,
        group_wait_s: float = GROUP_WAIT_S,
        group_gap_s: float = GROUP_GAP_S,
    ) -> None:
        self.store = store
        self.max_rows = max_rows
        self._q: queue.Queue[_BatchItem | _CallItem | None] = queue.Queue(maxsize=max_batches)
        self._rows = 0
        self._oldest: list[float] = []  # enqueue times of pending items, oldest first
        self._lock = threading.Lock()
        self._on_commit = on_commit
        self._thread = threading.Thread(target=self._run, name="fleetlens-writer", daemon=True)
        self.rows_per_s_ewma = 0.0
        self.errors = 0
        self.group_rows = group_rows
        self.group_wait_s, self.group_gap_s = group_wait_s, group_gap_s
        self.rows_written = 0
        self.busy_cpu_s = 0.0  # CPU time of the writer thread inside transactions

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Drain what is queued, then stop (blocking put: shutdown must not drop the sentinel)."""
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join(timeout)

    # ---- producers -------------------------------------------------------------------------
    def submit_batch(self, batch: Batch) -> Future:
        return self._submit(_BatchItem(batch.rows, time.monotonic(), Future(), batch))

    def submit_call(self, fn: Callable[[Store], Any], block: bool = True) -> Future:
        """Run ``fn(store)`` on the writer thread (loop outputs, registrations, retention)."""
        item = _CallItem(0, time.monotonic(), Future(), fn)
        if block:
            self._track(item)
            self._q.put(item)
            return item.future
        return self._submit(item)

    def _submit(self, item: _BatchItem | _CallItem) -> Future:
        with self._lock:
            if self._rows + item.rows > self.max_rows and self._rows > 0:
                raise Backpressure(self._retry_after())
            self._rows += item.rows
            self._oldest.append(item.enqueued)
        try:
            self._q.put_nowait(item)
        except queue.Full:
            self._untrack(item)
            raise Backpressure(self._retry_after()) from None
        return item.future

    def _track(self, item: _Queued) -> None:
        with self._lock:
            self._rows += item.rows
            self._oldest.append(item.enqueued)

    def _untrack(self, item: _Queued) -> None:
        with self._lock:
            self._rows -= item.rows
            if item.enqueued in self._oldest:
                self._oldest.remove(item.enqueued)

    def _retry_after(self) -> float:
        # Time to drain what is queued at the recent write rate; at least 1 s.
        rate = self.rows_per_s_ewma or 100_000.0
        return max(1.0, min(60.0, self._rows / rate))

    # ---- observability ---------------------------------------------------------------------
    def depth(self) -> int:
        return self._q.qsize()

    def queued_rows(self) -> int:
        return self._rows

    def lag_s(self) -> float:
        """Age of the oldest item still waiting or being written (0 when idle)."""
        with self._lock:
            return time.monotonic() - self._oldest[0] if self._oldest else 0.0

    # ---- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        pending: list[_CallItem | None] = []  # what ended the last group, handled next
        while True:
            item = pending.pop() if pending else self._q.get()
            if item is None:
                return
            if isinstance(item, _CallItem):
                self._run_call(item)
                continue
            group = [item]
            rows = item.rows
            # Group commit: batches already queued, and those still coming close behind, go
            # into the same transaction; a call or the stop sentinel ends the group.
            deadline = item.enqueued + self.group_wait_s
            while rows < self.group_rows:
                wait = min(self.group_gap_s, deadline - time.monotonic())
                try:
                    nxt = self._q.get(timeout=wait) if wait > 0 else self._q.get_nowait()
                except queue.Empty:
                    break
                if not isinstance(nxt, _BatchItem):
                    pending.append(nxt)  # handled right after this group (None: stop)
                    break
                group.append(nxt)
                rows += nxt.rows
            self._run_group(group)

    def _run_call(self, item: _CallItem) -> None:
        try:
            result = item.call(self.store)
        except BaseException as e:
            self.errors += 1
            log.exception("writer: call failed")
            self._untrack(item)
            _resolve(item.future, error=e)
            return
        self._untrack(item)
        _resolve(item.future, result)

    def _run_group(self, group: list[_BatchItem]) -> None:
        t_cpu, t0 = time.thread_time(), time.perf_counter()
        try:
            flags = self.store.insert_batches([it.batch for it in group], time.time_ns())
        except BaseException:
            if len(group) > 1:  # one bad batch must not fail its neighbours: retry one by one
                for it in group:
                    self._run_group([it])
                return
            self.errors += 1
            log.exception("writer: batch failed")
            self._untrack(group[0])
            _resolve(group[0].future, error=RuntimeError("write failed; see collector log"))
            return
        dt = time.perf_counter() - t0
        self.busy_cpu_s += time.thread_time() - t_cpu
        rows = sum(it.rows for it in group)
        self.rows_written += rows
        if dt > 0 and rows:
            self.rows_per_s_ewma = 0.8 * self.rows_per_s_ewma + 0.2 * rows / dt
        # The hook sees the whole group at once: its metrics, look-back and arrivals cost a
        # fixed ~0.5 ms of GIL time per call, paid once per commit, not once per batch.
        if self._on_commit:
            try:
                self._on_commit([(it.batch, s) for it, s in zip(group, flags, strict=True)], dt)
            except Exception:  # metrics must never fail an acknowledged write
                log.exception("writer: on_commit hook failed")
        for it, stored in zip(group, flags, strict=True):
            self._untrack(it)
            _resolve(it.future, stored)


def _resolve(fut: Future, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve a future even if its waiter gave up (cancelled): the writer must never die."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except InvalidStateError:
        pass
