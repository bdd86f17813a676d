"""Agents' registrations, shared by the fleet tier with the shards (issue 27).

Agents register with the fleet tier (``POST /v1/register``); their windows reach the shards.
A shard accepts a window only from NICs it knows: the inventory's, up front, and the
registered ones, which only the registrations' receiver knew: a host the inventory does not
list, or a NIC plugged in after start, was refused by every shard as an unknown NIC.

The tier writes each registration to the KV bucket :data:`REGISTRY` (key ``host.<host_id>``,
the latest registration wins) before it answers the agent, so an agent's first window always
comes after its registration is in the bucket. A shard that meets NICs it does not know looks
their hosts up there (:func:`lookup`, once per host per fetched group) and registers what it
finds in its own file before checking those windows again: a window is refused as an unknown
NIC only when no registration names its NIC. Looked up on a miss rather than watched: no race
between a registration and the first window, and nothing to keep in step while a shard is down.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fleetlens.stream import LoopThread

log = logging.getLogger("fleetlens.api.registry")

REGISTRY = "FLEETLENS_REGISTRY"
_META = ("ts_source", "metrics_port", "agent_version")


class RegistryUnavailable(RuntimeError):
    """The registration could not be written to the bucket: the agent should retry."""


def key(host: str) -> str:
    """The bucket key of a host (host ids are ``[A-Za-z0-9._-]``, all valid in a key)."""
    return f"host.{host}"


def encode(nics: list[dict[str, str]], meta: dict[str, Any]) -> bytes:
    doc = {"nics": [{"ifname": n["ifname"], "ip": n["ip"]} for n in nics],
           "meta": {k: meta.get(k) for k in _META}}  # fmt: skip
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(value: bytes) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """A registration read back; raises ValueError on anything but what :func:`encode` wrote."""
    try:
        doc = json.loads(value)
        nics = [{"ifname": str(n["ifname"]), "ip": str(n["ip"])} for n in doc["nics"]]
        meta = {k: doc["meta"].get(k) for k in _META}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"not a registration: {e}") from None
    if not nics:
        raise ValueError("not a registration: no NICs")
    return nics, meta


async def bucket(js: Any, replicas: int) -> Any:
    """The registry bucket; created with ``replicas`` copies if missing (the tier and the
    shards may be configured with different replica counts: the first one's stands)."""
    from nats.js.api import KeyValueConfig
    from nats.js.errors import BucketNotFoundError

    try:
        return await js.key_value(REGISTRY)
    except BucketNotFoundError:
        return await js.create_key_value(KeyValueConfig(bucket=REGISTRY, replicas=replicas))


async def lookup(kv: Any, host: str) -> tuple[list[dict[str, str]], dict[str, Any]] | None:
    """A host's latest registration, or None (never registered, or not readable)."""
    from nats.js.errors import KeyNotFoundError

    try:
        entry = await kv.get(key(host))
    except KeyNotFoundError:
        return None
    if entry.value is None:  # deleted
        return None
    try:
        return decode(entry.value)
    except ValueError as e:
        log.warning("registry: %s holds %s", key(host), e)
        return None


class RegistryWriter:
    """The fleet tier's side: each registration put into the bucket, on a thread of its own
    (the caller is a request handler's worker thread), before the agent is answered."""

    # Within the agents' HTTP timeout, so an agent hears 503 (and retries) rather than nothing.
    def __init__(self, urls: str, replicas: int = 3, timeout_s: float = 2.0) -> None:
        self.urls, self.replicas, self.timeout_s = urls, replicas, timeout_s
        self._runner = LoopThread("registry")
        self._nc: Any = None
        self._kv: Any = None
        self._connecting = asyncio.Lock()  # concurrent registrations connect once

    def put(self, host: str, nics: list[dict[str, str]], meta: dict[str, Any]) -> None:
        """Stored in the bucket (replicated), or RegistryUnavailable."""
        fut = asyncio.run_coroutine_threadsafe(
            self._put(key(host), encode(nics, meta)), self._runner.loop
        )
        try:
            fut.result(self.timeout_s)
        except Exception as e:  # NATS down, no quorum, timed out: the agent retries
            fut.cancel()
            raise RegistryUnavailable(f"registration not shared with the shards: {e!r}") from e

    async def _put(self, k: str, value: bytes) -> None:
        import nats

        async with self._connecting:
            if self._nc is None:
                self._nc = await nats.connect(self.urls.split(","), max_reconnect_attempts=-1)
            if self._kv is None:
                js = self._nc.jetstream(timeout=self.timeout_s)
                self._kv = await bucket(js, self.replicas)
        await self._kv.put(k, value)

    def close(self) -> None:
        try:
            if self._nc is not None:
                self._runner.run(self._nc.close(), 10)
        finally:
            self._runner.close()
