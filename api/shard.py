"""A collector shard: the partitions it owns, consumed from NATS JetStream (issue 27).

``fleetlens collector --nats URL[,URL...] --shard I/K --db PATH`` is a collector (same writer,
store, checks, read API and ``/metrics``) whose batches come from the stream
``FLEETLENS_WINDOWS`` (``fleetlens/stream.py``) instead of ``POST /v1/ingest``.

**Ownership.** Every partition has a preferred shard (placed by load, ``preferred_shard``). A
shard holds a partition by a lease, the key ``lease.<partition>`` of the KV bucket
``FLEETLENS_LEASES`` whose entries expire after ``--lease-ttl-seconds`` unless refreshed (every
third of it). A shard leases its preferred partitions, and any partition whose preferred shard
is not alive (its ``alive.<I>`` key expired); it releases such a partition once that shard is
alive again. Its owner reads it through a durable pull consumer of its own
(``p-<partition>-s<I>``, at most ``fetch`` messages unacknowledged), made from the partition's
mark on after deleting every other shard's consumer of it, so an old owner that resumes from a
pause cannot pull the new owner's messages.

**Ack after commit.** A fetched group of messages is checked like HTTP ingest (body size,
encoding, schema, values, known NICs, not from the future, and the sending host must belong to
the subject's partition: a forged host); a refused message is counted in
``fleetlens_ingest_rejected_total{reason}`` and terminated (``term``: never redelivered), the
others go to the writer (its group commit). Once the writer reports the commit, the shard
advances the partition's **mark** (KV bucket ``FLEETLENS_MARKS``, ``mark.<partition>``: the
highest stream sequence stored, and by which shard) by compare-and-set on the revision it last
wrote, then acknowledges the group and hands the new batches to the ``CommitSink``s.

**Nothing stored twice: the guarantee.** Groups of a partition are processed one at a time, so
a shard's batches that are committed but not covered by its mark are at most its one group in
flight. A shard taking a partition over writes the mark with itself as owner and the old owner
as ``from`` (compare-and-set: from then on the old owner's mark update fails, so it never
acknowledges that group), notes ``handover.<old>.<partition>`` = the mark it took over, and
reads through its own consumer, made to start after that mark: every message at or below it is
skipped (already stored). A mark still naming ``from`` is a handover not yet noted (its shard
died right after the compare-and-set): whoever acquires the partition next writes the note
first, and the new owner's first advance, which drops ``from``, comes only after its note. The
old owner reconciles when it restarts, or at once when its mark update fails (a paused shard
resuming): from the note, or from the mark itself while it names this shard as ``from``, it
reads the first ``fetch`` messages of the partition after the handover mark (its group in
flight can only be those) and deletes from its file every one of them it stored, then
re-exports the minutes they touched. So: a batch is in exactly one shard's file once the old
owner has reconciled; until then (an old owner that is down) its file may hold one group per
partition it lost that another shard stored too. Within a shard, redeliveries are dropped by
the batch-id table, and retries of a publisher within the stream's duplicate window by
JetStream itself."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fleetlens.api import registry
from fleetlens.api.shardexport import MinuteExport
from fleetlens.api.writer import Backpressure
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector as PromCollector

from fleetlens.batch import CT_ARROW, Batch, BatchError, decode_batch
from fleetlens.stream import (
    CONTENT_TYPE,
    MSG_ID,
    STREAM,
    Partitions,
    ensure_stream,
    subject,
)  # fmt: skip

if TYPE_CHECKING:
    from fleetlens.api.service import Collector

log = logging.getLogger("fleetlens.api.shard")

LEASES, MARKS = "FLEETLENS_LEASES", "FLEETLENS_MARKS"
STALL_FETCHES = 5  # empty fetches (1 s each) before a consumer is asked why


class CommitSink(Protocol):
    """Told of each group of a partition's batches once committed, before the group is
    acknowledged (the fleet tier's summary publisher plugs in here). A redelivered group is
    told again, its batches already stored included: what a sink sends must be idempotent
    (the summaries' message id is the batch id). The future it may return is awaited before
    the acknowledgement, so a shard that dies first leaves the group to be redelivered and
    told again; a failed one ends the ownership like a failed commit."""

    def committed(self, partition: str, batches: Sequence[Batch]) -> Future[None] | None: ...


@dataclass(frozen=True)
class ShardConfig:
    servers: list[str]
    index: int
    shards: int
    replicas: int = 3
    lease_ttl_s: float = 10.0
    fetch: int = 64  # messages per group; also the consumer's unacknowledged bound

    @property
    def ack_wait_s(self) -> float:
        """A group unacknowledged this long goes to the next fetch: two leases' time, when
        its shard has surely lost the partition (a slow commit of its own is deduplicated)."""
        return 2 * self.lease_ttl_s


@dataclass
class _Owned:
    lease_rev: int
    base: int = 0  # the mark taken over: its consumer delivers the messages after it
    mark_rev: int = 0
    stopping: bool = False
    task: asyncio.Task[None] | None = None
    beat: float = field(default_factory=time.monotonic)  # its consumer's last loop


class _Stalled(RuntimeError):
    """A consumer that delivers nothing while messages wait: made again from the mark."""


@dataclass
class _Lag:
    pending: int = 0
    oldest_s: float = 0.0
    # The oldest message a group fetched since the last measure, and what was still behind
    # it: a backlog drained between two measures still shows for one of them.
    seen_s: float = 0.0
    seen_pending: int = 0


@dataclass
class ShardCounters:
    stored: dict[str, int] = field(default_factory=dict)  # new batches committed, by partition
    reconciled: int = 0  # batches deleted from this file: another shard stored them
    learned: int = 0  # registrations read from the registry for windows of unknown NICs
    takeovers: int = 0


class Shard:
    def __init__(
        self, collector: Collector, cfg: ShardConfig, export: MinuteExport | None,
        sinks: Sequence[CommitSink] = (),
    ) -> None:  # fmt: skip
        self.c, self.cfg, self.export = collector, cfg, export
        self.sinks = [*([export] if export else []), *sinks]
        self.partitions = Partitions(collector.topology)
        self.owned: dict[str, _Owned] = {}
        self.lag: dict[str, _Lag] = {}
        self.counters = ShardCounters()
        self._nc: Any = None
        self._js: Any = None
        self._leases: Any = None
        self._marks: Any = None
        self._registry: Any = None
        collector.metrics.add_collector(ShardMetrics(self))

    # ---- lifecycle ---------------------------------------------------------------------------
    def attached(self) -> Callable[[], contextlib.AbstractAsyncContextManager[None]]:
        """The app's ``attached`` hook: consume while the collector serves."""

        @contextlib.asynccontextmanager
        async def run() -> AsyncIterator[None]:
            await self.connect()
            task = asyncio.create_task(self.run())
            try:
                yield
            finally:
                task.cancel()
                await self.close()

        return run

    async def connect(self) -> None:
        import nats
        from nats.js.api import KeyValueConfig

        self._nc = await nats.connect(self.cfg.servers, max_reconnect_attempts=-1)
        self._js = self._nc.jetstream(timeout=5)
        await _retrying(lambda: ensure_stream(self._js, self.cfg.replicas))
        r = self.cfg.replicas
        self._leases = await _retrying(lambda: self._js.create_key_value(KeyValueConfig(
            bucket=LEASES, ttl=self.cfg.lease_ttl_s, replicas=r)))  # fmt: skip
        self._marks = await _retrying(lambda: self._js.create_key_value(KeyValueConfig(
            bucket=MARKS, replicas=r)))  # fmt: skip
        self._registry = await _retrying(lambda: registry.bucket(self._js, r))
        await self._reconcile_all()

    async def close(self) -> None:
        await asyncio.gather(*(self._release(p) for p in list(self.owned)))
        if self.export is not None:
            await asyncio.to_thread(self.export.export, time.time_ns(), True)
        with contextlib.suppress(Exception):
            await self._nc.close()

    async def run(self) -> None:
        tick = self.cfg.lease_ttl_s / 3
        beat = asyncio.create_task(self._heartbeat(tick))
        try:
            await self._rounds(tick)
        finally:
            beat.cancel()

    async def _heartbeat(self, every_s: float) -> None:
        """``alive.<I>``, on its own: a slow lease round must not make this shard look dead."""
        while True:
            try:
                await self._leases.put(f"alive.{self.cfg.index}", b"1")
            except Exception as e:
                log.warning("shard %d: heartbeat failed: %r", self.cfg.index, e)
            await asyncio.sleep(every_s)

    async def _rounds(self, tick: float) -> None:
        while True:
            try:
                await self._tick()
            except Exception:
                log.exception("shard: lease round failed (retried)")
            if self.export is not None:
                await asyncio.to_thread(self.export.export, time.time_ns())
            await asyncio.sleep(tick)

    # ---- leases ------------------------------------------------------------------------------
    async def _tick(self) -> None:
        """One lease round: partitions handled concurrently (each is a few KV round trips;
        one after the other they outlasted the lease on a loaded box)."""
        me, k = self.cfg.index, self.cfg.shards
        alive = {i for i in range(k) if i == me or await self._alive(i)}
        done = await asyncio.gather(*(self._lease(p, alive) for p in self.partitions.all()),
                                    return_exceptions=True)  # fmt: skip
        for p, e in zip(self.partitions.all(), done, strict=True):
            if isinstance(e, Exception):  # the others' leases were still refreshed
                log.warning("shard %d: lease of %s not refreshed: %r", me, p, e)
        await self._measure_lag()

    async def _alive(self, i: int) -> bool:
        """Shard ``i`` refreshed its key within a lease; when the bucket does not answer it is
        taken for alive (its partitions are not taken over on a guess)."""
        try:
            return await self._get(self._leases, f"alive.{i}") is not None
        except Exception:
            return True

    async def _lease(self, p: str, alive: set[int]) -> None:
        """Refresh, release or take the lease of ``p``."""
        from nats.js.errors import KeyWrongLastSequenceError

        me = self.cfg.index
        pref = self.partitions.preferred_shard(p, self.cfg.shards)
        owned = self.owned.get(p)
        if (
            owned is not None
            and owned.task is not None
            and not owned.task.done()
            and time.monotonic() - owned.beat > 2 * self.cfg.ack_wait_s
        ):
            # A client call that never returns (seen after a server's kill -9): start over.
            log.warning("shard %d: consumer of %s hung; made again", me, p)
            owned.task.cancel()
        if owned is not None and owned.task is not None and owned.task.done():
            await self._release(p)  # its consumer stopped: lease it again
            owned = None
        elif owned is not None and owned.stopping:
            return  # its consumer finishes its group first
        if owned is not None:
            if pref != me and pref in alive:
                owned.stopping = True  # released once its group is done (above)
                return
            try:
                owned.lease_rev = await self._leases.update(f"lease.{p}", _me(me),
                                                            last=owned.lease_rev)  # fmt: skip
            except KeyWrongLastSequenceError:
                held = await self._get(self._leases, f"lease.{p}")
                if held is not None and held.value == _me(me):  # an update that timed out
                    owned.lease_rev = held.revision  # but was applied
                    return
                if held is None:  # expired (a slow round) and nobody took it: take it back;
                    with contextlib.suppress(KeyWrongLastSequenceError):  # the mark's
                        owned.lease_rev = await self._leases.create(f"lease.{p}", _me(me))
                        return  # compare-and-set still fences a shard that took it meanwhile
                log.warning("shard %d: lease of %s lost", me, p)
                owned.stopping = True
        elif pref == me or pref not in alive:
            try:
                rev = await self._leases.create(f"lease.{p}", _me(me))
            except KeyWrongLastSequenceError:
                return  # held by another shard
            await self._acquire(p, rev)

    async def _acquire(self, p: str, lease_rev: int) -> None:
        from nats.js.errors import KeyWrongLastSequenceError

        got = await self._get(self._marks, f"mark.{p}")
        mark = _Mark(0, None) if got is None else _Mark.parse(got.value)
        seq, prev, rev = mark.seq, mark.shard, 0 if got is None else got.revision
        if mark.taken_from is not None:  # a handover whose new owner died before its note
            await self._note_handover(p, mark.taken_from, seq)
        await self._reconcile(p)  # our own note from an earlier loss of p comes first
        took = prev is not None and prev != self.cfg.index
        try:
            owned = _Owned(lease_rev, base=seq)
            doc = _Mark(seq, self.cfg.index, prev if took else None).doc()
            if got is None:
                owned.mark_rev = await self._marks.create(f"mark.{p}", doc)
            else:
                owned.mark_rev = await self._marks.update(f"mark.{p}", doc, last=rev)
        except KeyWrongLastSequenceError:  # the old owner moved its mark meanwhile: next round
            await self._leases.delete(f"lease.{p}")
            return
        if took:
            assert prev is not None
            await self._note_handover(p, prev, seq)
            self.counters.takeovers += 1
            log.warning("shard %d: took %s over from shard %d at mark %d", self.cfg.index, p,
                        prev, seq)  # fmt: skip
        owned.task = asyncio.create_task(self._consume(p, owned))
        self.owned[p] = owned
        log.info("shard %d: consuming %s from mark %d", self.cfg.index, p, seq)

    async def _release(self, p: str) -> None:
        owned = self.owned.pop(p, None)
        if owned is None:
            return
        owned.stopping = True
        if owned.task is not None:
            # A group still waiting for the cluster is cut short: unacknowledged, redelivered.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(owned.task, self.cfg.lease_ttl_s)
        log.info("shard %d: released %s", self.cfg.index, p)
        with contextlib.suppress(Exception):
            await self._leases.delete(f"lease.{p}")

    # ---- consuming ---------------------------------------------------------------------------
    def _durable(self, p: str) -> str:
        """This shard's durable consumer of ``p``."""
        return f"p-{p}-s{self.cfg.index}"

    async def _consumers_of(self, p: str) -> list[str]:
        """Every shard's consumer of ``p`` (any shard count: a fleet that had more shards
        leaves theirs), and the one all shards shared before they had their own."""
        infos = await _retrying(lambda: self._js.consumers_info(STREAM))
        ours = re.compile(re.escape(f"p-{p}-s") + r"[0-9]+")
        return [c.name for c in infos if ours.fullmatch(c.name) or c.name == f"p-{p}"]

    async def _consume(self, p: str, owned: _Owned) -> None:
        try:
            await self._consume_owned(p, owned)
        except _Stalled as e:  # an expected recovery, not a crash: no traceback
            log.warning("shard %d: %s", self.cfg.index, e)
        except Exception:
            log.exception("shard: consumer of %s stopped (leased again)", p)

    async def _consume_owned(self, p: str, owned: _Owned) -> None:
        import nats
        import nats.js.errors
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        # A consumer of its own from the mark on: what an earlier owner fetched and never
        # acknowledged is not waited for (ack_wait) nor delivered out of order. Every shard's
        # consumer of the partition goes first: an old owner resuming from a pause would
        # otherwise pull this owner's messages through a consumer of the same name, and the
        # mark, past them, would skip them for good.
        durable = self._durable(p)
        for name in await self._consumers_of(p):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await _retrying(functools.partial(self._js.delete_consumer, STREAM, name),
                                fatal=(nats.js.errors.NotFoundError,))  # fmt: skip
        subj = subject(p)
        cfg = ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT,
                             ack_wait=self.cfg.ack_wait_s, max_ack_pending=self.cfg.fetch,
                             filter_subject=subj, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                             opt_start_seq=owned.base + 1)  # fmt: skip
        sub = await _retrying(
            lambda: self._js.pull_subscribe(subj, durable=durable, stream=STREAM, config=cfg)
        )
        idle = 0
        try:
            while not owned.stopping:
                owned.beat = time.monotonic()
                try:
                    msgs = await sub.fetch(self.cfg.fetch, timeout=1.0)
                except (TimeoutError, nats.errors.TimeoutError):
                    idle += 1
                    if idle % STALL_FETCHES == 0 and await self._stalled(durable):
                        raise _Stalled(f"consumer {durable} delivers nothing while "
                                       "messages wait: made again") from None  # fmt: skip
                    continue  # nothing new on the partition
                except nats.js.errors.ServiceUnavailableError:
                    await asyncio.sleep(0.5)  # the consumer's leader moving (a node down)
                    continue
                if msgs:
                    # A group that fails ends this ownership: leased again from the mark, its
                    # messages come back in order.
                    idle = 0
                    await self._group(p, owned, msgs)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _stalled(self, durable: str) -> bool:
        """Messages wait but none came: a consumer made while its peers were electing (a
        server down) was seen to deliver nothing, ever."""
        info = await self._js.consumer_info(STREAM, durable)
        return bool(info.num_pending)

    def _decoded(self, p: str, m: Any) -> Batch:
        """The message checks that need no collector state: size, encoding, schema and
        values, and the host must send on its own partition."""
        if len(m.data) > self.c.settings.max_body_bytes:
            raise BatchError("body", f"larger than {self.c.settings.max_body_bytes}", "too_large")
        headers = m.headers or {}
        batch = decode_batch(m.data, headers.get(CONTENT_TYPE, CT_ARROW))
        if self.partitions.of(batch.host_id) != p:
            raise BatchError("host_id", f"{batch.host_id} does not send on {p}", "wrong_host")
        if headers.get(MSG_ID) not in (None, batch.batch_id):
            raise BatchError("batch_id", "differs from the message id", "invalid")
        return batch

    async def _checked(self, p: str, msgs: list[Any]) -> tuple[list[Batch], list[Any]]:
        """Every check of HTTP ingest: the group's batches that pass, and (message, error) of
        the others. Windows of NICs this shard does not know are checked again once their
        hosts' registrations are read from the registry (``registry.py``)."""
        good: list[Batch] = []
        refused: list[tuple[Any, BatchError]] = []
        unknown: list[tuple[Any, Batch]] = []
        for m in msgs:
            try:
                b = self._decoded(p, m)
            except BatchError as e:
                refused.append((m, e))
                continue
            try:
                self.c.check_context(b, time.time_ns())
                good.append(b)
            except BatchError as e:
                if e.reason == "unknown_nic":
                    unknown.append((m, b))
                else:
                    refused.append((m, e))
        if unknown:
            await self._learn({b.host_id for _, b in unknown})
            for m, b in unknown:
                try:
                    self.c.check_context(b, time.time_ns())
                    good.append(b)
                except BatchError as e:
                    refused.append((m, e))
        return good, refused

    async def _learn(self, hosts: set[str]) -> None:
        """Register, in this shard's file, every host of ``hosts`` the registry names."""
        for host in sorted(hosts):
            found = await registry.lookup(self._registry, host)
            if found is not None:
                await asyncio.to_thread(self.c.register, host, *found)
                self.counters.learned += 1

    async def _group(self, p: str, owned: _Owned, msgs: list[Any]) -> None:
        lag = self.lag.setdefault(p, _Lag())
        lag.seen_s = max(lag.seen_s, time.time() - min(m.metadata.timestamp.timestamp()
                                                        for m in msgs))  # fmt: skip
        lag.seen_pending = max(lag.seen_pending, len(msgs) + msgs[-1].metadata.num_pending)
        for m in msgs:
            self.c.metrics.received(len(m.data))
        good, refused = await self._checked(p, msgs)
        stored = [await f for f in [asyncio.wrap_future(await self._submit(b)) for b in good]]
        new = [b for b, s in zip(good, stored, strict=True) if s]
        if self.export is not None:
            self.export.stored(new)
        self.counters.stored[p] = self.counters.stored.get(p, 0) + len(new)  # committed
        await self._tell(p, good)
        if not await self._advance(p, owned, max(m.metadata.sequence.stream for m in msgs)):
            return
        for _m, why in refused:  # counted once terminated: a group retried counts them once
            self.c.metrics.reject(why.reason)
            log.warning("shard: refused a message on %s: %s", p, why)
        terminate = {id(m) for m, _ in refused}
        for m in msgs:
            await (m.term() if id(m) in terminate else m.ack())
        await self._nc.flush()

    async def _tell(self, p: str, batches: list[Batch]) -> None:
        """Every sink told of a committed group and done with it (raises: the group fails)."""
        for sink in self.sinks:
            done = sink.committed(p, batches)
            if done is not None:
                await asyncio.wrap_future(done)

    async def _submit(self, b: Batch) -> Any:
        while True:
            try:
                return self.c.submit(b)
            except Backpressure as e:  # the group waits: the consumer bounds what is fetched
                self.c.metrics.reject("backpressure")
                await asyncio.sleep(min(e.retry_after_s, 2.0))

    async def _advance(self, p: str, owned: _Owned, seq: int) -> bool:
        """The mark past a committed group; False (stop, reconcile) if another shard took p."""
        from nats.js.errors import KeyWrongLastSequenceError

        doc = _Mark(seq, self.cfg.index).doc()
        try:
            owned.mark_rev = await _retrying(
                lambda: self._marks.update(f"mark.{p}", doc, last=owned.mark_rev),
                attempts=10, fatal=(KeyWrongLastSequenceError,),
            )  # fmt: skip
            return True
        except KeyWrongLastSequenceError:
            now = await self._get(self._marks, f"mark.{p}")
            if now is not None and now.value == doc:  # an update that timed out was applied
                owned.mark_rev = now.revision
                return True
            log.warning("shard %d: %s was taken over; reconciling", self.cfg.index, p)
            owned.stopping = True
            await self._reconcile(p)
            return False

    # ---- reconciliation ----------------------------------------------------------------------
    async def _reconcile_all(self) -> None:
        """At start; each partition's asked again while the cluster elects the marks bucket's
        leader (seen: a get timing out with shards starting at once on a new cluster). Again
        is harmless: what was deleted stays deleted, and the note goes once done."""
        for p in self.partitions.all():
            await _retrying(functools.partial(self._reconcile, p))

    async def _note_handover(self, p: str, old: int, seq: int) -> None:
        await _retrying(lambda: self._marks.put(f"handover.{old}.{p}", str(seq).encode()))

    async def _reconcile(self, p: str) -> None:
        """Delete what another shard stored after taking ``p`` over from this one."""
        key = f"handover.{self.cfg.index}.{p}"
        got = await self._get(self._marks, key)
        if got is not None:
            seq = int(got.value)
        else:  # no note: a mark naming this shard as ``from`` is one not yet written
            mark = await self._get(self._marks, f"mark.{p}")
            parsed = None if mark is None else _Mark.parse(mark.value)
            if parsed is None or parsed.taken_from != self.cfg.index:
                return
            seq = parsed.seq
        batches = await self._after(p, seq, self.cfg.fetch)
        gone = await asyncio.wrap_future(
            self.c.writer.submit_call(lambda st: st.forget_batches(batches))
        )
        self.counters.reconciled += len(gone)
        if self.export is not None:
            self.export.forgotten(gone)  # their minutes are written again
        if got is not None:
            await self._marks.delete(key)
        log.warning("shard %d: reconciled %s: %d batches were stored by its new owner",
                    self.cfg.index, p, len(gone))  # fmt: skip

    async def _after(self, p: str, seq: int, n: int) -> list[Batch]:
        """The first ``n`` well-formed batches on ``p`` after stream sequence ``seq``."""
        from nats.js.errors import NotFoundError

        out: list[Batch] = []
        for _ in range(n):
            try:
                msg = await self._js.get_msg(STREAM, seq=seq + 1, next=True, subject=subject(p))
            except NotFoundError:
                break
            seq = msg.seq
            ctype = (msg.headers or {}).get(CONTENT_TYPE, CT_ARROW)
            with contextlib.suppress(BatchError):  # a refused one was never stored
                out.append(decode_batch(msg.data or b"", ctype))
        return out

    # ---- lag ---------------------------------------------------------------------------------
    async def _measure_lag(self) -> None:
        await asyncio.gather(*(self._measure(p) for p in list(self.owned)))
        for p in set(self.lag) - set(self.owned):
            del self.lag[p]  # another shard's now

    async def _measure(self, p: str) -> None:
        """Pending messages of ``p`` and the age of the oldest unacknowledged one."""
        from nats.js.errors import NotFoundError

        try:
            info = await self._js.consumer_info(STREAM, self._durable(p))
        except NotFoundError:
            return  # its consumer is being made
        lag = self.lag.setdefault(p, _Lag())
        now_pending = int(info.num_pending or 0) + int(info.num_ack_pending or 0)
        lag.pending, lag.oldest_s = max(now_pending, lag.seen_pending), lag.seen_s
        lag.seen_pending, lag.seen_s = 0, 0.0
        if not now_pending:
            return
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        with contextlib.suppress(NotFoundError):
            msg = await self._js.get_msg(STREAM, seq=floor + 1, next=True, subject=subject(p))
            if msg.time is not None:
                lag.oldest_s = max(lag.oldest_s, time.time() - msg.time.timestamp())

    @staticmethod
    async def _get(kv: Any, key: str) -> Any:
        from nats.js.errors import KeyNotFoundError

        try:
            return await kv.get(key)
        except KeyNotFoundError:
            return None


class ShardMetrics(PromCollector):
    """Per partition: pending messages, age of the oldest unacknowledged one, batches
    stored; partitions owned, takeovers, reconciled batches."""

    def __init__(self, shard: Shard) -> None:
        self.s = shard

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        s = self.s
        pending = GaugeMetricFamily("fleetlens_shard_partition_pending_messages",
                                    "Messages of an owned partition not yet acknowledged",
                                    labels=["partition"])  # fmt: skip
        oldest = GaugeMetricFamily("fleetlens_shard_partition_oldest_unacked_seconds",
                                   "Age of the oldest unacknowledged message of a partition",
                                   labels=["partition"])  # fmt: skip
        for p, lag in sorted(s.lag.items()):
            pending.add_metric([p], lag.pending)
            oldest.add_metric([p], lag.oldest_s)
        stored = CounterMetricFamily(
            "fleetlens_shard_batches_stored",
            "New batches committed, by partition",
            labels=["partition"],
        )
        for p, n in sorted(s.counters.stored.items()):
            stored.add_metric([p], n)
        yield pending
        yield oldest
        yield stored
        yield GaugeMetricFamily("fleetlens_shard_partitions_owned", "Partitions this shard "
                                "holds the lease of", value=len(s.owned))  # fmt: skip
        yield CounterMetricFamily("fleetlens_shard_takeovers", "Partitions taken over from "
                                  "another shard", value=s.counters.takeovers)  # fmt: skip
        yield CounterMetricFamily("fleetlens_shard_reconciled_batches", "Batches deleted "
                                  "from this file: the partition's new owner stored them",
                                  value=s.counters.reconciled)  # fmt: skip
        yield CounterMetricFamily("fleetlens_shard_registrations_learned", "Registrations read "
                                  "from the registry for windows of NICs this shard did not "
                                  "know", value=s.counters.learned)  # fmt: skip


def _me(index: int) -> bytes:
    return str(index).encode()


@dataclass(frozen=True)
class _Mark:
    """A partition's mark: the highest stream sequence stored, by which shard; ``taken_from``
    on the document a takeover writes, until the new owner's first advance."""

    seq: int
    shard: int | None
    taken_from: int | None = None

    def doc(self) -> bytes:
        d = {"seq": self.seq, "shard": self.shard}
        return json.dumps(d if self.taken_from is None else {**d, "from": self.taken_from}).encode()

    @staticmethod
    def parse(value: bytes) -> _Mark:
        d = json.loads(value)
        old = d.get("from")
        return _Mark(int(d["seq"]), int(d["shard"]), None if old is None else int(old))


async def _retrying(
    call: Callable[[], Any], attempts: int = 100, fatal: tuple[type[Exception], ...] = ()
) -> Any:
    """A JetStream API call while the cluster elects its leaders (start-up, a node down);
    the ``fatal`` errors are answers, raised at once."""
    for _ in range(attempts - 1):
        try:
            return await call()
        except fatal:
            raise
        except Exception as e:  # no responders / timeouts while leaders are elected
            log.info("shard: JetStream not ready (%s); retrying", e)
            await asyncio.sleep(0.2)
    return await call()
