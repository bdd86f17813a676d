"""How the collector's HTTP is served: uvicorn with its C parser (httptools, in the
``collector`` extra) on asyncio's event loop, and an ingest request's body collected whole
before the app reads it. (uvloop did not serve ``--ingest-workers``' abstract unix sockets:
the workers never linked.)

At the agents' shape (1,024 hosts, one ~0.2 MB batch each a second) uvicorn's pure-Python h11
parser spent ~30% of the collector's GIL time copying bodies out of its receive buffer, and its
httptools protocol ~30% growing each request's body buffer a chunk at a time, with reading
paused and the request's task woken once per 64 KiB (``bench/collector_bench.py --shape
agents``, profiled with ``py-spy --gil``). :class:`IngestProtocol` keeps an ingest body's chunks
as they arrive and hands the app the whole body as one message once complete: one join, one
wake-up. Bodies past ``WHOLE_BODY_MAX`` go back to uvicorn's streaming (flow-controlled) path,
so a connection buffers at most that much beyond the kernel's socket buffers.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import sys
from typing import Any

import uvicorn
from fleetlens.api.ingest import INLINE_DECODE_BYTES, PATH
from uvicorn.main import STARTUP_FAILURE

WHOLE_BODY_MAX = INLINE_DECODE_BYTES  # an agent's batch is ~0.2 MB; larger ones stream

if importlib.util.find_spec("httptools") is not None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class IngestProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol; a ``POST /v1/ingest`` body up to ``WHOLE_BODY_MAX``
        is kept as its chunks and given to the app whole (everything else as uvicorn does)."""

        _chunks: list[bytes] | None = None
        _size = 0

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            whole = self.scope.get("method") == "POST" and self.scope.get("path") == PATH
            self._chunks, self._size = ([] if whole else None), 0

        def on_body(self, body: bytes) -> None:
            chunks = self._chunks
            if chunks is None:
                super().on_body(body)
                return
            chunks.append(body)
            self._size += len(body)
            if self._size > WHOLE_BODY_MAX:  # stream it: the app's limits and flow control
                self._chunks = None
                super().on_body(b"".join(chunks))

        def on_message_complete(self) -> None:
            chunks, self._chunks = self._chunks, None
            if chunks and not self.cycle.response_complete:
                # bytes, not uvicorn's bytearray: its receive() hands it on without a copy
                self.cycle.body = b"".join(chunks)  # type: ignore[assignment]
            super().on_message_complete()

    HTTP: Any = IngestProtocol
else:  # pragma: no cover - the collector extra installs httptools
    HTTP = "auto"


def config(app: Any, log_level: str, **kw: Any) -> uvicorn.Config:
    """uvicorn's configuration for the collector's (or an ingest worker's) app."""
    return uvicorn.Config(
        app, log_level=log_level, access_log=False, http=HTTP, loop="asyncio", **kw
    )


def run(app: Any, log_level: str, host: str | None = None, port: int | None = None,
        sockets: list[socket.socket] | None = None) -> None:  # fmt: skip
    """Serve ``app`` on ``host:port`` or on already bound ``sockets`` until stopped; exits
    with uvicorn's code 3 when it could not start (as ``uvicorn.run``)."""
    where = {} if sockets else {"host": host, "port": port}
    server = uvicorn.Server(config(app, log_level, **where))
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=sockets)
    if not server.started:
        sys.exit(STARTUP_FAILURE)
