"""The fleet tier: a collector whose windows are the shards' summaries (issue 27).

``fleetlens fleet --nats URL --shards K --inventory FILE --listen HOST:PORT --db PATH
[--parquet DIR[,DIR]]`` (``fleetcli.py``) runs :class:`FleetCollector`, the collector's own
machinery (writer, arrivals, settling, feed, clock gate, publish, served, REST API and
``/metrics``), with two differences:

- its input is the stream ``FLEETLENS_SUMMARIES`` (subjects ``fleetlens.summaries.<partition>``),
  one summary per batch a shard committed, several to a message (``summaries.py``), consumed
  by :class:`SummaryConsumer` with a durable pull consumer: each summary is checked (as an
  ingest batch is, with the tier's known NICs) and stored by the tier's writer, and the
  message acknowledged once they are committed; a hostile or malformed message or summary is
  counted (``fleetlens_ingest_rejected_total``) and acknowledged, never redelivered. A
  summary's id is its batch's: the tier's batch-id table drops one a restarted shard
  publishes again;
- its windows are held in memory and its history read from the shards' Parquet files
  (``fleetstore.py``).

A window generation is complete when every live agent's summary is in, by the collector's own
rules (``arrivals.py``: a summary is a host's batch), or after its maximum waits: finer than
"every partition's owner reported", and the same rule a single collector follows, so the
rounds see what a collector fed the same windows sees. ``--shards K`` is what
``fleetlens_fleet_shards_reporting`` (shards with a summary in the last 10 s) is compared with.

Shards publish through :class:`SummaryPublisher`, the ``CommitSink`` a shard calls after each
commit: it summarizes and publishes on a thread of its own, in commit order, each summary
retried until stored. A shard that dies between a commit and its summaries' publication
loses them (the shard acknowledged the windows already, and a redelivered batch is a
duplicate it does not hand on): the fleet tier then judges that window without those hosts
once its waits are over.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from fleetlens.api import summaries
from fleetlens.api.config import Settings
from fleetlens.api.fleetstore import FleetStore
from fleetlens.api.registry import RegistryWriter
from fleetlens.api.service import Collector, Engines
from fleetlens.api.store import Store
from fleetlens.api.writer import Backpressure
from prometheus_client import Counter, Gauge

from fleetlens.batch import Batch, BatchError
from fleetlens.stream import MSG_ID, LoopThread, ensure_stream

log = logging.getLogger("fleetlens.fleet")

STREAM = "FLEETLENS_SUMMARIES"
SUBJECT_PREFIX = "fleetlens.summaries"
DURABLE = "fleet"
SHARD_HEADER = "Fleetlens-Shard"  # I/K of the shard that published a summary
# A summary matters for the loops' waits, seconds; kept an hour (a fleet tier restarted
# within it catches up from its durable consumer), then dropped.
MAX_AGE_S = 3600.0
# Summary rows kept beyond the look-back and the longest settling wait (fleetstore.py).
KEEP_SPARE_NS = 10_000_000_000
REPORTING_S = 10.0  # a shard with a summary this recent is reporting
FETCH = 64  # summaries per pull
ACK_WAIT_S = 30.0
STOP_WAIT_S = 5.0  # for the consumer's group in flight when the tier stops


def subject(partition: str) -> str:
    return f"{SUBJECT_PREFIX}.{partition}"


class FleetCollector(Collector):
    """The collector over summaries: windows held in memory, history from Parquet."""

    def __init__(
        self, settings: Settings, parquet: Sequence[Path] = (), engines: Engines | None = None,
        registry: RegistryWriter | None = None,
    ) -> None:  # fmt: skip
        self.parquet = list(parquet)
        self.registry = registry
        super().__init__(settings, engines)
        r = self.metrics.registry
        self.summaries = Counter(
            "fleetlens_fleet_summaries", "Summaries stored (new), per publishing shard", ["shard"],
            registry=r,
        )  # fmt: skip
        self._shard_seen: dict[str, float] = {}
        self.shards_expected = Gauge(
            "fleetlens_fleet_shards_expected", "Shards the tier expects (--shards)", registry=r
        )
        Gauge(
            "fleetlens_fleet_shards_reporting",
            f"Shards with a summary in the last {REPORTING_S:g} s", registry=r,
        ).set_function(self.shards_reporting)  # fmt: skip

    def _open_store(self) -> Store:
        s = self.settings
        keep = s.loop_lookback_ns + s.triangulate_max_wait_ns + KEEP_SPARE_NS
        return FleetStore(s.db_path, self.parquet, keep, s.duckdb_threads, s.duckdb_memory_limit)

    def register(self, host: str, nics: list[dict[str, str]], meta: dict[str, Any]) -> None:
        """Shared with the shards first (``registry.py``; raises ``RegistryUnavailable``), so
        the agent is answered only once a shard can find what it registered."""
        if self.registry is not None:
            self.registry.put(host, nics, meta)
        super().register(host, nics, meta)

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.registry is not None:
                self.registry.close()

    def take(self, summary: summaries.Summary, shard: str, now_ns: int) -> Future[bool]:
        """A summary off the wire (``summaries.decode``), checked and queued for the writer;
        the future says whether it was new. Raises ``BatchError`` (rejected) or
        ``Backpressure`` (try again)."""
        batch = summary.batch()
        self.check_context(batch, now_ns)
        fut = self.submit(batch)
        self._shard_seen[shard] = time.monotonic()
        counter = self.summaries.labels(shard or "unknown")
        fut.add_done_callback(lambda f: _count_new(f, counter))
        return fut

    def shards_reporting(self) -> int:
        now = time.monotonic()
        return sum(1 for t in list(self._shard_seen.values()) if now - t <= REPORTING_S)


def _count_new(stored: Future[bool], counter: Any) -> None:
    """Count a summary once stored, and only if new: one published again (a shard's group
    redelivered and regrouped) is dropped by the batch-id table, not counted."""
    if not stored.cancelled() and stored.exception() is None and stored.result():
        counter.inc()


# ---- NATS -----------------------------------------------------------------------------------
async def ensure_summaries(js: Any, replicas: int) -> None:
    """``FLEETLENS_SUMMARIES``, created if missing."""
    await ensure_stream(js, replicas, STREAM, f"{SUBJECT_PREFIX}.>", MAX_AGE_S)


async def publish(
    js: Any, subj: str, body: bytes, headers: dict[str, str], timeout_s: float
) -> None:
    """Publish until JetStream stored it (same message id: a stored retry is dropped). A stream
    just created, or a cluster electing a leader, answers nothing for a moment."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await js.publish(subj, body, headers=headers)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


