"""Pydantic request and response models of the REST API (they define /openapi.json)."""

from __future__ import annotations

from typing import Literal, cast

from pydantic import BaseModel, ConfigDict, Field

State = Literal["healthy", "suspect", "faulty"]  # fleetlens.records.STATES
_ID = r"^[A-Za-z0-9._\-]{1,64}$"


def as_state(state: str) -> State:
    """A record's state (``fleetlens.records`` keeps a ``str``) as the API's type; the model
    still validates the value."""
    return cast(State, state)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NicIn(Strict):
    ifname: str = Field(pattern=r"^[A-Za-z0-9._:@\-]{1,32}$")
    ip: str = Field(pattern=r"^[0-9a-fA-F:.]{2,45}$", description="IPv4 or IPv6 address")


class RegisterIn(Strict):
    host_id: str = Field(pattern=_ID)
    nics: list[NicIn] = Field(min_length=1, max_length=64)
    ts_source: Literal["software", "hardware"] | None = None
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    agent_version: str | None = Field(default=None, max_length=64)


class RegisterOut(BaseModel):
    host_id: str
    nics: list[str]
    known_nics: int


class IngestOut(BaseModel):
    batch_id: str
    host_id: str
    windows: int
    stored: bool = Field(description="False when this batch id was already stored (a retry)")


class ErrorOut(BaseModel):
    detail: str
    field: str | None = None


class LinkOut(BaseModel):
    link_id: str
    a: str
    b: str
    tier: str
    state: State
    since: int | None = Field(description="ns since the epoch the link has been in this state")
    excess_delay_ns: float
    loss_rate: float
    confidence: float
    flows: int = Field(description="flows crossing the link in the last evaluation")
    group_id: str | None = Field(
        None,
        description="ambiguity group: links the probe set cannot tell apart (they carry the "
        "same observed flows), reported together, each at confidence <= 1/group_size; null "
        "when the link is named alone",
    )
    group_size: int = Field(1, description="links in the ambiguity group (1: named alone)")
    group_members: list[str] = Field(
        default_factory=list, description="the group's link ids (empty when named alone)"
    )


class LinkHistoryPoint(BaseModel):
    updated: int
    state: State
    since: int
    excess_delay_ns: float
    loss_rate: float
    confidence: float
    flows: int


class LinkDetailOut(LinkOut):
    evidence_flows: list[str] = Field(
        description="sample of flows (src>dst:sport) behind the verdict"
    )
    history: list[LinkHistoryPoint]


class NicOut(BaseModel):
    nic_id: str
    host_id: str
    ifname: str
    ip: str | None
    leaf: str | None
    state: State
    since: int | None
    loss_rate: float
    excess_delay_ns: float
    reason: str | None


class ClockOut(BaseModel):
    host_id: str
    offset_ns: float
    drift_ppb: float
    error_bound_ns: float | None
    synced: bool
    t0_ns: int
    updated: int | None
    delay_evidence_from: int | None = Field(
        None,
        description="ns since the epoch from which this host's one-way delays count as "
        "triangulation evidence (a tight synced model, fetched by its agent); null: not yet",
    )


class HostOut(BaseModel):
    host_id: str
    state: State
    nics: list[NicOut]
    registered: int | None
    agent_version: str | None
    ts_source: str | None
    clock: ClockOut | None


class OwdPoint(BaseModel):
    t: int = Field(description="bucket start, ns since the epoch")
    windows: int
    sent: int
    received: int
    loss_rate: float | None
    owd_min_ns: float | None
    owd_p50_ns: float | None = Field(description="median of the windows' medians")
    owd_p99_ns: float | None = Field(description="largest window p99 (an upper bound)")
    owd_max_ns: float | None


class OwdOut(BaseModel):
    src_nic: str
    dst_nic: str
    since: int
    until: int
    step_ns: int
    points: list[OwdPoint]


class FlowOut(BaseModel):
    src_nic: str
    dst_nic: str
    sport: int = Field(description="UDP source port: with the NIC pair it pins one ECMP path")
    windows: int = Field(description="windows of this flow lying wholly inside [since, until)")
    sent: int
    received: int
    owd_min_ns: float | None = Field(description="smallest window minimum one-way delay")
    owd_min_median_ns: float | None = Field(
        description="median over the windows of each window's minimum one-way delay: the "
        "flow's path delay with the least queueing in it, robust to a few odd windows"
    )
    owd_p50_ns: float | None = Field(
        description="median over the windows of each window's median (as in the pair series)"
    )
    path: list[str] | None = Field(
        description="directed link ids of the path that carried most of the period's windows "
        "(ties: the newest; null: the agent never learned this flow's path in the period)"
    )


class JobIn(Strict):
    name: str = Field(pattern=_ID)
    hosts: list[str] = Field(min_length=1, max_length=10_000)


class JobOut(BaseModel):
    name: str
    hosts: list[str]
    created: int


class ImpactOut(BaseModel):
    name: str
    hosts: list[str]
    links_crossed: int
    bad_links: list[LinkOut]
    bad_nics: list[NicOut]


class DrainOut(BaseModel):
    nic_id: str
    reason: str
    since_ns: int


class DecisionOut(BaseModel):
    host_id: str
    generated_ns: int
    drain: list[DrainOut]


class PlanEntryOut(BaseModel):
    src_nic: str
    dst_nic: str
    dst_ip: str
    sports: list[int]


class PlanOut(BaseModel):
    host_id: str
    dport: int
    period_ns: int
    window_ns: int
    entries: list[PlanEntryOut]
    clock: ClockOut


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"]
    writer_alive: bool
    queue_depth: int
    writer_lag_seconds: float
