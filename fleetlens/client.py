"""The client of the collector's REST API, for agents, the simulator, the demo, the audit and
the tests: a typed method per endpoint over a small keep-alive HTTP/1.1 transport (stdlib only).

Stdlib only because the agent uses it before its first probe, where every millisecond of import
delays the clock sync of its host (httpx's import costs several times ``http.client``'s), and an
agent host installs no httpx at all. :class:`HttpClient` holds one connection, reopened after
any error; a request on a connection the collector had already closed is retried once on a
fresh one (every call here is idempotent: uploads carry their batch id). Threads sharing a
client take turns on that connection: a caller that posts from several threads at once gives
each thread its own client.

Every failure of a call is a :class:`CollectorError`: no answer (``status`` None), an answer
other than the expected status (``status`` set), or an answer that is not what the endpoint
promises (malformed JSON or records). Callers retry or report it; none of it is an exception
of another kind escaping from a thread.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from fleetlens.records import ClockModel, Decision, DrainEntry, HostPlan, PlanEntry

PAGE = 1000  # the API's largest page (``limit``)
Json = dict[str, Any]


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

    def json(self) -> Any:
        return json.loads(self.content)


class HttpClient:
    """One keep-alive connection to ``url`` (its path is a prefix of every request's)."""

    def __init__(
        self, url: str, headers: dict[str, str] | None = None, timeout_s: float = 5.0
    ) -> None:
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

    def _request(
        self, method: str, path: str, body: bytes | None, hdrs: dict[str, str]
    ) -> Response:
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


class CollectorError(RuntimeError):
    """A failed call; ``status`` is the HTTP status when the collector answered at all."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def unreachable(self) -> bool:
        """No answer at all (refused, reset, timed out), as opposed to an unexpected one."""
        return isinstance(self.__cause__, HttpError)


class CollectorClient:
    """The collector's API at ``url``, as the holder of ``token`` (ingest or read) sees it."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = HttpClient(self.url, headers, timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CollectorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the generic calls ----------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        **params: object,
    ) -> Response:
        """Any answer the collector gives (its status is the caller's to judge)."""
        query = urlencode({k: v for k, v in params.items() if v is not None})
        try:
            return self._http.request(method, f"{path}?{query}" if query else path, body, headers)
        except HttpError as e:
            raise CollectorError(str(e)) from e

    def call(self, method: str, path: str, json_body: object = None, **params: object) -> Any:
        """The JSON of a 2xx answer."""
        body, headers = None, {}
        if json_body is not None:
            body, headers = json.dumps(json_body).encode(), {"content-type": "application/json"}
        r = _ok(self.request(method, path, body, headers, **params), method, path)
        try:
            return r.json()
        except ValueError as e:
            raise CollectorError(f"{method} {path}: the answer is not JSON ({e})") from e

    def call_object(
        self, method: str, path: str, json_body: object = None, **params: object
    ) -> Json:
        """The JSON object of a 2xx answer."""
        out = self.call(method, path, json_body, **params)
        if not isinstance(out, dict):
            raise CollectorError(f"{method} {path}: expected a JSON object, got {str(out)[:100]}")
        return out

    def get(self, path: str, **params: object) -> Any:
        return self.call("GET", path, **params)

    def get_object(self, path: str, **params: object) -> Json:
        return self.call_object("GET", path, **params)

    def paged(self, path: str, **params: object) -> list[Json]:
        """Every row of a paged list endpoint, page by page in the collector's order."""
        out: list[Json] = []
        while True:
            page = self.get(path, limit=PAGE, offset=len(out), **params)
            if not isinstance(page, list):
                raise CollectorError(f"GET {path}: expected a JSON list, got {str(page)[:100]}")
            out += page
            if len(page) < PAGE:
                return out

    # ---- ops ------------------------------------------------------------------------------
    def health(self) -> Json:
        """``/healthz``: status (ok|degraded), writer liveness, queue depth and lag."""
        return self.get_object("/healthz")

    def healthy(self) -> bool:
        """Whether ``/healthz`` answers 200 now (no answer: False)."""
        try:
            return self.request("GET", "/healthz").status_code == 200
        except CollectorError:
            return False

    def metrics_text(self) -> str:
        """``/metrics`` in the Prometheus text format."""
        return _ok(self.request("GET", "/metrics"), "GET", "/metrics").text

    # ---- agents (ingest token) ------------------------------------------------------------
    def register(
        self,
        host_id: str,
        nics: list[Json],
        ts_source: str,
        metrics_port: int | None = None,
        agent_version: str | None = None,
    ) -> Json:
        body: Json = {"host_id": host_id, "nics": nics, "ts_source": ts_source}
        if agent_version:
            body["agent_version"] = agent_version
        if metrics_port:
            body["metrics_port"] = metrics_port
        return self.call_object("POST", "/v1/register", body)

    def ingest(self, body: bytes, content_type: str) -> Response:
        """Upload one encoded batch (:func:`fleetlens.batch.encode_batch`). The answer is the
        caller's to judge: 200 stored (or already stored), 429/5xx try again later, another
        4xx refused for good."""
        return self.request("POST", "/v1/ingest", body, {"content-type": content_type})

    def plan(self, host_id: str) -> HostPlan:
        d = self.get_object(f"/v1/plan/{_seg(host_id)}")
        with _malformed("plan"):
            entries = [
                PlanEntry(e["src_nic"], e["dst_nic"], e["dst_ip"], tuple(e["sports"]))
                for e in d["entries"]
            ]
            return HostPlan(
                host_id, int(d["dport"]), int(d["period_ns"]), int(d["window_ns"]), entries,
                clock_model(host_id, d["clock"]),
            )  # fmt: skip

    def decision(self, host_id: str) -> Decision:
        d = self.get_object(f"/v1/decisions/{_seg(host_id)}")
        with _malformed("decision"):
            drain = [
                DrainEntry(e["nic_id"], e["reason"], int(e["since_ns"])) for e in d.get("drain", [])
            ]
            return Decision(host_id, int(d.get("generated_ns") or 0), drain)

    def interfaces(self) -> dict[str, str]:
        """Switch interface address -> link arriving there (empty: no inventory)."""
        return {str(k): str(v) for k, v in self.get_object("/v1/interfaces").items()}

    # ---- readers (read token) -------------------------------------------------------------
    def clocks(self) -> dict[str, ClockModel]:
        """The clock model served for each host, by host id."""
        rows = self.paged("/v1/clocks")
        with _malformed("clocks"):
            return {str(d["host_id"]): clock_model(str(d["host_id"]), d) for d in rows}

    def links(self, state: str | None = None, tier: str | None = None) -> list[Json]:
        """Every link with its verdict, worst first (``state``: faulty|suspect|healthy)."""
        return self.paged("/v1/links", state=state, tier=tier)

    def link_history(self, link_id: str, since_ns: int, until_ns: int) -> list[Json]:
        """A link's verdict history in [since, until), newest first, every page."""
        path = f"/v1/links/{_seg(link_id)}"
        out: list[Json] = []
        while True:
            d = self.get_object(path, since=since_ns, until=until_ns, limit=PAGE, offset=len(out))
            page = d.get("history", [])
            out += page
            if len(page) < PAGE:
                return out

    def nics(self, state: str | None = None, host_id: str | None = None) -> list[Json]:
        return self.paged("/v1/nics", state=state, host_id=host_id)

    def hosts(self, state: str | None = None) -> list[Json]:
        return self.paged("/v1/hosts", state=state)

    def pair_owd(
        self, src_nic: str, dst_nic: str, since: int | str, until: int | str, step: int | str
    ) -> Json:
        """One NIC pair's one-way delay and loss in buckets of ``step`` (``points``)."""
        path = f"/v1/pairs/{_seg(src_nic)}/{_seg(dst_nic)}/owd"
        return self.get_object(path, since=since, until=until, step=step)

    def flow_count(self, since_ns: int, until_ns: int) -> int:
        """How many flows ``/v1/flows`` has for [since, until) (its X-Total-Count)."""
        r = self.request("GET", "/v1/flows", since=since_ns, until=until_ns, limit=1)
        _ok(r, "GET", "/v1/flows")
        try:
            return int(r.headers["X-Total-Count"])
        except (KeyError, TypeError, ValueError):
            raise CollectorError("GET /v1/flows: an answer without a count") from None

    def flows(self, since_ns: int, until_ns: int) -> list[Json]:
        """Per-flow totals of the windows wholly inside [since, until), every page."""
        return self.paged("/v1/flows", since=since_ns, until=until_ns)

    def post_job(self, name: str, hosts: list[str]) -> Json:
        return self.call_object("POST", "/v1/jobs", {"name": name, "hosts": hosts})

    def job_impact(self, name: str) -> Json:
        return self.get_object(f"/v1/jobs/{_seg(name)}/impact")


def clock_model(host_id: str, d: Json) -> ClockModel:
    """A served clock model (``/v1/clocks`` row, or a plan's ``clock``); absent is identity."""
    return ClockModel(
        host_id,
        int(d.get("t0_ns") or 0),
        float(d.get("offset_ns") or 0.0),
        float(d.get("drift_ppb") or 0.0),
        d.get("error_bound_ns"),
        bool(d.get("synced", False)),
    )


def _ok(r: Response, method: str, path: str) -> Response:
    """``r`` if it is a 2xx answer, else a CollectorError with its status and detail."""
    if not 200 <= r.status_code < 300:
        raise CollectorError(f"{method} {path}: {r.status_code} {r.text[:300]}", r.status_code)
    return r


def _seg(value: str) -> str:
    """One path segment: ids hold ``/`` (NICs) and ``->`` (links)."""
    return quote(value, safe="")


@contextmanager
def _malformed(what: str) -> Iterator[None]:
    """A malformed answer is a failed call (retried later), never an exception in a thread."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CollectorError(f"malformed {what} from the collector: {e!r}") from e