class SummaryConsumer:
    """Pulls summaries from JetStream into a :class:`FleetCollector`, acknowledging each once
    stored (or rejected)."""

    def __init__(self, fleet: FleetCollector, urls: str, replicas: int = 3) -> None:
        self.fleet, self.urls, self.replicas = fleet, urls, replicas
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._runner: LoopThread | None = None
        self._task: Future[None] | None = None

    def start(self) -> None:
        self._runner = LoopThread("fleet-summaries")
        self._task = asyncio.run_coroutine_threadsafe(self._run(), self._runner.loop)

    def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            if self._connected.is_set():  # let the group in flight finish
                with suppress(Exception):  # stopping: a failure was logged where it happened
                    self._task.result(timeout=STOP_WAIT_S)
            # Still connecting (NATS unreachable: nats-py retries a first connection forever),
            # or slow: a group cut short is redelivered and deduplicated.
            self._task.cancel()
        if self._runner is not None:
            self._runner.close()

    @asynccontextmanager
    async def attached(self) -> AsyncIterator[None]:
        """For ``create_app(attached=...)``: consume while the collector runs."""
        self.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, self.stop)

    async def _run(self) -> None:
        import nats

        while not self._stop.is_set():
            try:
                nc = await nats.connect(self.urls.split(","), max_reconnect_attempts=-1)
            except Exception as e:
                log.warning("fleet: cannot reach NATS (%s); retrying", e)
                await asyncio.sleep(1.0)
                continue
            self._connected.set()
            try:
                await self._consume(nc)
            except Exception:
                log.exception("fleet: summary consumer failed; resuming")
                await asyncio.sleep(1.0)
            finally:
                self._connected.clear()
                await nc.close()

    async def _consume(self, nc: Any) -> None:
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.api import AckPolicy, ConsumerConfig

        js = nc.jetstream()
        await ensure_summaries(js, self.replicas)
        cfg = ConsumerConfig(
            durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_S,
            max_ack_pending=4096,
        )  # fmt: skip
        sub = await js.pull_subscribe(f"{SUBJECT_PREFIX}.>", durable=DURABLE, config=cfg)
        while not self._stop.is_set():
            try:
                msgs = await sub.fetch(FETCH, timeout=1.0)
            except (TimeoutError, NatsTimeout):  # nothing new within a second
                continue
            await asyncio.gather(*(self._one(m) for m in msgs))

    async def _one(self, msg: Any) -> None:
        """A message's summaries stored, then the message acknowledged; a malformed message,
        or a summary failing the tier's checks, is counted and not stored (the others of its
        message are), and never redelivered."""
        shard = (msg.headers or {}).get(SHARD_HEADER, "")
        try:
            group = summaries.decode(msg.data)
        except BatchError as e:
            self._rejected(msg, e)
            await msg.term()  # acknowledged: never redelivered
            return
        stored = []
        for s in group:
            while True:
                try:
                    stored.append(self.fleet.take(s, shard, time.time_ns()))
                except BatchError as e:
                    self._rejected(msg, e)
                except Backpressure:
                    await asyncio.sleep(0.2)  # the writer is full: hold the message, retry
                    continue
                break
        await asyncio.gather(*(asyncio.wrap_future(f) for f in stored))
        await msg.ack()

    def _rejected(self, msg: Any, e: BatchError) -> None:
        self.fleet.metrics.reject(e.reason)
        log.warning("fleet: summary on %s rejected: %s", msg.subject, e)


