"""``POST /v1/ingest`` served as a lean ASGI path, in front of FastAPI.

At the agents' shape (1,024 hosts, each posting one ~910-row batch a second) FastAPI's
middleware stack, routing, dependency injection and response model cost more GIL time per
request than decoding and storing the batch (``bench/collector_bench.py --shape agents``).
This path answers the endpoint itself with the same contract: bearer auth first (401/403), the
body limit (413), decoding and every check (415/400/422), the writer's backpressure (429 +
``Retry-After``) and the durable ack: ``200`` only after the batch's transaction committed
(503 when the write failed). Errors are ``{"detail": ..., "field": ...}`` as everywhere.
FastAPI keeps the route for the OpenAPI document (``app.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fleetlens.api.service import Collector
from fleetlens.api.writer import Backpressure

from fleetlens.batch import Batch, BatchError, decode_batch

log = logging.getLogger("fleetlens.api.ingest")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
PATH = "/v1/ingest"
WRITE_TIMEOUT_S = 120.0
# Bodies up to this size are decoded on the event loop (an agent's ~910-row Arrow batch is
# ~0.2 MB and decodes in ~1 ms); larger ones on the decoding thread.
INLINE_DECODE_BYTES = 1 << 20
# Status of a refused batch by BatchError.reason (anything else: 422).
_BATCH_STATUS = {"content_type": 415, "decode": 400}


class Refused(Exception):
    """An ingest request answered with an error; ``field`` names what is wrong."""

    def __init__(
        self, status: int, detail: str, field: str | None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status, self.detail, self.field = status, detail, field
        self.headers = headers or {}


# (status, detail): (0, "") when the Authorization header's token may ingest.
Authorize = Callable[[str | None], tuple[int, str]]


class Ingest:
    """The ingest endpoint: ``handle`` (headers and body chunks to an answer) and ``asgi``."""

    def __init__(self, collector: Collector, authorize: Authorize) -> None:
        self.c = collector
        self._authorize = authorize
        # At most `ingest_concurrency` bodies are read and decoded at once: with the writer
        # queue bound, memory stays bounded whatever the number of connected agents.
        self._decoding = asyncio.Semaphore(collector.settings.ingest_concurrency)
        # Decoding holds the GIL for most of its ~1 ms per agent batch: handing it to a pool
        # of threads tripled its CPU cost in GIL hand-offs, and even one thread cost ~20% of
        # ingest's wall time (bench/collector_bench.py --shape agents). An agent's body is
        # decoded on the event loop; a body past INLINE_DECODE_BYTES (a large JSON batch:
        # seconds) goes to one decoding thread, so it never stalls the other connections.
        self._decoder: ThreadPoolExecutor | None = None  # started on first use

    async def handle(
        self, headers: Mapping[str, str], body: AsyncIterator[bytes]
    ) -> dict[str, Any]:
        """Store one agent's batch whole (the answer after commit) or raise :class:`Refused`."""
        c = self.c
        status, detail = self._authorize(headers.get("authorization"))
        if status:
            c.metrics.reject("auth")
            auth = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
            raise Refused(status, detail, "authorization", auth)
        async with self._decoding:
            raw = await self._read_body(headers.get("content-length"), body)
            ctype = headers.get("content-type", "")
            try:
                batch = await self._decoded(raw, ctype)
            except BatchError as e:
                c.metrics.reject(e.reason)
                raise Refused(_BATCH_STATUS.get(e.reason, 422), str(e), e.field) from None
            del raw
        return {
            "batch_id": batch.batch_id, "host_id": batch.host_id, "windows": batch.rows,
            "stored": await self._store(batch),
        }  # fmt: skip

    async def _decoded(self, body: bytes, ctype: str) -> Batch:
        if len(body) <= INLINE_DECODE_BYTES:
            return self._decode(body, ctype)
        if self._decoder is None:
            self._decoder = ThreadPoolExecutor(1, thread_name_prefix="fleetlens-decode")
        return await asyncio.get_running_loop().run_in_executor(
            self._decoder, self._decode, body, ctype
        )

    def close(self) -> None:
        """End the decoding thread (the app's shutdown); a later request starts another."""
        if self._decoder is not None:
            self._decoder.shutdown(wait=True)
            self._decoder = None

    async def _read_body(self, declared: str | None, chunks: AsyncIterator[bytes]) -> bytes:
        limit = self.c.settings.max_body_bytes
        if declared and declared.isdigit() and int(declared) > limit:
            self.c.metrics.reject("too_large")
            raise Refused(413, f"body larger than {limit} bytes", "body")
        parts, size = [], 0
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                self.c.metrics.reject("too_large")
                raise Refused(413, f"body larger than {limit} bytes", "body")
            parts.append(chunk)
        self.c.metrics.received(size)
        return b"".join(parts)

    def _decode(self, body: bytes, ctype: str) -> Batch:
        batch = decode_batch(body, ctype)
        self.c.check_context(batch, time.time_ns())
        return batch

    async def _store(self, batch: Batch) -> bool:
        """Queue the batch and wait for its commit: True if it was new, False for a retry."""
        try:
            fut = self.c.submit(batch)
        except Backpressure as e:
            self.c.metrics.reject("backpressure")
            raise Refused(429, str(e), None, {"Retry-After": str(int(e.retry_after_s))}) from None
        try:
            # shield: a client hanging up must not cancel the write (a retry is deduplicated).
            waited = asyncio.shield(asyncio.wrap_future(fut))
            return bool(await asyncio.wait_for(waited, WRITE_TIMEOUT_S))
        except Exception as e:
            self.c.metrics.reject("write_error")
            raise Refused(503, f"batch not stored: {e}", None, {"Retry-After": "5"}) from None

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ``POST /v1/ingest`` request straight from the ASGI server."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(scope["headers"])}
        try:
            status, doc, extra = 200, await self.handle(headers, _body(receive)), {}
        except Refused as e:
            status, doc, extra = e.status, {"detail": e.detail, "field": e.field}, e.headers
        except _Disconnected:
            return  # nobody to answer; a batch already queued is still stored
        except Exception:
            log.exception("ingest: unexpected error")
            status, doc, extra = 500, {"detail": "internal error", "field": None}, {}
        payload = json.dumps(doc, separators=(",", ":")).encode()
        head = [(b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *((k.lower().encode(), v.encode()) for k, v in extra.items())]  # fmt: skip
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": payload})


class _Disconnected(Exception):
    """The client hung up before its body was read."""


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _Disconnected
        if msg.get("body"):
            yield msg["body"]
        if not msg.get("more_body", False):
            return
