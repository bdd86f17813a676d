"""The link between ingest worker processes and the writer process (``--ingest-workers``).

A worker serves HTTP, decodes and checks a batch, then hands it to the writer process as an
Arrow IPC stream over a unix socket and answers the agent only when the writer process says
the batch's transaction committed: the durable ack holds across the hop. The writer process
runs one :class:`LinkServer` on its event loop; each worker one :class:`LinkBackend` (the
``ingest.Backend`` of its endpoint).

Frames, both ways: a header (payload length u32, kind u8, request id u64), then the payload.
Worker to writer: ``BATCH`` (the batch and host ids, the rows' storage ids when the worker
found them, and the windows as one Arrow IPC record batch message: the agent's own when it
can; see :func:`batch_frame`), ``KNOWN`` (ask for the known NICs), ``DICTS`` (ask for the
storage dictionaries' committed entries past the worker's copy, JSON; once, at the start),
``COUNT`` (a rejection reason or received bytes, JSON; no answer). Writer to worker:
``ANSWER`` to a batch (JSON: status 200/429/503 and its details), ``KNOWN_SET`` (JSON: the
known NICs and their version), ``DICTS_SET`` (JSON: dictionary entries from given ids on; the
answer to ``DICTS``, or with request id 0 ahead of a commit's answers) and ``IDS`` (the rows'
ids the writer found for a batch sent without, ahead of its answer).

The storage ids: the writer process is the collector's bottleneck, so a worker numbers a
batch's NIC, ts_source and link ids with its copy of the writer's committed dictionary entries
(``codec.WorkerDicts``; ~0.2 ms of the writer's CPU a batch). A batch with a name the copy
lacks goes without ids (the writer numbers it, as in one process), and so do the worker's
next batches until its answer; only the writer adds entries, paths included. Ahead of each
commit's answers to a worker the writer sends the entries committed since the last it sent
that worker, and the ids it found for each batch the worker sent without them or without its
rows' path ids: the copy fills up without a question, and a host's next batches, whose
strings repeat its first's byte for byte, take those ids, path ids included, without
numbering; the writer then neither numbers nor looks up a path of theirs.

Every answer carries the version of the known NICs, so a worker refreshes its copy after any
registration; a batch a worker refuses for an unknown NIC is checked again after a refresh (its
host may have just registered through another worker), so registration and ingest stay
consistent across processes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import struct
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
from fleetlens.api.checks import check_batch
from fleetlens.api.codec import WorkerDicts
from fleetlens.api.config import Settings
from fleetlens.api.writer import Backpressure

from fleetlens.batch import Batch, LayoutIds
from fleetlens.records import WINDOW_SCHEMA

if TYPE_CHECKING:  # workers do not load the collector's engines
    from fleetlens.api.service import Collector

log = logging.getLogger("fleetlens.api.ingestlink")
Transport = asyncio.WriteTransport

_HEAD = struct.Struct("!IBQ")
BATCH, KNOWN, COUNT, ANSWER, KNOWN_SET, DICTS, DICTS_SET, IDS = range(1, 9)
# A batch frame's payload starts with: rows numbered (-1: none), path elements, which arrays
# follow the ids (_VALID: the path validity, _PATHS: the path ids), where the record batch
# starts (aligned: the reader views it), the batch and host ids' lengths (UTF-8, after the
# rows' ids).
_IDS = struct.Struct("<qqqqqq")
_VALID, _PATHS = 1, 2
# An ``IDS`` frame's payload starts with: rows, path elements, which arrays follow; the ids
# as in a batch frame.
_GIVEN = struct.Struct("<qqq")
_BODY_ALIGN = 64
# Frames are at most a body's size plus this (the Arrow framing of a batch the worker checked).
FRAME_SLACK = 1 << 20
# Stream buffers that hold several agents' batches (~0.2 MB each): asyncio's 64 KiB default
# paused and resumed reading (a selector call each way) several times per batch.
STREAM_LIMIT = 8 << 20
WRITE_TIMEOUT_S = 120.0


def _frame(kind: int, rid: int, *payload: bytes | pa.Buffer) -> list[bytes | pa.Buffer]:
    return [_HEAD.pack(sum(len(p) for p in payload), kind, rid), *payload]


def batch_frame(batch: Batch, layout: LayoutIds | None, body: bytes | None
                ) -> list[bytes | pa.Buffer]:  # fmt: skip
    """A ``BATCH`` payload's parts: the header, the rows' ids (int32 src, dst, ts_source, path
    offsets, links; uint8 path validity), the batch and host ids, padding, and the windows as
    one Arrow IPC record batch message of ``WINDOW_SCHEMA`` (no schema message: the writer
    process knows it; opening an IPC stream and checking its schema cost it ~35 us a batch).
    ``body``: the agent's Arrow body, whose record batch message is sent as it came when the
    windows are that record batch (an agent of this release's schema: no copy)."""
    ids = b"" if layout is None else _ids_bytes(layout)
    names = batch.batch_id.encode() + batch.host_id.encode()
    at = -(-(_IDS.size + len(ids) + len(names)) // _BODY_ALIGN) * _BODY_ALIGN
    rows, elems = (-1, 0) if layout is None else (len(layout.src), len(layout.links))
    head = _IDS.pack(rows, elems, _extras(layout), at, len(batch.batch_id.encode()), len(names))
    pad = bytes(at - _IDS.size - len(ids) - len(names))
    return [head, ids + names + pad, _record_batch_message(batch.windows, body)]


def _extras(layout: LayoutIds | None) -> int:
    """Which arrays follow a layout's ids (``_VALID``, ``_PATHS``)."""
    if layout is None:
        return 0
    return (_VALID if layout.path_valid is not None else 0) | (
        _PATHS if layout.path is not None else 0)  # fmt: skip


def _ids_bytes(layout: LayoutIds) -> bytes:
    """The rows' ids: int32 src, dst, ts_source, path offsets, links, path ids (when known);
    uint8 path validity (when a path is null)."""
    parts = [layout.src, layout.dst, layout.ts, layout.path_off, layout.links]
    if layout.path is not None:
        parts.append(layout.path)
    ids = b"".join(np.ascontiguousarray(a, np.int32).tobytes() for a in parts)
    if layout.path_valid is not None:
        ids += np.ascontiguousarray(layout.path_valid, np.uint8).tobytes()
    return ids


def _ids_size(rows: int, elems: int, extras: int) -> int:
    """Bytes of the ids :func:`_ids_bytes` writes."""
    ints = 4 * rows + 1 + elems + (rows if extras & _PATHS else 0)
    return 4 * ints + (rows if extras & _VALID else 0)


def _ids_view(payload: pa.Buffer | bytes, at: int, rows: int, elems: int, extras: int
              ) -> LayoutIds:  # fmt: skip
    """The rows' ids written by :func:`_ids_bytes` at ``at`` in ``payload`` (views, no copy)."""
    n = 4 * rows + 1 + elems + (rows if extras & _PATHS else 0)
    ints = np.frombuffer(payload, np.int32, n, at)
    src, dst, ts = (ints[k * rows : (k + 1) * rows] for k in range(3))
    end = 4 * rows + 1 + elems
    off, links = ints[3 * rows : 4 * rows + 1], ints[4 * rows + 1 : end]
    path = ints[end:] if extras & _PATHS else None
    mask = np.frombuffer(payload, np.uint8, rows, at + 4 * n) if extras & _VALID else None
    return LayoutIds(src, dst, ts, off, links, mask, path)


def ids_frame(rid: int, layout: LayoutIds) -> list[bytes | pa.Buffer]:
    """An ``IDS`` frame: the rows' ids the writer found for batch ``rid``, path ids included."""
    head = _GIVEN.pack(len(layout.src), len(layout.links), _extras(layout))
    return _frame(IDS, rid, head, _ids_bytes(layout))


def read_ids_frame(payload: bytes) -> LayoutIds:
    rows, elems, extras = _GIVEN.unpack_from(payload)
    return _ids_view(payload, _GIVEN.size, rows, elems, extras)


def _record_batch_message(windows: pa.Table, body: bytes | None) -> pa.Buffer:
    """``windows`` (one record batch of ``WINDOW_SCHEMA``) as an IPC message: the body's own
    when the windows' buffers are in it (decoding took the agent's record batch as it came:
    every column the body's, the body a schema then one record batch), else serialized."""
    chunks = windows.column(len(WINDOW_SCHEMA) - 1).chunks
    if body is not None and len(chunks) == 1 and windows.column(0).num_chunks == 1:
        buf = pa.py_buffer(body)
        data = chunks[0].buffers()[1]
        if data is not None and buf.address <= data.address < buf.address + buf.size:
            reader = pa.BufferReader(buf)
            pa.ipc.read_message(reader)  # the schema
            at = reader.tell()
            pa.ipc.read_message(reader)
            return buf.slice(at, reader.tell() - at)
    cols = [c.combine_chunks() for c in windows.columns]  # an empty table has no chunk
    return pa.RecordBatch.from_arrays(cols, schema=WINDOW_SCHEMA).serialize()


def read_batch_frame(payload: pa.Buffer) -> Batch:
    """A ``BATCH`` payload to the batch it carries, with its rows' ids when it has them (the
    ids and the record batch view the payload: no copy). The worker decoded and checked the
    record batch: it is read as it is, in ``WINDOW_SCHEMA``."""
    rows, elems, extras, at, id_len, names_len = _IDS.unpack_from(payload)
    texts = _IDS.size + (_ids_size(rows, elems, extras) if rows >= 0 else 0)
    names = payload.slice(texts, names_len).to_pybytes()
    windows = pa.Table.from_batches([pa.ipc.read_record_batch(payload.slice(at), WINDOW_SCHEMA)])
    batch = Batch(names[:id_len].decode(), names[id_len:].decode(), windows)
    if rows >= 0 and rows == batch.rows:
        batch.layout = _ids_view(payload, _IDS.size, rows, elems, extras)
    return batch


async def _read_frame(reader: asyncio.StreamReader, limit: int) -> tuple[int, int, bytes]:
    size, kind, rid = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    if size > limit:
        raise ConnectionError(f"link frame of {size} bytes, over {limit}")
    return kind, rid, await reader.readexactly(size)


# ---- the writer process -------------------------------------------------------------------
class LinkServer:
    """Takes workers' checked batches into the collector's writer; answers after commit."""

    def __init__(self, collector: Collector) -> None:
        self.c = collector
        self.limit = collector.settings.max_body_bytes + FRAME_SLACK  # bytes a frame
        self._server: asyncio.AbstractServer | None = None
        self.linked = 0  # workers connected now
        self._changed = asyncio.Event()
        self._settling = threading.Lock()
        # Not answered yet: the worker, the request, the commit, the batch when the worker
        # sent it without ids (the ids the writer found go back with the answer).
        self._settled: list[tuple[Transport, int, Future, Batch | None]] = []
        # Per worker, the dictionaries' sizes its copy has been sent (after its first DICTS).
        self._sent: dict[Transport, list[int]] = {}

    async def start(self, sock: Any) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Frames(self), sock=sock)

    async def wait_linked(self, n: int, timeout_s: float) -> None:
        """Until ``n`` workers are connected (TimeoutError after ``timeout_s``)."""
        async with asyncio.timeout(timeout_s):
            while self.linked < n:
                self._changed.clear()
                await self._changed.wait()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def joined(self, change: int, out: Transport) -> None:
        self.linked += change
        if change < 0:
            self._sent.pop(out, None)
        self._changed.set()

    def frame(self, kind: int, rid: int, payload: pa.Buffer, out: Transport) -> None:
        if kind == BATCH:
            self._batch(rid, payload, out)
        elif kind == KNOWN:
            nics = self.c.known.nics().to_pylist()
            doc = {"known": self.c.known.version, "nics": nics}
            out.writelines(_frame(KNOWN_SET, rid, json.dumps(doc).encode()))
        elif kind == DICTS:
            sizes = json.loads(payload.to_pybytes())["sizes"]
            out.writelines(self._dicts_frame(rid, sizes, out))
        elif kind == COUNT:
            self._count(json.loads(payload.to_pybytes()))

    def _count(self, doc: dict[str, Any]) -> None:
        if "reject" in doc:
            self.c.metrics.reject(str(doc["reject"]))
        if "received" in doc:
            self.c.metrics.received(int(doc["received"]))

    def _dicts_frame(self, rid: int, sizes: list[int], out: Transport
                     ) -> list[bytes | pa.Buffer]:  # fmt: skip
        """A ``DICTS_SET`` frame: the committed entries past ``sizes``, which the worker's
        copy then holds."""
        nics, sources, links = self.c.store.committed_names(sizes)
        self._sent[out] = [lo + len(x) for lo, x in zip(sizes, (nics, sources, links),
                                                        strict=True)]  # fmt: skip
        doc = {"from": sizes, "nics": nics, "sources": sources, "links": links}
        return _frame(DICTS_SET, rid, json.dumps(doc).encode())

    def _batch(self, rid: int, payload: pa.Buffer, out: Transport) -> None:
        batch = read_batch_frame(payload)
        # A batch without ids or path ids gets back those the writer finds.
        without = batch if batch.layout is None or batch.layout.path is None else None
        try:
            fut = self.c.submit(batch)
        except Backpressure as e:
            self._answer(out, rid, {"status": 429, "retry_after": e.retry_after_s})
            return
        loop = asyncio.get_running_loop()
        fut.add_done_callback(lambda f: self._settle(loop, (out, rid, f, without)))

    def _settle(self, loop: asyncio.AbstractEventLoop,
                settled: tuple[Transport, int, Future, Batch | None]) -> None:  # fmt: skip
        """A batch's commit settled (on the writer thread): its answer goes out on the loop.
        The writer settles a commit group's futures in one burst; the burst is handed to the
        loop in one wake-up (each ``call_soon_threadsafe`` writes the loop's self-pipe: a
        syscall and a turn of the loop per batch) and answered with one write per worker."""
        with self._settling:
            self._settled.append(settled)
            first = len(self._settled) == 1
        if first:
            loop.call_soon_threadsafe(self._answer_settled)

    def _answer_settled(self) -> None:
        """Each worker's answers in one write, after the dictionary entries committed since
        its copy's (so a worker numbers a name as soon as its first batch is stored, without
        asking) and, for a batch it sent without ids or path ids, the ids the writer found (so
        the host's next batch reuses them: ``codec.WorkerDicts.remember``)."""
        with self._settling:
            settled, self._settled = self._settled, []
        frames: dict[Transport, list[bytes | pa.Buffer]] = {}
        for out, rid, fut, without in settled:
            parts = frames.get(out)
            if parts is None:
                parts = frames[out] = self._entries(out)
            if without is not None and without.numbered is not None:
                parts.extend(ids_frame(rid, without.numbered))
            parts.extend(_frame(ANSWER, rid, self._outcome(fut)))
        for out, parts in frames.items():
            if not out.is_closing():  # the worker died: its agents retry, batch ids dedupe
                out.writelines(parts)

    def _entries(self, out: Transport) -> list[bytes | pa.Buffer]:
        """A ``DICTS_SET`` frame (request id 0) of the entries committed since the last sent to
        this worker, or nothing."""
        sent = self._sent.get(out)
        if sent is None or list(self.c.store.committed_sizes) == sent:
            return []
        return self._dicts_frame(0, sent, out)

    def _outcome(self, fut: Future) -> bytes:
        error = fut.exception()
        if error is not None:
            return self._encode({"status": 503, "detail": str(error)})
        return self._encode({"status": 200, "stored": bool(fut.result())})

    def _encode(self, doc: dict[str, Any]) -> bytes:
        doc["known"] = self.c.known.version
        return json.dumps(doc).encode()

    def _answer(self, out: Transport, rid: int, doc: dict[str, Any]) -> None:
        if not out.is_closing():  # the worker died: its agent retries, the batch id dedupes
            out.writelines(_frame(ANSWER, rid, self._encode(doc)))


class _Frames(asyncio.BufferedProtocol):
    """One worker's frames, each read by the socket straight into a buffer of its own, which
    a batch's record batch then views (the writer keeps it until the commit). Through a
    ``StreamReader`` each body was copied twice (into the stream's buffer, then out as the
    frame) before the IPC reader: a third of the writer process's GIL with two workers (issue
    29); reading frames this way costs the writer process ~0.7x the CPU per batch (timed by
    hand on 1,024 agent bodies, ``docs/figures.md``)."""

    def __init__(self, server: LinkServer) -> None:
        self._server = server
        self._head = memoryview(bytearray(_HEAD.size))
        self._into = self._head  # what the socket reads into now
        self._payload = np.empty(0, np.uint8)
        self._got = 0
        self._kind = self._rid = 0
        self._out: Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._out = cast(Transport, transport)
        self._server.joined(1, self._out)

    def connection_lost(self, exc: Exception | None) -> None:
        assert self._out is not None
        self._server.joined(-1, self._out)  # batches handed over are still stored

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._into[self._got :]  # never past this frame's part: no copy between frames

    def buffer_updated(self, nbytes: int) -> None:
        self._got += nbytes
        if self._got < len(self._into):
            return
        assert self._out is not None
        if self._into is self._head:
            size, self._kind, self._rid = _HEAD.unpack(self._head)
            if size > self._server.limit:
                log.warning("ingest link: a frame of %d bytes, over %d: closed", size,
                            self._server.limit)  # fmt: skip
                self._out.close()
                return
            # Not zeroed first (every byte comes from the socket), from the process heap (which
            # keeps freed memory: fleetlens/heap.py), not Arrow's pool: from mimalloc the reads
            # of a batch cost 0.5-2.6x the StreamReader's copies (fresh pages each time).
            self._payload = np.empty(size, np.uint8)
            self._into, self._got = self._payload.data, 0
            if size:
                return
        payload, self._into, self._got = pa.py_buffer(self._payload), self._head, 0
        self._server.frame(self._kind, self._rid, payload, self._out)


# ---- a worker -----------------------------------------------------------------------------
class LinkBackend:
    """A worker's ``ingest.Backend``: the known NICs copied from the writer process, batches
    handed to it, counters forwarded to its metrics."""

    def __init__(self, settings: Settings, path: str) -> None:
        self.settings = settings
        self._path = path
        self.on_lost: Callable[[], None] = lambda: None  # called once the link is closed
        self._known: frozenset[str] = frozenset()
        self._version = -1
        self._dicts = WorkerDicts()
        # A batch the copy could not number is waiting for its answer, ahead of which come
        # the entries its commit added: batches go without ids meanwhile (numbering them
        # would likely fail, ~0.5 ms each).
        self._lacking = False
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._given: dict[int, LayoutIds] = {}  # IDS frames read, by request, until answered
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Task[None] | None = None

    async def connect(self, timeout_s: float = 60.0) -> None:
        """Connect (the writer process may still be starting), then copy the known NICs."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                reader, self._writer = await asyncio.open_unix_connection(
                    self._path, limit=STREAM_LIMIT
                )
                break
            except OSError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.1)
        limit = self.settings.max_body_bytes + FRAME_SLACK
        self._reader_task = asyncio.create_task(self._read(reader, limit))
        await self._refresh()
        await self._refresh_dicts()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()

    # ---- ingest.Backend
    def reject(self, reason: str) -> None:
        self._count({"reject": reason})

    def received(self, body_bytes: int) -> None:
        self._count({"received": body_bytes})

    def _count(self, doc: dict[str, Any]) -> None:
        # Counters are best effort: with the writer process gone the batch itself gets a 503.
        if self._writer is not None and not self._writer.is_closing():
            self._writer.writelines(_frame(COUNT, 0, json.dumps(doc).encode()))

    def check(self, batch: Batch, now_ns: int) -> None:
        check_batch(batch, self._known, now_ns, self.settings.max_future_ns)

    async def known_changed(self) -> bool:
        before = self._version
        await self._refresh()
        return self._version != before

    async def store(self, batch: Batch, arrow_body: bytes | None) -> bool:
        lacking = self._lacking
        layout = None if lacking else self._dicts.number(batch.host_id, batch.windows)
        # Without path ids, the answer brings them (and the ids, if any is missing).
        key = self._dicts.key(batch.windows) if layout is None or layout.path is None else None
        if layout is None and not lacking:
            self._lacking = True
        try:
            answer = await self._call(BATCH, *batch_frame(batch, layout, arrow_body))
        finally:
            if not lacking and layout is None:
                self._lacking = False
        if key is not None and answer.get("ids") is not None:
            self._dicts.remember(batch.host_id, key, answer["ids"])
        if answer["status"] == 429:
            raise Backpressure(float(answer["retry_after"]))
        if answer["status"] != 200:
            raise RuntimeError(answer.get("detail", "write failed; see collector log"))
        return bool(answer["stored"])

    # ---- the link
    def _send(self, kind: int, rid: int, *payload: bytes | pa.Buffer) -> None:
        if self._writer is None or self._writer.is_closing():
            raise ConnectionError("the writer process is gone")
        self._writer.writelines(_frame(kind, rid, *payload))

    async def _call(self, kind: int, *payload: bytes | pa.Buffer) -> dict[str, Any]:
        rid = next(self._ids)
        fut = self._pending[rid] = asyncio.get_running_loop().create_future()
        try:
            self._send(kind, rid, *payload)
            # shield: an agent hanging up must not cancel the wait for a write under way.
            return await asyncio.wait_for(asyncio.shield(fut), WRITE_TIMEOUT_S)
        finally:
            self._pending.pop(rid, None)

    async def _refresh(self) -> None:
        doc = await self._call(KNOWN, b"")
        self._known, self._version = frozenset(doc["nics"]), int(doc["known"])

    async def _read(self, reader: asyncio.StreamReader, limit: int) -> None:
        try:
            while True:
                kind, rid, payload = await _read_frame(reader, limit)
                if kind == IDS:
                    self._given[rid] = read_ids_frame(payload)
                    continue
                doc = json.loads(payload)
                if kind == DICTS_SET and not self._dicts.extend_from(
                    doc["from"], doc["nics"], doc["sources"], doc["links"]
                ):
                    log.warning("ingest worker: dictionary entries past its copy: not taken")
                if kind == ANSWER:
                    doc["ids"] = self._given.pop(rid, None)
                fut = self._pending.get(rid)
                if fut is not None and not fut.done():
                    fut.set_result(doc)
                stale = kind == ANSWER and doc["known"] != self._version
                if stale and self._refreshing is None:
                    self._refreshing = asyncio.create_task(self._refresh_once())
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError(f"the writer process is gone: {e}"))
            self.on_lost()

    async def _refresh_dicts(self) -> None:
        """The writer's committed dictionary entries (appended by :meth:`_read`, as every
        ``DICTS_SET`` is); from then on the writer sends the entries each commit adds."""
        await self._call(DICTS, json.dumps({"sizes": self._dicts.sizes()}).encode())

    async def _refresh_once(self) -> None:
        try:
            await self._refresh()
        except Exception:
            log.exception("ingest worker: refreshing the known NICs failed")
        finally:
            self._refreshing = None