def _log_failure(fut: Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("fleet: summaries not published: %s", fut.exception())


class SummaryPublisher:
    """A shard's ``CommitSink``: after each commit, its batches' summaries to JetStream
    (subject ``fleetlens.summaries.<partition>``, a few messages a group, ``summaries.encode``),
    each message retried until stored; off the shard's event loop, in commit order. The shard
    acknowledges a group only once its summaries are stored."""

    def __init__(self, urls: str, shard: str = "", replicas: int = 3, timeout_s: float = 30.0):
        self.urls, self.shard, self.replicas, self.timeout_s = urls, shard, replicas, timeout_s
        self._runner = LoopThread("summary-publisher")
        self._nc: Any = None  # connected at the first commit: a shard starts without NATS
        self._js: Any = None
        self._order = asyncio.Lock()
        self._pending: list[Future[None]] = []

    def committed(self, partition: str, batches: Sequence[Batch]) -> Future[None] | None:
        """Queued: summarized and published on the publisher's thread, in commit order (the
        shard calls this on its event loop, which must not block on NATS); done when stored."""
        new = [b for b in batches if b.rows]
        if not new:
            return None
        fut = asyncio.run_coroutine_threadsafe(self._publish(partition, new), self._runner.loop)
        fut.add_done_callback(_log_failure)
        self._pending.append(fut)
        self._pending = [f for f in self._pending if not f.done()]
        return fut

    async def _connect(self) -> None:
        import nats

        if self._nc is None:
            self._nc = await nats.connect(self.urls.split(","), max_reconnect_attempts=-1)
            self._js = self._nc.jetstream()
            await ensure_summaries(self._js, self.replicas)

    async def _publish(self, partition: str, batches: list[Batch]) -> None:
        async with self._order:  # one group at a time: published in commit order
            await self._connect()
            made = summaries.of_batches(partition, batches)
            messages = summaries.encode(made, self._nc.max_payload)
            await self._send(subject(partition), messages)

    async def _send(self, subj: str, bodies: list[tuple[str, bytes]]) -> None:
        await asyncio.gather(*(
            publish(self._js, subj, body, {MSG_ID: i, SHARD_HEADER: self.shard}, self.timeout_s)
            for i, body in bodies
        ))  # fmt: skip

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every summary queued so far is stored (or failed, logged)."""
        for f in list(self._pending):
            with suppress(Exception):
                f.result(timeout_s)

    def close(self) -> None:
        self.flush()
        try:
            if self._nc is not None:
                self._runner.run(self._nc.drain(), 10)
        finally:
            self._runner.close()
