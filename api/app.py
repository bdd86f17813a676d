"""The FastAPI application: ingest, register, plan, the read API, /healthz and /metrics.

Auth: ``Authorization: Bearer TOKEN``. The ingest token may ingest and register; the read token
may read; agents fetch their plan and decisions with the ingest token, so those accept both.
Errors are JSON ``{"detail": "...", "field": "..."}`` everywhere, 422 included.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fleetlens.api import flows as fq
from fleetlens.api import memory
from fleetlens.api import models as m
from fleetlens.api import queries as q
from fleetlens.api.config import MINUTE_NS
from fleetlens.api.ingest import (
    PATH,
    Ingest,
    InProcess,
    Receive,
    Refused,
    Scope,
    Send,
    ingest_authorizer,
    verify_token,
)
from fleetlens.api.metrics import EXPOSITION_TYPE, MemoryGauges
from fleetlens.api.registry import RegistryUnavailable
from fleetlens.api.service import Collector
from fleetlens.api.timeparse import TimeParamError, parse_duration, parse_instant
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException

from fleetlens.batch import CT_ARROW, CT_JSON, CT_MSGPACK
from fleetlens.ids import split_link_id


class NicConvertor(Convertor):
    """A NIC id in a path: ``HOST/IFNAME`` (clients may send the slash as %2F)."""

    regex = r"[^/]+/[^/]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("nic", NicConvertor())


class ApiError(HTTPException):
    def __init__(self, status: int, detail: str, field: str | None = None, headers=None) -> None:
        super().__init__(status, detail, headers)
        self.field = field


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": m.ErrorOut} for code in (400, 401, 403, 404, 422)
}
Limit = Annotated[int, Query(ge=1, le=1000, description="page size (max 1000)")]
Offset = Annotated[int, Query(ge=0, le=10_000_000)]
_bearer = HTTPBearer(auto_error=False)


def _auth(collector: Collector, allowed: tuple[str, ...]) -> Callable:
    s = collector.settings
    tokens = {"ingest": s.ingest_token, "read": s.read_token}

    def check(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
        if not s.auth_enabled():
            return
        status, detail = verify_token(creds.credentials if creds else None, tokens, allowed)
        if status:
            if "ingest" in allowed and "read" not in allowed:
                collector.metrics.reject("auth")
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
            raise ApiError(status, detail, "authorization", headers)

    return check


def _page(items: list, limit: int, offset: int, response: Response) -> list:
    response.headers["X-Total-Count"] = str(len(items))
    return items[offset : offset + limit]


def _time_range(
    c: Collector, since: str | None, until: str | None, default_span_ns: int
) -> tuple[int, int]:
    now = time.time_ns()
    try:
        u = parse_instant("until", until, now)
        s = parse_instant("since", since, now)
    except TimeParamError as e:
        raise ApiError(422, str(e), e.field) from None
    u = now if u is None else u
    s = u - default_span_ns if s is None else s
    if u <= s:
        raise ApiError(422, f"until ({u}) must be after since ({s})", "until")
    if u - s > c.settings.max_range_ns:
        raise ApiError(422, f"range longer than the maximum {c.settings.max_range_ns} ns", "since")
    return s, u


Attached = Callable[[], AbstractAsyncContextManager[None]]


class CollectorApp(FastAPI):
    """FastAPI, except that ``POST /v1/ingest`` goes straight to the lean path (``ingest.py``):
    at the agents' request rate FastAPI's stack cost more than storing the batch."""

    ingest: Ingest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST":
            await self.ingest.asgi(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(
    collector: Collector, start: bool = True, attached: Attached | None = None
) -> CollectorApp:
    """``attached``: entered once the collector started, left before it stops (the ingest
    workers' link and processes, ``ingestworker.py``)."""
    c = collector

    @asynccontextmanager
    async def lifespan(app: CollectorApp) -> AsyncIterator[None]:
        if start:
            c.start(loops=not c.settings.ingest_only)
        try:
            if attached is None:
                yield
            else:
                async with attached():
                    yield
        finally:
            if start:
                await run_in_threadpool(c.stop)
            app.ingest.close()

    app = CollectorApp(
        title="FleetLens collector",
        version="0.1.0",
        description="Ingest of probe windows, fabric verdicts, clock models and decisions.",
        lifespan=lifespan,
    )
    _install_error_handlers(app)
    ingest_auth = Depends(_auth(c, ("ingest",)))
    read_auth = Depends(_auth(c, ("read",)))
    agent_auth = Depends(_auth(c, ("read", "ingest")))
    metrics_deps = [] if c.settings.public_metrics else [read_auth]

    _ingest_routes(app, c, ingest_auth, agent_auth)
    _read_routes(app, c, read_auth, agent_auth)

    @app.get("/healthz", response_model=m.HealthOut, tags=["ops"])
    def healthz() -> m.HealthOut:
        h = c.health()
        return m.HealthOut(
            status="ok" if h.alive else "degraded",
            writer_alive=h.alive,
            queue_depth=h.queue_depth,
            writer_lag_seconds=h.lag_s,
        )

    @app.get("/metrics", dependencies=metrics_deps, tags=["ops"], responses=ERRORS,
             response_class=Response)  # fmt: skip
    def metrics() -> Response:
        return Response(c.metrics.exposition(), media_type=EXPOSITION_TYPE)

    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        body = {"detail": str(exc.detail), "field": getattr(exc, "field", None)}
        return JSONResponse(body, exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
        loc = [str(x) for x in first.get("loc", ())]
        field = loc[-1] if loc else None
        msg = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in errs[:5])
        return JSONResponse({"detail": msg, "field": field}, 422)


_INGEST_BODY = {
    "requestBody": {
        "required": True,
        "description": "a batch from fleetlens.batch.encode_batch (Arrow IPC, msgpack or JSON)",
        "content": {
            CT_ARROW: {"schema": {"type": "string", "format": "binary"}},
            CT_MSGPACK: {"schema": {"type": "string", "format": "binary"}},
            CT_JSON: {
                "schema": {
                    "type": "object",
                    "required": ["batch_id", "host_id", "windows"],
                    "properties": {
                        "batch_id": {"type": "string"},
                        "host_id": {"type": "string"},
                        "windows": {"type": "array", "items": {"type": "object"}},
                    },
                }
            },
        },
    }
}
_INGEST_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    **{code: {"model": m.ErrorOut} for code in (400, 413, 415, 429, 503)},
}


