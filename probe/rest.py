"""A small keep-alive HTTP/1.1 client for the agent's few collector calls (stdlib only).

The agent registers and fetches its plan before its first probe; httpx's import alone cost
~70 ms of CPU there (it pulls in its command-line extras), ``http.client`` ~14 ms. One
connection per client object, reopened after any error; a request on a connection the
collector had already closed is retried once on a fresh one (every call the agent makes is
idempotent: uploads carry their batch id). Threads sharing a client take turns.
"""

from __future__ import annotations

import http.client
import threading
from urllib.parse import urlsplit


class HttpError(OSError):
    """The request did not get an HTTP response (connection refused, reset, timeout...)."""


class Response:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status_code = status
        self.headers = headers
        self.content = body

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class HttpClient:
    def __init__(self, url: str, headers: dict[str, str] | None = None, timeout_s: float = 5.0):
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._https = u.scheme == "https"
        self._host, self._port = u.hostname, u.port
        self._prefix = u.path.rstrip("/")
        self._headers = dict(headers or {})
        self._timeout = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()  # one request at a time on the one connection

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        hdrs = {**self._headers, **(headers or {})}
        with self._lock:
            return self._request(method, path, body, hdrs)

    def _request(self, method: str, path: str, body: bytes | None, hdrs: dict) -> Response:
        for attempt in range(2):
            reused = self._conn is not None
            conn = self._conn or self._connect()
            try:
                conn.request(method, self._prefix + path, body=body, headers=hdrs)
                r = conn.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if reused and attempt == 0:
                    continue  # the collector closed the idle connection: once more, fresh
                raise HttpError(f"{method} {path}: {e!r}") from e
            if r.will_close:
                self.close()
            return Response(r.status, r.headers, data)
        raise AssertionError("unreachable")

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=self._timeout)
        else:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        return self._conn

    def close(self) -> None:
        # No lock: also called from inside a request on an error (and at shutdown, when the
        # other threads are done).
        if self._conn is not None:
            self._conn.close()
            self._conn = None
