"""Ingest worker processes (``fleetlens collector --ingest-workers N``).

In one interpreter, HTTP parsing, decoding and checking of agents' batches and the writer's
own Python (Arrow to storage layout, group bookkeeping, commit hooks) share one GIL: at the
agents' shape the writer thread waited for the GIL longer than it worked, and the collector
stayed at ~1.4 of 2 cores (``bench/collector_bench.py --shape agents``). With workers:

- the collector process (the *writer process*) owns DuckDB, the writer, the loops, metrics and
  every endpoint; it serves HTTP on a private unix socket and the workers' batches on a second
  one (``ingestlink.LinkServer``);
- N worker processes share the public listening socket (the kernel spreads connections). Each
  serves ``POST /v1/ingest`` on the lean path (``ingest.Ingest``: same auth, limits, checks,
  errors) with an ``ingestlink.LinkBackend``: the checked batch goes to the writer process and
  the agent gets ``200`` only when that batch's transaction committed. Every other request is
  relayed to the writer process unchanged (registration, reads, ``/metrics``, ``/healthz``);
- the writer process restarts a worker that dies. A worker that dies loses only requests not
  yet answered (their agents retry; batch ids dedupe); a worker exits when the writer process
  is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
import uvicorn
from fleetlens.api import serving
from fleetlens.api.ingest import PATH, Ingest, Receive, Scope, Send
from fleetlens.api.ingestlink import LinkBackend, LinkServer

if TYPE_CHECKING:  # workers do not load the collector's engines
    from fleetlens.api.service import Collector

log = logging.getLogger("fleetlens.api.ingestworker")

# Headers not relayed as they are: hop-by-hop, or rewritten for the relayed body.
_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host",
        b"content-encoding"}  # fmt: skip
RESTART_POLL_S = 0.5
STARTUP_TIMEOUT_S = 120.0


# ---- the collector (writer) process ---------------------------------------------------------
class Workers:
    """The worker processes, restarted when one dies, and the sockets they share."""

    def __init__(self, n: int, listen: socket.socket, argv: Sequence[str]) -> None:
        self.n = n
        self._listen = listen
        self._argv = list(argv)
        # Abstract unix sockets (Linux): nothing left in the file system after a kill -9.
        name = f"fleetlens-collector-{os.getpid()}-{secrets.token_hex(4)}"
        self.api_name, self.link_name = f"@{name}-api", f"@{name}-link"
        self.api_sock = _unix_listener(self.api_name)
        self.link_sock = _unix_listener(self.link_name)
        self.procs: list[subprocess.Popen[bytes]] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._watch: threading.Thread | None = None

    def _spawn(self) -> subprocess.Popen[bytes]:
        fd = self._listen.fileno()
        cmd = [sys.executable, "-m", "fleetlens.api.ingestworker", "--fd", str(fd),
               "--link", self.link_name, "--api", self.api_name,
               "--", *self._argv]  # fmt: skip
        return subprocess.Popen(cmd, pass_fds=(fd,))

    def start(self) -> None:
        with self._lock:
            self.procs = [self._spawn() for _ in range(self.n)]
        self._watch = threading.Thread(target=self._restart_dead, name="fleetlens-workers",
                                       daemon=True)  # fmt: skip
        self._watch.start()

    def _restart_dead(self) -> None:
        while not self._stopping.wait(RESTART_POLL_S):
            with self._lock:
                for i, p in enumerate(self.procs):
                    if p.poll() is not None and not self._stopping.is_set():
                        log.warning("ingest worker %d exited (code %s): restarted", p.pid,
                                    p.returncode)  # fmt: skip
                        self.procs[i] = self._spawn()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the workers (they finish the requests under way)."""
        self._stopping.set()
        if self._watch is not None:
            self._watch.join()
        with self._lock:
            for p in self.procs:
                if p.poll() is None:
                    p.terminate()
            for p in self.procs:
                try:
                    p.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def close(self) -> None:
        """Close the unix sockets (after :meth:`stop` and the link server)."""
        for s in (self.api_sock, self.link_sock):
            s.close()

    def attached(self, collector: Collector) -> Any:
        """The app's ``attached`` hook: the link server, then the workers."""

        @asynccontextmanager
        async def run() -> AsyncIterator[None]:
            link = LinkServer(collector)
            await link.start(self.link_sock)
            self.start()
            # Healthy (the workers relay /healthz here) once every worker can take batches.
            await link.wait_linked(self.n, STARTUP_TIMEOUT_S)
            try:
                yield
            finally:
                # On a thread: the link keeps answering the workers' last batches meanwhile.
                await asyncio.to_thread(self.stop)
                await link.close()
                self.close()

        return run