def _ingest_routes(app: CollectorApp, c: Collector, ingest_auth, agent_auth) -> None:
    lean = app.ingest = Ingest(InProcess(c), ingest_authorizer(c.settings))
    held = (c.store, c.feed.recent.held_bytes, lambda: lean.held_bytes)
    c.metrics.add_collector(MemoryGauges(lambda: memory.usage(*held)))

    # The OpenAPI document's route: CollectorApp serves the requests on the lean path first.
    @app.post("/v1/ingest", response_model=m.IngestOut, dependencies=[ingest_auth],
              responses=_INGEST_ERRORS, openapi_extra=_INGEST_BODY, tags=["ingest"])  # fmt: skip
    async def ingest(request: Request) -> m.IngestOut:
        """Store one agent's batch whole (200 after commit) or not at all (4xx naming the field)."""
        try:
            return m.IngestOut(**await lean.handle(request.headers, request.stream()))
        except Refused as e:
            raise ApiError(e.status, e.detail, e.field, e.headers or None) from None

    @app.post("/v1/register", response_model=m.RegisterOut, dependencies=[ingest_auth],
              responses={**ERRORS, 503: {"model": m.ErrorOut}}, tags=["ingest"])  # fmt: skip
    async def register(body: m.RegisterIn) -> m.RegisterOut:
        """An agent announces its host and the NICs it discovered."""
        nics = [n.model_dump() for n in body.nics]
        meta = body.model_dump(include={"ts_source", "metrics_port", "agent_version"})
        try:
            await run_in_threadpool(c.register, body.host_id, nics, meta)
        except RegistryUnavailable as e:
            raise ApiError(503, str(e), "host_id", {"Retry-After": "1"}) from None
        ids = [f"{body.host_id}/{n['ifname']}" for n in nics]
        return m.RegisterOut(host_id=body.host_id, nics=ids, known_nics=len(c.known_nics()))

    @app.get("/v1/plan/{host_id}", response_model=m.PlanOut, dependencies=[agent_auth],
             responses=ERRORS, tags=["ingest"])  # fmt: skip
    def plan(host_id: str) -> m.PlanOut:
        """The peers and source ports each local NIC probes, and the host's current clock model."""
        if not c.served.has_inventory():
            raise ApiError(
                404, "no inventory loaded (--inventory): plans need the topology", "host_id"
            )
        if not c.served.in_inventory(host_id):
            raise ApiError(404, f"host {host_id!r} is not in the inventory", "host_id")
        p = c.served.plan(host_id)
        d = asdict(p)
        d["clock"] = q.clock_out(c, p.clock)
        d["entries"] = [dict(e, sports=list(e["sports"])) for e in d["entries"]]
        return m.PlanOut(**d)

    @app.get("/v1/interfaces", response_model=dict[str, str], dependencies=[agent_auth],
             responses=ERRORS, tags=["ingest"])  # fmt: skip
    def interfaces() -> dict[str, str]:
        """Switch interface address -> the directed link arriving there, from the inventory:
        agents turn their traceroute hops into paths with it (empty without one)."""
        return c.served.interfaces()


