"""``POST /v1/ingest`` served as a lean ASGI path, in front of FastAPI.

At the agents' shape (1,024 hosts, each posting one ~910-row batch a second) FastAPI's
middleware stack, routing, dependency injection and response model cost more GIL time per
request than decoding and storing the batch (``bench/collector_bench.py --shape agents``).
This path answers the endpoint itself with the same contract: bearer auth first (401/403), the
body limit (413), decoding and every check (415/400/422), the writer's backpressure (429 +
``Retry-After``) and the durable ack: ``200`` only after the batch's transaction committed
(503 when the write failed). Errors are ``{"detail": ..., "field": ...}`` as everywhere.
FastAPI keeps the route for the OpenAPI document (``app.py``).

What the endpoint needs of the collector is a :class:`Backend`: :class:`InProcess` (the
collector's own writer, in this interpreter) or an ingest worker's link to the writer process
(``ingestlink.py``, ``--ingest-workers``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from fleetlens.api.config import Settings
from fleetlens.api.writer import Backpressure

from fleetlens.batch import Batch, BatchError, content_format, decode_batch

if TYPE_CHECKING:  # not imported by ingest workers: the collector's engines are heavy
    from fleetlens.api.service import Collector

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


class Backend(Protocol):
    """What the ingest endpoint needs: counters, the checks that need collector state, and the
    durable store of a checked batch."""

    settings: Settings

    def reject(self, reason: str) -> None: ...
    def received(self, body_bytes: int) -> None: ...
    def check(self, batch: Batch, now_ns: int) -> None:
        """The checks that need collector state; raises BatchError naming the field."""

    async def known_changed(self) -> bool:
        """Whether the known NICs changed since :meth:`check` last saw them (a batch refused
        for an unknown NIC is then checked again: its host may have just registered)."""

    async def store(self, batch: Batch, arrow_body: bytes | None) -> bool:
        """The batch committed: True if new, False for a retry. Raises Backpressure, or any
        other exception when it was not stored. ``arrow_body``: the request's body when it is
        Arrow IPC (a worker hands it on instead of encoding the batch again)."""


class InProcess:
    """The collector's own writer, in this interpreter (the default)."""

    def __init__(self, collector: Collector) -> None:
        self.c = collector
        self.settings = collector.settings
        self._commits = Commits(WRITE_TIMEOUT_S)

    def reject(self, reason: str) -> None:
        self.c.metrics.reject(reason)

    def received(self, body_bytes: int) -> None:
        self.c.metrics.received(body_bytes)

    def check(self, batch: Batch, now_ns: int) -> None:
        self.c.check_context(batch, now_ns)

    async def known_changed(self) -> bool:
        return False  # checked against the collector's own set: never stale

    async def store(self, batch: Batch, arrow_body: bytes | None) -> bool:
        return bool(await self._commits.wait(self.c.submit(batch)))


class Commits:
    """Waiting on the event loop for the writer thread's commits, each failing with
    ``TimeoutError`` after ``timeout_s``. A client hanging up cancels only its wait, never the
    write (a retry is deduplicated). One loop future per request, settled from the writer
    thread, and one timer for all the waits (the timeout is fixed: they expire oldest first):
    ``asyncio.wait_for`` over ``shield(wrap_future(...))`` made three futures and a timer per
    request, ~5 % of the collector's GIL time at the agents' shape (``py-spy --gil``)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._waits: deque[tuple[float, asyncio.Future[Any]]] = deque()  # deadline order
        self._timer: asyncio.TimerHandle | None = None

    def wait(self, fut: Future[Any]) -> asyncio.Future[Any]:
        """An awaitable of ``fut``'s outcome (call on the event loop)."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(_settle, done, f))
        waits = self._waits
        while waits and waits[0][1].done():  # commits come in order: what waits stays few
            waits.popleft()
        waits.append((loop.time() + self.timeout_s, done))
        if self._timer is None:
            self._timer = loop.call_at(waits[0][0], self._expire, loop)
        return done

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        waits, now = self._waits, loop.time()
        while waits and (waits[0][1].done() or waits[0][0] <= now):
            done = waits.popleft()[1]
            if not done.done():
                done.set_exception(TimeoutError(f"not committed within {self.timeout_s:g} s"))
        self._timer = loop.call_at(waits[0][0], self._expire, loop) if waits else None


