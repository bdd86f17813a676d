"""The names of FleetLens on NATS JetStream (issue 27): stream, subjects, partitions.

Agents (and the simulator) publish each window batch to the stream :data:`STREAM` on the
subject ``fleetlens.windows.<partition>``; collector shards consume the partitions they own.

A sending host's **partition** comes from the inventory's topology:

- host wiring (every NIC of a host on one leaf): the host's leaf, e.g. ``leaf3``;
- rail wiring (NIC *k* of every host on rail *k*'s leaves): the host is on several leaves, so
  its partition is its **pod**, the set of leaves its NICs attach to (hosts with the same set
  share their leaves' uplinks), named ``pod-<its first leaf>`` (the set's leaf of lowest
  index; two sets with the same first leaf would share a partition: coarser, still correct);
- a host not in the inventory: ``x<NN>``, one of :data:`UNKNOWN_BUCKETS` stable hashes of its
  id, so its batches still stay in order on one subject.

A leaf or pod of more than :data:`HOSTS_PER_PARTITION` hosts is split by a stable hash of the
host id into ``<leaf or pod>-<k>``, k < ⌈hosts / HOSTS_PER_PARTITION⌉: a partition is what one
shard owns, so partitions must far outnumber shards to share the load evenly, and a rail-wired
fleet has few pods (4 at 1024 hosts × 8 NICs on 32 leaves) of many hosts each. 32 hosts send
~29 k rows a second, under a third of what one shard's core stores (``bench/shards.py store``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from fleetlens.topology import TIER_LEAF, Topology

T = TypeVar("T")

STREAM = "FLEETLENS_WINDOWS"
SUBJECT_PREFIX = "fleetlens.windows"
SUBJECTS = f"{SUBJECT_PREFIX}.>"
MSG_ID = "Nats-Msg-Id"
CONTENT_TYPE = "Content-Type"  # header: the batch encoding, as HTTP ingest's (batch.py)
UNKNOWN_BUCKETS = 4
HOSTS_PER_PARTITION = 32
# How long JetStream remembers message ids: a retry within it is dropped (the agents' spool
# retries for longer only across an outage; the collector's batch-id table still dedupes).
DUPLICATE_WINDOW_S = 600.0


def subject(partition: str) -> str:
    return f"{SUBJECT_PREFIX}.{partition}"


def partition_of_subject(subj: str) -> str:
    return subj.removeprefix(SUBJECT_PREFIX + ".")


def stable_hash(text: str) -> int:
    """The same integer in every process (Python's ``hash`` of a str is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def unknown_partition(host: str) -> str:
    return f"x{stable_hash(host) % UNKNOWN_BUCKETS:02d}"


class Partitions:
    """Every host's partition under one inventory (None: every host hashed)."""

    def __init__(self, topology: Topology | None) -> None:
        self.by_host: dict[str, str] = {}
        self._placed: dict[int, dict[str, int]] = {}  # shards -> partition -> preferred shard
        if topology is None:
            return
        order = {s.id: i for i, s in enumerate(topology.switches_of_tier(TIER_LEAF))}
        groups: dict[str, list[str]] = {}
        for host, nics in topology.nics_by_host.items():
            leaves = sorted({n.leaf for n in nics}, key=order.__getitem__)
            group = leaves[0] if len(leaves) == 1 else f"pod-{leaves[0]}"
            groups.setdefault(group, []).append(host)
        for group, hosts in groups.items():
            parts = -(-len(hosts) // HOSTS_PER_PARTITION)
            for h in hosts:
                self.by_host[h] = group if parts == 1 else f"{group}-{stable_hash(h) % parts}"

    def of(self, host: str) -> str:
        return self.by_host.get(host) or unknown_partition(host)

    def all(self) -> list[str]:
        """Every partition a shard may own: the inventory's, then the hashed buckets."""
        known = sorted(set(self.by_host.values()))
        return known + [f"x{i:02d}" for i in range(UNKNOWN_BUCKETS)]

    def preferred_shard(self, partition: str, shards: int) -> int:
        """The shard that owns ``partition`` when every shard is alive (I of ``--shard I/K``).

        Placed by load, the same in every process with the same inventory: largest partition
        first (hosts), each to the shard with the fewest hosts so far (ties: lowest index); a
        hash put 1.8x the mean on one of 4 shards of the reference fleet (then 4 pods)."""
        if shards not in self._placed:
            load = [0] * shards
            placed: dict[str, int] = {}
            size = Counter(self.by_host.values())
            for p in sorted(self.all(), key=lambda p: (-size[p], p)):
                placed[p] = min(range(shards), key=lambda i: (load[i], i))
                load[placed[p]] += max(size[p], 1)  # the hashed buckets spread too
            self._placed[shards] = placed
        got = self._placed[shards].get(partition)
        return stable_hash(partition) % shards if got is None else got


def parse_shard(spec: str) -> tuple[int, int]:
    """``I/K`` (shard I of K, from 0) to (I, K); ValueError naming what is wrong."""
    i, sep, k = spec.partition("/")
    if not sep or not i.isdigit() or not k.isdigit() or not 0 <= int(i) < int(k):
        raise ValueError(f"--shard wants I/K with 0 <= I < K, got {spec!r}")
    return int(i), int(k)


def server_urls(spec: str | Sequence[str]) -> list[str]:
    """``URL[,URL...]`` to the list of servers a client may connect to."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    urls = [u.strip() for u in parts if u.strip()]
    if not urls:
        raise ValueError("--nats wants URL[,URL...]")
    return urls


class PublishError(RuntimeError):
    """The stream did not confirm a batch (no server, no stream leader, timeout): retry it
    with the same batch id."""


class Publisher:
    """Publishes batches to :data:`STREAM` from ordinary threads (agents' uploader, the
    simulator's posting pool): one NATS connection on an event loop of its own thread, which
    reconnects across the servers by itself. Needs ``nats-py`` (the ``nats`` extra)."""

    def __init__(self, servers: str | Sequence[str], replicas: int = 3, timeout_s: float = 5.0):
        self.servers = server_urls(servers)
        self.replicas = replicas
        self.timeout_s = timeout_s
        self._runner = LoopThread("nats")
        self._nc: Any = None
        self._js: Any = None
        self._ready = False  # the stream exists (checked once per publisher)
        # Callers on several threads: the first publishes would each open a connection (all
        # but one never closed) without it.
        self._connecting = asyncio.Lock()

    async def _connect(self) -> None:
        async with self._connecting:
            await self._connect_once()

    async def _connect_once(self) -> None:
        import nats

        if self._nc is None:
            self._nc = await nats.connect(
                self.servers, max_reconnect_attempts=-1, connect_timeout=self.timeout_s,
                allow_reconnect=True,
            )  # fmt: skip
            self._js = self._nc.jetstream(timeout=self.timeout_s)
        if not self._ready:
            await ensure_stream(self._js, self.replicas)
            self._ready = True

    async def _publish(self, subj: str, batch_id: str, body: bytes, ctype: str) -> bool:
        await self._connect()
        ack = await self._js.publish(subj, body, headers={MSG_ID: batch_id, CONTENT_TYPE: ctype})
        return not ack.duplicate

    def publish(self, partition: str, batch_id: str, body: bytes, ctype: str) -> bool:
        """Store one batch in the stream: True if new, False for a retry JetStream dropped.
        Raises :class:`PublishError` when the stream did not confirm it (retry, same id)."""
        try:
            coro = self._publish(subject(partition), batch_id, body, ctype)
            return self._runner.run(coro, self.timeout_s * 3)
        except Exception as e:
            raise PublishError(f"{type(e).__name__}: {e}") from e

    def close(self) -> None:
        """Idempotent: a second call neither reconnects nor leaves a close() coroutine unrun."""
        nc, self._nc = self._nc, None
        if nc is not None:
            with contextlib.suppress(Exception):  # a connection that is already gone
                self._runner.run(nc.close(), self.timeout_s)
        self._runner.close()


class LoopThread:
    """An asyncio loop on a thread of its own: nats-py is asyncio, its callers (the agent's
    uploader, the simulator's pool, the collector's threads) are not."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


async def ensure_stream(
    js: Any,
    replicas: int,
    name: str = STREAM,
    subjects: str = SUBJECTS,
    max_age_s: float | None = None,
    patience_s: float = 30.0,
) -> None:
    """Create stream ``name`` if missing (``replicas`` copies, messages kept ``max_age_s``,
    None: without limit; existing streams are kept). A cluster just started, or electing its
    meta leader, answers nothing for a while: asked again for up to ``patience_s``."""
    from nats.errors import TimeoutError as NoAnswer
    from nats.js.api import StreamConfig
    from nats.js.errors import NotFoundError, ServiceUnavailableError

    cfg = StreamConfig(name=name, subjects=[subjects], num_replicas=replicas,
                       duplicate_window=DUPLICATE_WINDOW_S, max_age=max_age_s)  # fmt: skip
    deadline = time.monotonic() + patience_s
    while True:
        try:
            try:
                await js.stream_info(name)
            except NotFoundError:
                await js.add_stream(cfg)
            return
        except (NoAnswer, ServiceUnavailableError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