def _read_routes(app: FastAPI, c: Collector, read_auth, agent_auth) -> None:
    deps = [read_auth]

    @app.get("/v1/links", response_model=list[m.LinkOut], dependencies=deps, responses=ERRORS,
             tags=["fabric"])  # fmt: skip
    def links(
        response: Response,
        state: m.State | None = None,
        tier: str | None = Query(None, max_length=16),
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> list[m.LinkOut]:
        """Links, worst first; filter by state (faulty|suspect|healthy) and tier."""
        total, page = q.links(c, state, tier, limit, offset)
        response.headers["X-Total-Count"] = str(total)
        return page

    @app.get("/v1/links/{link_id:path}", response_model=m.LinkDetailOut, dependencies=deps,
             responses=ERRORS, tags=["fabric"])  # fmt: skip
    def link(
        link_id: str,
        since: str | None = Query(
            None, description="history start (ns, ISO 8601, -1h); default until-1h"
        ),
        until: str | None = Query(None, description="history end; default now"),
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> m.LinkDetailOut:
        """One directed link (``a->b``, URL-encoded) with its verdict history, newest first."""
        try:
            split_link_id(link_id)
        except ValueError as e:
            raise ApiError(422, str(e), "link_id") from None
        if not q.link_known(c, link_id):
            raise ApiError(404, f"unknown link {link_id!r}", "link_id")
        s, u = _time_range(c, since, until, 3600 * 10**9)
        base = q.link_out(c, link_id)
        v = c.served.verdicts().get(link_id)
        return m.LinkDetailOut(
            **base.model_dump(),
            evidence_flows=v.flows if v else [],
            history=q.link_history(c, link_id, s, u, limit, offset),
        )

    @app.get("/v1/nics", response_model=list[m.NicOut], dependencies=deps, responses=ERRORS,
             tags=["fabric"])  # fmt: skip
    def nics(
        response: Response,
        state: m.State | None = None,
        host_id: str | None = Query(None, max_length=64),
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> list[m.NicOut]:
        """Known NICs (inventory and registered) with their verdicts."""
        rows = [n for n in q.nic_rows(c, host_id) if not state or n.state == state]
        return [q.nic_out(n) for n in _page(rows, limit, offset, response)]

    @app.get("/v1/hosts", response_model=list[m.HostOut], dependencies=deps, responses=ERRORS,
             tags=["fabric"])  # fmt: skip
    def hosts(
        response: Response, state: m.State | None = None, limit: Limit = 100, offset: Offset = 0
    ) -> list[m.HostOut]:
        """Known hosts with their NICs, verdicts and clock model."""
        total, page = q.hosts(c, state, limit, offset)
        response.headers["X-Total-Count"] = str(total)
        return page

    @app.get("/v1/clocks", response_model=list[m.ClockOut], dependencies=deps, responses=ERRORS,
             tags=["clocks"])  # fmt: skip
    def clocks(response: Response, limit: Limit = 100, offset: Offset = 0) -> list[m.ClockOut]:
        """Current clock model per host."""
        out = [q.clock_out(c, cm) for _, cm in sorted(c.served.clocks().items())]
        return _page(out, limit, offset, response)

    @app.get("/v1/pairs/{src_nic:nic}/{dst_nic:nic}/owd", response_model=m.OwdOut,
             dependencies=deps, responses=ERRORS, tags=["fabric"])  # fmt: skip
    def pair_owd(
        src_nic: str,
        dst_nic: str,
        since: str | None = Query(
            None, description="ns since the epoch, ISO 8601 or -1h; default until-1h"
        ),
        until: str | None = Query(None, description="default now"),
        step: str = Query("60s", description="bucket width: ns or 500ms, 10s, 1m, 1h"),
    ) -> m.OwdOut:
        """One-way delay percentiles and loss of one NIC pair over time (NIC ids URL-encoded)."""
        for name, nic in (("src_nic", src_nic), ("dst_nic", dst_nic)):
            if not c.nic_known(nic):
                raise ApiError(404, f"unknown NIC {nic!r}", name)
        s, u = _time_range(c, since, until, 3600 * 10**9)
        try:
            st = parse_duration("step", step)
        except TimeParamError as e:
            raise ApiError(422, str(e), "step") from None
        if st < 1_000_000:
            raise ApiError(422, "step must be at least 1ms", "step")
        if since is None and st % MINUTE_NS == 0:
            s = s // MINUTE_NS * MINUTE_NS  # default range on minute bounds: served from rollups
        if (u - s) // st > c.settings.max_points:
            raise ApiError(422, f"more than {c.settings.max_points} points: raise step", "step")
        points = q.pair_owd(c, src_nic, dst_nic, s, u, st)
        return m.OwdOut(
            src_nic=src_nic, dst_nic=dst_nic, since=s, until=u, step_ns=st, points=points
        )

    @app.get("/v1/flows", response_model=list[m.FlowOut], dependencies=deps, responses=ERRORS,
             tags=["fabric"])  # fmt: skip
    def flows(
        response: Response,
        since: str | None = Query(
            None, description="period start (ns, ISO 8601, -1h); default until-1h"
        ),
        until: str | None = Query(None, description="period end; default now"),
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> list[m.FlowOut]:
        """Per probe flow (src NIC, dst NIC, source port; once an agent knows its paths, the
        ports of a pair that share a path report as one flow under the lowest of them), totals
        over the windows lying wholly inside [since, until): windows, probes sent and
        received, the smallest and the median window-minimum one-way delay, the median of the
        window medians, and the path that carried most of those windows (a flow whose path
        changed mid-period reports that one, not its newest; ties: the newest). Ordered by
        src_nic, dst_nic, sport
        (stable for paging a past period); X-Total-Count gives the number of flows. Read from
        the raw windows (retention keeps them for a limited time; older periods have only
        per-pair minute rollups, see /v1/pairs). This is the evidence ``fleetlens audit`` fits
        its loss and delay tomography on."""
        s, u = _time_range(c, since, until, 3600 * 10**9)
        floor = c.served.raw_floor_ns()
        if s < floor:  # those windows are gone: totals would silently shrink
            raise ApiError(422, f"since is before the oldest raw window kept ({floor})", "since")
        total, page = fq.flows(c, s, u, limit, offset)
        response.headers["X-Total-Count"] = str(total)
        return page

    @app.post("/v1/jobs", response_model=m.JobOut, status_code=201, dependencies=[agent_auth],
              responses=ERRORS, tags=["jobs"])  # fmt: skip
    async def post_job(body: m.JobIn) -> m.JobOut:
        """A scheduler announces a job and its hosts."""
        known = set(c.known_hosts())
        unknown = [h for h in body.hosts if h not in known]
        if unknown:
            raise ApiError(422, f"unknown hosts: {unknown[:10]}", "hosts")
        hosts = sorted(set(body.hosts))
        now = time.time_ns()
        await asyncio.wrap_future(c.save_job(body.name, hosts, now))
        return m.JobOut(name=body.name, hosts=hosts, created=now)

    @app.get("/v1/jobs/{name}/impact", response_model=m.ImpactOut, dependencies=deps,
             responses=ERRORS, tags=["jobs"])  # fmt: skip
    def job_impact(name: str) -> m.ImpactOut:
        """The bad links and NICs the job's traffic crosses."""
        imp = c.served.job_impact(name)
        if imp is None:
            raise ApiError(404, f"unknown job {name!r}", "name")
        return q.impact_out(c, name, sorted(imp.hosts + imp.unknown_hosts), imp)

    @app.get("/v1/decisions/{host_id}", response_model=m.DecisionOut, dependencies=[agent_auth],
             responses=ERRORS, tags=["decisions"])  # fmt: skip
    def decisions(host_id: str) -> m.DecisionOut:
        """The NICs this host's LinkPass should drain, with reasons."""
        if host_id not in set(c.known_hosts()):
            raise ApiError(404, f"unknown host {host_id!r}", "host_id")
        return m.DecisionOut(**asdict(c.served.decision(host_id)))