def unix_address(name: str) -> str:
    """A socket name as given on the command line ('@' for Linux's abstract namespace, since
    argv cannot carry the NUL byte) to the address to bind or connect to."""
    return "\0" + name[1:] if name.startswith("@") else name


def _unix_listener(name: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(unix_address(name))
    s.listen(1024)
    return s


def tcp_listener(host: str, port: int) -> socket.socket:
    """The public listening socket the workers share (inherited by each)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(2048)
    s.set_inheritable(True)
    return s


def serve(app: Any, workers: Workers, log_level: str) -> None:
    """Run the collector's app on the private socket (the workers relay to it)."""
    serving.run(app, log_level, sockets=[workers.api_sock])


# ---- a worker process -----------------------------------------------------------------------
class WorkerApp:
    """A worker's ASGI app: the lean ingest path, everything else relayed."""

    def __init__(self, ingest: Ingest, backend: LinkBackend, api_path: str) -> None:
        self.ingest = ingest
        self.backend = backend
        transport = httpx.AsyncHTTPTransport(uds=api_path)
        self._api = httpx.AsyncClient(transport=transport, timeout=None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST":
            await self.ingest.asgi(scope, receive, send)
        elif scope["type"] == "http":
            await self._relay(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await self.backend.connect()
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.backend.close()
                await self._api.aclose()
                self.ingest.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, size, limit = [], 0, self.backend.settings.max_body_bytes
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body.append(msg.get("body", b""))
            size += len(body[-1])
            if size > limit:  # not buffered without bound in a worker either
                await _answer(send, 413, f"body larger than {limit} bytes".encode())
                return
            if not msg.get("more_body", False):
                break
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        try:
            url = "http://collector" + target.decode("latin-1")
            r = await self._api.request(
                scope["method"], url, headers=headers, content=b"".join(body)
            )
        except httpx.TransportError as e:
            log.warning("ingest worker: relaying %s failed: %s", scope["path"], e)
            await _answer(send, 503, b"collector unavailable")
            return
        head = [(k, v) for k, v in r.headers.raw if k.lower() not in _HOP]
        head.append((b"content-length", str(len(r.content)).encode()))
        await send({"type": "http.response.start", "status": r.status_code, "headers": head})
        await send({"type": "http.response.body", "body": r.content})


async def _answer(send: Send, status: int, detail: bytes) -> None:
    """An error answered by the worker itself, shaped like the collector's."""
    body = b'{"detail":"' + detail + b'","field":null}'
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="fleetlens.api.ingestworker")
    ap.add_argument("--fd", type=int, required=True, help="the shared listening socket")
    ap.add_argument("--link", required=True, help="the writer process's batch socket")
    ap.add_argument("--api", required=True, help="the writer process's HTTP socket")
    ap.add_argument("collector", nargs=argparse.REMAINDER, help="-- the collector's arguments")
    a = ap.parse_args(argv)
    from fleetlens.api.cli import settings_from_args
    from fleetlens.api.ingest import ingest_authorizer

    from fleetlens.heap import keep_freed_memory

    keep_freed_memory()  # every request allocates a body of ~0.2 MB: no mmap/munmap per body
    settings, ca = settings_from_args([x for x in a.collector if x != "--"])
    logging.basicConfig(level=ca.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    backend = LinkBackend(settings, unix_address(a.link))
    app = WorkerApp(Ingest(backend, ingest_authorizer(settings)), backend, unix_address(a.api))
    server = uvicorn.Server(serving.config(app, ca.log_level))
    backend.on_lost = lambda: setattr(server, "should_exit", True)  # the writer process died
    server.run(sockets=[socket.socket(fileno=a.fd)])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