class Slots:
    """At most ``n`` holders at once, the others served first come, first served (an
    ``async with`` block). ``asyncio.Semaphore`` (Python 3.11) walked every waiter on each
    acquire: with hundreds of agents waiting for the 16 decoding slots, 2 % of the collector's
    GIL time (``py-spy --gil``). A released slot goes straight to the oldest waiter."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def __aenter__(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        slot = asyncio.get_running_loop().create_future()
        self._waiters.append(slot)  # a cancelled one is skipped when its turn comes
        try:
            await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():
                self._release()  # handed a slot, then cancelled: pass it on
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        while self._waiters:
            slot = self._waiters.popleft()
            if not slot.done():
                slot.set_result(None)
                return
        self._free += 1


def _settle(done: asyncio.Future[Any], fut: Future[Any]) -> None:
    if done.done():  # timed out, or its client hung up
        return
    if fut.cancelled():
        done.cancel()
    elif (e := fut.exception()) is not None:
        done.set_exception(e)
    else:
        done.set_result(fut.result())


def ingest_authorizer(s: Settings) -> Authorize:
    """The ingest path's check of an ``Authorization`` header, as ``HTTPBearer`` parses it
    (also in ingest worker processes)."""
    tokens = {"ingest": s.ingest_token, "read": s.read_token}

    def authorize(header: str | None) -> tuple[int, str]:
        if not s.auth_enabled():
            return 0, ""
        scheme, _, token = (header or "").partition(" ")
        token = token.strip()
        bearer = scheme.lower() == "bearer" and token
        return verify_token(token if bearer else None, tokens, ("ingest",))

    return authorize


def verify_token(
    token: str | None, tokens: dict[str, str | None], allowed: tuple[str, ...]
) -> tuple[int, str]:
    """(0, '') when allowed, else (401|403, why). Constant-time comparison of the token."""
    if token is None:
        return 401, "missing bearer token"
    given = token.encode()
    for kind, tok in tokens.items():
        if tok and hmac.compare_digest(given, tok.encode()):
            if kind in allowed:
                return 0, ""
            return 403, f"the {kind} token may not call this endpoint"
    return 401, "invalid bearer token"


class Ingest:
    """The ingest endpoint: ``handle`` (headers and body chunks to an answer) and ``asgi``."""

    def __init__(self, backend: Backend, authorize: Authorize) -> None:
        self.b = backend
        self._authorize = authorize
        # At most `ingest_concurrency` bodies are read and decoded at once: with the writer
        # queue bound, memory stays bounded whatever the number of connected agents.
        self._decoding = Slots(backend.settings.ingest_concurrency)
        # Decoding holds the GIL for most of its ~1 ms per agent batch: handing it to a pool
        # of threads tripled its CPU cost in GIL hand-offs, and even one thread cost ~20% of
        # ingest's wall time (bench/collector_bench.py --shape agents). An agent's body is
        # decoded on the event loop; a body past INLINE_DECODE_BYTES (a large JSON batch:
        # seconds) goes to one decoding thread, so it never stalls the other connections.
        self._decoder: ThreadPoolExecutor | None = None  # started on first use
        self.held_bytes = 0  # bodies read and not answered yet (their batches are views)

    async def handle(
        self, headers: Mapping[str, str], body: AsyncIterator[bytes]
    ) -> dict[str, Any]:
        """Store one agent's batch whole (the answer after commit) or raise :class:`Refused`."""
        status, detail = self._authorize(headers.get("authorization"))
        if status:
            self.b.reject("auth")
            auth = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
            raise Refused(status, detail, "authorization", auth)
        held = 0
        try:
            async with self._decoding:
                raw = await self._read_body(headers.get("content-length"), body)
                held = len(raw)
                self.held_bytes += held
                ctype = headers.get("content-type", "")
                batch = await self._checked(raw, ctype)
                arrow = raw if content_format(ctype) == "arrow" else None
                del raw  # a large JSON body is not kept while its batch waits for the commit
            return {
                "batch_id": batch.batch_id, "host_id": batch.host_id, "windows": batch.rows,
                "stored": await self._store(batch, arrow),
            }  # fmt: skip
        finally:
            self.held_bytes -= held

    async def _checked(self, raw: bytes, ctype: str) -> Batch:
        """The body decoded and checked, or :class:`Refused` naming what is wrong."""
        try:
            try:
                return await self._decoded(raw, ctype)
            except BatchError as e:
                if e.reason != "unknown_nic" or not await self._known_changed():
                    raise
                return await self._decoded(raw, ctype)  # against the NICs known now
        except BatchError as e:
            self.b.reject(e.reason)
            raise Refused(_BATCH_STATUS.get(e.reason, 422), str(e), e.field) from None

    async def _known_changed(self) -> bool:
        try:
            return await self.b.known_changed()
        except Exception as e:  # the writer process is gone: retry later, not a bad batch
            raise Refused(503, f"known NICs unavailable: {e}", None, {"Retry-After": "5"}) from e

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
        limit = self.b.settings.max_body_bytes
        if declared and declared.isdigit() and int(declared) > limit:
            self.b.reject("too_large")
            raise Refused(413, f"body larger than {limit} bytes", "body")
        parts, size = [], 0
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                self.b.reject("too_large")
                raise Refused(413, f"body larger than {limit} bytes", "body")
            parts.append(chunk)
        self.b.received(size)
        return b"".join(parts)

    def _decode(self, body: bytes, ctype: str) -> Batch:
        batch = decode_batch(body, ctype)
        self.b.check(batch, time.time_ns())
        return batch

    async def _store(self, batch: Batch, arrow_body: bytes | None) -> bool:
        """Queue the batch and wait for its commit: True if it was new, False for a retry."""
        try:
            return await self.b.store(batch, arrow_body)
        except Backpressure as e:
            self.b.reject("backpressure")
            raise Refused(429, str(e), None, {"Retry-After": str(int(e.retry_after_s))}) from None
        except Exception as e:
            self.b.reject("write_error")
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
