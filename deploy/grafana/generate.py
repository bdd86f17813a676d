"""Generate FleetLens's provisioned Grafana dashboards (``deploy/grafana/dashboards/*.json``).

    python deploy/grafana/generate.py                   # rewrite the committed dashboards
    python deploy/grafana/generate.py --check           # exit 1 if they are out of date
    python deploy/grafana/generate.py --inventory fleet.yaml --rack leaf7  # your racks' matrix

Written as plain dicts (schemaVersion 39) rather than with an SDK so that the only input is
this file: every PromQL expression lives here, next to the panel that shows it, and the tests
(``tests/deploy``) run each one through a real Prometheus scraping a real collector and agents.

The NIC-pair matrix is the exception: per-pair data stays out of Prometheus by design, so it
reads the collector's REST API (``GET /v1/pairs/{src}/{dst}/owd``) through the Infinity
datasource plugin, one query per ordered NIC pair of the rack, generated from the inventory.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"
PROM = {"type": "prometheus", "uid": "fleetlens-prometheus"}
INFINITY = {"type": "yesoreyeram-infinity-datasource", "uid": "fleetlens-collector-api"}
RATE = "$__rate_interval"
AGENT = 'job="fleetlens-agent"'
COLLECTOR = 'job="fleetlens-collector"'
Panel = dict[str, Any]
# The committed pair matrix is for the default lab fabric; regenerate with your inventory.
LAB_INVENTORY = "leafspine:hosts=8,nics=2,leaves=4,spines=2"

FAULTY_STATE_MAPPING = [
    {"type": "value", "options": {"1": {"text": "faulty", "color": "red", "index": 0}}},
    {"type": "special", "options": {"match": "null", "result": {"text": "ok", "color": "green"}}},
]
SYNCED_MAPPING = [
    {
        "type": "value",
        "options": {
            "0": {"text": "unsynchronized", "color": "red", "index": 0},
            "1": {"text": "synced", "color": "green", "index": 1},
        },
    }
]


class Layout:
    """Hands out panel ids and grid positions row by row (24 columns wide)."""

    def __init__(self) -> None:
        self.next_id, self.x, self.y, self.row_h = 1, 0, 0, 0

    def place(self, panel: Panel, w: int, h: int) -> Panel:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        panel["id"] = self.next_id
        panel["gridPos"] = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.next_id += 1
        self.x += w
        self.row_h = max(self.row_h, h)
        return panel

    def row(self, title: str) -> Panel:
        self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        return self.place({"type": "row", "title": title, "collapsed": False, "panels": []}, 24, 1)


def target(expr: str, legend: str = "", ref: str = "A", **extra: Any) -> dict[str, Any]:
    return {"refId": ref, "datasource": PROM, "expr": expr, "legendFormat": legend, **extra}


def panel(kind: str, title: str, targets: list[dict[str, Any]], unit: str = "short",
          description: str = "", **extra: Any) -> Panel:  # fmt: skip
    defaults: dict[str, Any] = {"unit": unit}
    defaults.update(extra.pop("defaults", {}))
    return {
        "type": kind, "title": title, "description": description, "datasource": PROM,
        "targets": targets, "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": extra.pop("options", {}), **extra,
    }  # fmt: skip


def query_var(name: str, label: str, query: str, regex: str = "", multi: bool = True) -> dict:
    """A Prometheus query variable (``label_values``), multi-select with All by default."""
    return {
        "type": "query", "name": name, "label": label, "datasource": PROM,
        "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
        "regex": regex, "refresh": 2, "sort": 1, "multi": multi, "includeAll": multi,
        "allValue": ".*" if multi else None, "current": {}, "options": [], "hide": 0,
    }  # fmt: skip


def dashboard(uid: str, title: str, description: str, panels: list[Panel],
              variables: list[dict] | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "uid": uid, "title": title, "description": description,
        "tags": ["fleetlens"], "timezone": "browser", "editable": True,
        "schemaVersion": 39, "version": 1, "refresh": "30s", "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"}, "timepicker": {},
        "annotations": {"list": []}, "links": [
            {"type": "dashboards", "tags": ["fleetlens"], "asDropdown": True,
             "title": "FleetLens", "includeVars": False, "keepTime": True},
        ],
        "templating": {"list": variables or []}, "panels": panels,
    }  # fmt: skip


# ---- collector REST API through the Infinity plugin -----------------------------------------
# (selector in the JSON answer, column name, Infinity type)
LINK_COLUMNS = [
    ("tier", "tier", "string"), ("state", "state", "string"), ("link_id", "link", "string"),
    ("loss_rate", "loss ratio", "number"), ("excess_delay_ns", "excess delay (ns)", "number"),
    ("confidence", "confidence", "number"), ("flows", "flows", "number"),
]  # fmt: skip


def api_target(path: str, params: dict[str, str], columns: list[tuple[str, str, str]],
               ref: str = "A") -> dict[str, Any]:  # fmt: skip
    return {
        "refId": ref, "datasource": INFINITY, "type": "json", "source": "url",
        "parser": "backend", "format": "table", "url": path,
        "url_options": {"method": "GET", "params": [
            {"key": k, "value": v} for k, v in params.items()]},
        "root_selector": "", "columns": [
            {"selector": sel, "text": text, "type": typ} for sel, text, typ in columns],
    }  # fmt: skip


def api_table(title: str, columns: list[tuple[str, str, str]], transformations: list[dict],
              description: str) -> Panel:  # fmt: skip
    return {
        "type": "table", "title": title, "description": description, "datasource": INFINITY,
        "targets": [api_target("/v1/links", {"limit": "1000"}, columns)],
        "transformations": transformations,
        "fieldConfig": {"defaults": {}, "overrides": []}, "options": {"showHeader": True},
    }  # fmt: skip


# ---- fabric overview -------------------------------------------------------------------------
def _with_tier(expr: str) -> str:
    """Tier from the link id: links with a NIC end (``h03/eth1->leaf1``) are access links,
    switch-to-switch links are fabric links (fleetlens_links itself has no tier label)."""
    fabric = f'label_replace({expr}, "tier", "fabric", "link", ".*")'
    return f'label_replace({fabric}, "tier", "access", "link", ".*/.*")'


def fabric_overview() -> dict[str, Any]:
    lay = Layout()
    p = [
        lay.row("Verdicts"),
        lay.place(panel("stat", "Links by state", [target(
            "sum by (state) (fleetlens_links)", "{{state}}", instant=True)],
            options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background",
                     "graphMode": "none", "textMode": "value_and_name"},
            defaults={"color": {"mode": "thresholds"}, "thresholds": {"mode": "absolute",
                      "steps": [{"color": "green", "value": None}]}},
            description="Every link the collector has a verdict for, by state."), 8, 6),
        lay.place(panel("bargauge", "Faulty links by tier", [target(
            f"count by (tier) ({_with_tier('fleetlens_faulty_link_loss_ratio')})", "{{tier}}",
            instant=True)], options={"orientation": "horizontal", "displayMode": "basic"},
            description="Tier from the link id (access: host NIC <-> leaf; fabric: switch <-> "
                        "switch), over the collector's bounded top-K faulty links."), 8, 6),
        lay.place(panel("timeseries", "Links by state over time", [target(
            "sum by (state) (fleetlens_links)", "{{state}}")]), 8, 6),
        lay.place(panel("state-timeline", "Faulty links", [target(
            "count by (link) (fleetlens_faulty_link_loss_ratio)", "{{link}}")],
            defaults={"mappings": FAULTY_STATE_MAPPING, "color": {"mode": "thresholds"},
                      "thresholds": {"mode": "absolute", "steps": [
                          {"color": "green", "value": None}, {"color": "red", "value": 1}]}},
            options={"mergeValues": True, "showValue": "never", "rowHeight": 0.8},
            description="One row per link the collector judged faulty in the range "
                        "(red while faulty)."), 24, 8),
        lay.row("Faulty links: loss and excess delay"),
        lay.place(panel("timeseries", "Loss ratio of faulty links", [target(
            "max by (link) (fleetlens_faulty_link_loss_ratio)", "{{link}}")],
            unit="percentunit"), 12, 8),
        lay.place(panel("timeseries", "Excess one-way delay of faulty links", [target(
            "max by (link) (fleetlens_faulty_link_excess_delay_seconds)", "{{link}}")],
            unit="s"), 12, 8),
        lay.place(panel("table", "Faulty links now", [
            target("max by (link) (fleetlens_faulty_link_loss_ratio)", "", "A",
                   instant=True, format="table"),
            target("max by (link) (fleetlens_faulty_link_excess_delay_seconds)", "", "B",
                   instant=True, format="table")],
            transformations=[
                {"id": "merge", "options": {}},
                {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": {
                    "Value #A": "loss ratio", "Value #B": "excess delay (s)"}}}],
            description="Details and evidence flows: GET /v1/links/{link} on the collector."),
            24, 7),
        lay.row("All links by tier (collector API)"),
        lay.place(api_table("Links by tier and state", LINK_COLUMNS[:3], [
            {"id": "groupBy", "options": {"fields": {
                "tier": {"operation": "groupby", "aggregations": []},
                "state": {"operation": "groupby", "aggregations": []},
                "link": {"operation": "aggregate", "aggregations": ["count"]}}}}],
            "Every link of the inventory with its verdict (worst 1000 first), counted by tier "
            "and state. fleetlens_links in Prometheus has no tier label."), 8, 9),
        lay.place(api_table("Worst links", LINK_COLUMNS, [],
            "The collector's links, worst first (GET /v1/links)."), 16, 9),
    ]  # fmt: skip
    return dashboard(
        "fleetlens-fabric", "FleetLens / Fabric overview",
        "Which fabric link is hurting the jobs: verdicts by state and tier, faulty links.", p,
    )  # fmt: skip


# ---- one-way delay and loss ------------------------------------------------------------------
HEATMAP = {"calculate": False, "yAxis": {"unit": "s"}, "cellGap": 1,
           "color": {"mode": "scheme", "scheme": "Spectral", "steps": 64},
           "rowsFrame": {"layout": "auto"}}  # fmt: skip
SIDE = 'direction="$direction"'


def _heatmap(title: str, buckets: str, repeat: str, w: int, h: int, lay: Layout) -> Panel:
    """One heatmap per value of ``$repeat`` from a histogram's buckets (increase per interval)."""
    return lay.place(panel("heatmap", title, [target(
        f"sum by (le) (increase({buckets}[{RATE}]))", "{{le}}", format="heatmap")],
        unit="s", repeat=repeat, repeatDirection="h", maxPerRow=4, options=HEATMAP),
        w, h)  # fmt: skip


def _p99_by(label: str, buckets: str) -> str:
    return f"histogram_quantile(0.99, sum by (le, {label}) (rate({buckets}[{RATE}])))"


def _mean_by(label: str, family: str, sel: str) -> str:
    return (f"sum by ({label}) (rate({family}_sum{{{sel}}}[{RATE}])) / sum by ({label}) "
            f"(rate({family}_count{{{sel}}}[{RATE}]))")  # fmt: skip


def _p99_and_mean(label: str, family: str, sel: str, w: int, lay: Layout) -> list[Panel]:
    """Two time series per value of ``label``: the p99 and the mean of a delay histogram."""
    name = label.upper() if label == "nic" else label
    legend = "{{" + label + "}}"
    return [
        lay.place(panel("timeseries", f"p99 of window medians per {name}", [target(
            _p99_by(label, f"{family}_bucket{{{sel}}}"), legend)], unit="s"), w, 8),
        lay.place(panel("timeseries", f"Mean one-way delay per {name}", [target(
            _mean_by(label, family, sel), legend)], unit="s"), w, 8),
    ]  # fmt: skip


def delay_and_loss() -> dict[str, Any]:
    lay = Layout()
    leaf_sel = f'leaf=~"$leaf", {SIDE}'
    nic_sel = f'nic=~"$nic", {SIDE}'
    p = [
        lay.row("One-way delay per path tier (window medians, fleet time)"),
        _heatmap("One-way delay, $tier paths",
                 'fleetlens_tier_owd_seconds_bucket{tier="$tier"}', "tier", 8, 8, lay),
        lay.place(panel("timeseries", "p99 of window medians per tier", [target(
            "fleetlens:tier_owd_seconds:p99_rate1m", "{{tier}}")], unit="s",
            description="leaf: both NICs on one leaf; spine: across the spines; core: across "
                        "fat-tree pods (recording rule over every collector)."), 24, 7),
        lay.row("One-way delay per rail"),
        _heatmap("One-way delay, rail $rail",
                 f'fleetlens_rail_owd_seconds_bucket{{rail="$rail", {SIDE}}}', "rail", 6, 7, lay),
        lay.row("One-way delay per leaf"),
        lay.place(panel("bargauge", "Leaves with the highest p99 now", [target(
            f"topk(10, fleetlens:leaf_owd_seconds:p99_rate1m{{{SIDE}}})", "{{leaf}}",
            instant=True)], unit="s", options={"orientation": "horizontal",
                                              "displayMode": "basic"}), 8, 8),
        *_p99_and_mean("leaf", "fleetlens_leaf_owd_seconds", leaf_sel, 8, lay),
        lay.row("One-way delay per NIC (collector --per-nic-metrics; else GET /v1/pairs, "
                "/v1/flows)"),
        _heatmap("One-way delay, NIC $nic",
                 f"fleetlens_nic_owd_seconds_bucket{{{nic_sel}}}", "nic", 6, 7, lay),
        *_p99_and_mean("nic", "fleetlens_nic_owd_seconds", nic_sel, 12, lay),
        lay.row("Loss"),
        lay.place(panel("timeseries", "Probe loss per host (agent side)", [target(
            f"sum by (host) (rate(fleetlens_agent_probe_packets_lost_total{{{AGENT}}}[{RATE}]))"
            f" / clamp_min(sum by (host) (rate(fleetlens_agent_probe_packets_sent_total"
            f"{{{AGENT}}}[{RATE}])), 1e-9)", "{{host}}")], unit="percentunit",
            description="Probes whose ack says they never arrived, over probes sent."), 12, 8),
        lay.place(panel("timeseries", "Loss ratio of faulty links", [target(
            "max by (link) (fleetlens_faulty_link_loss_ratio)", "{{link}}")],
            unit="percentunit"), 12, 8),
        lay.place(panel("timeseries", "Probe pairs without an ack per host", [target(
            f"sum by (host) (rate(fleetlens_agent_pairs_expired_total{{{AGENT}}}[{RATE}]))",
            "{{host}}")], unit="reqps"), 12, 8),
    ]  # fmt: skip
    variables = [
        query_var("tier", "Tier", "label_values(fleetlens_tier_owd_seconds_bucket, tier)"),
        query_var("rail", "Rail", "label_values(fleetlens_rail_owd_seconds_bucket, rail)"),
        query_var("leaf", "Leaf", "label_values(fleetlens_leaf_owd_seconds_bucket, leaf)"),
        query_var("nic", "NIC", "label_values(fleetlens_nic_owd_seconds_bucket, nic)"),
        {"type": "custom", "name": "direction", "label": "Side", "query": "tx,rx",
         "current": {"text": "tx", "value": "tx"}, "options": [
             {"text": "tx", "value": "tx", "selected": True},
             {"text": "rx", "value": "rx", "selected": False}], "multi": False,
         "includeAll": False, "hide": 0},
    ]  # fmt: skip
    return dashboard(
        "fleetlens-delay", "FleetLens / One-way delay and loss",
        "One-way delay histograms (one observation per window: its median) per path tier, "
        "rail and leaf; per NIC on collectors run with --per-nic-metrics (small fleets); "
        "probe loss. Per-pair data lives in the collector (DuckDB), not here.",
        p, variables,
    )  # fmt: skip


# ---- clocks -----------------------------------------------------------------------------------
def clocks() -> dict[str, Any]:
    lay = Layout()
    host = 'host=~"$host"'
    p = [
        lay.place(panel("stat", "Unsynchronized hosts", [target(
            f"count(fleetlens_clock_synced{{{host}}} == 0) or vector(0)", instant=True)],
            defaults={"color": {"mode": "thresholds"}, "thresholds": {"mode": "absolute",
                      "steps": [{"color": "green", "value": None},
                                {"color": "red", "value": 1}]}}), 6, 6),
        lay.place(panel("state-timeline", "Synchronized per host", [target(
            f"max by (host) (fleetlens_clock_synced{{{host}}})", "{{host}}")],
            defaults={"mappings": SYNCED_MAPPING, "color": {"mode": "thresholds"},
                      "thresholds": {"mode": "absolute", "steps": [
                          {"color": "red", "value": None}, {"color": "green", "value": 1}]}},
            options={"mergeValues": True, "showValue": "never"}), 18, 6),
        lay.place(panel("timeseries", "Clock error bound per host", [target(
            f"max by (host) (fleetlens_clock_error_bound_seconds{{{host}}})", "{{host}}")],
            unit="s", description="Error bound of each host's clock model (absent while the "
                                  "sync engine reports none)."), 12, 8),
        lay.place(panel("timeseries", "Clock offset per host (raw - fleet)", [target(
            f"max by (host) (fleetlens_clock_offset_seconds{{{host}}})", "{{host}}")],
            unit="s"), 12, 8),
        lay.place(panel("timeseries", "Clock solve rounds and failures", [
            target('sum(rate(fleetlens_loop_runs_total{loop="clocks"}[' + RATE + "]))",
                   "rounds", "A"),
            target('sum(rate(fleetlens_loop_errors_total{loop="clocks"}[' + RATE + "]))",
                   "failed", "B")], unit="ops"), 24, 6),
    ]  # fmt: skip
    variables = [query_var("host", "Host", "label_values(fleetlens_clock_synced, host)")]
    return dashboard(
        "fleetlens-clocks",
        "FleetLens / Clock sync",
        "Clock sync quality per host.",
        p,
        variables,
    )


# ---- agents -----------------------------------------------------------------------------------
def agents() -> dict[str, Any]:
    lay = Layout()
    sel = f'{AGENT}, host=~"$host"'
    p = [
        lay.place(panel("stat", "Agents up", [target(
            f"sum(up{{{sel}}})", instant=True)]), 6, 5),
        lay.place(panel("state-timeline", "Agent scrape status", [target(
            f"max by (host) (up{{{sel}}})", "{{host}}")], defaults={"mappings": [
                {"type": "value", "options": {
                    "0": {"text": "down", "color": "red", "index": 0},
                    "1": {"text": "up", "color": "green", "index": 1}}}],
                "color": {"mode": "thresholds"}, "thresholds": {"mode": "absolute", "steps": [
                    {"color": "red", "value": None}, {"color": "green", "value": 1}]}},
            options={"mergeValues": True, "showValue": "never"}), 18, 5),
        lay.place(panel("timeseries", "Late or skipped probe rounds per host", [target(
            f"sum by (host) (rate(fleetlens_agent_late_rounds_total{{{sel}}}[{RATE}]))",
            "{{host}}")], unit="ops", description="Rounds started after their 10 ms deadline "
                                                  "or skipped: the host is too busy."), 12, 8),
        lay.place(panel("timeseries", "Upload buffer depth", [target(
            f"max by (host, where) (fleetlens_agent_upload_buffer_batches{{{sel}}})",
            "{{host}} {{where}}")], unit="short", description="Batches waiting to be sent "
                                                              "(memory, then spilled to disk)."),
            12, 8),
        lay.place(panel("table", "Timestamp source per NIC", [target(
            f"max by (host, nic, source) (fleetlens_agent_timestamp_source{{{sel}}} == 1)",
            instant=True, format="table")], transformations=[{"id": "organize", "options": {
                "excludeByName": {"Time": True, "Value": True}}}],
            description="software: kernel SO_TIMESTAMPING; hardware: NIC PHC stamps."), 12, 8),
        lay.place(panel("timeseries", "Dropped packets by reason", [target(
            f"sum by (reason) (rate(fleetlens_agent_dropped_packets_total{{{sel}}}[{RATE}]))",
            "{{reason}}")], unit="pps"), 12, 8),
        lay.place(panel("timeseries", "Probe packets sent per host", [target(
            f"sum by (host) (rate(fleetlens_agent_probe_packets_sent_total{{{sel}}}[{RATE}]))",
            "{{host}}")], unit="pps"), 12, 8),
        lay.place(panel("timeseries", "Uploads: windows sent, dropped, rejected batches", [
            target(f"sum(rate(fleetlens_agent_upload_uploaded_windows_total{{{sel}}}[{RATE}]))",
                   "uploaded windows", "A"),
            target(f"sum(rate(fleetlens_agent_upload_dropped_windows_total{{{sel}}}[{RATE}]))",
                   "dropped windows", "B"),
            target(f"sum(rate(fleetlens_agent_upload_rejected_batches_total{{{sel}}}[{RATE}]))",
                   "rejected batches", "C"),
            target(f"sum(rate(fleetlens_agent_upload_spilled_batches_total{{{sel}}}[{RATE}]))",
                   "spilled batches", "D")], unit="ops"), 12, 8),
    ]  # fmt: skip
    variables = [query_var("host", "Host", 'label_values(up{job="fleetlens-agent"}, host)')]
    return dashboard(
        "fleetlens-agents", "FleetLens / Agent health",
        "Probe agents: scrape status, late rounds, upload buffer, timestamp source.",
        p, variables,
    )  # fmt: skip


# ---- collector --------------------------------------------------------------------------------
def collector() -> dict[str, Any]:
    lay = Layout()
    c = COLLECTOR
    p = [
        lay.place(panel("stat", "Collector up", [target(f"sum(up{{{c}}})", instant=True)]), 6, 5),
        lay.place(panel("stat", "Writer lag", [target(
            f"max(fleetlens_writer_lag_seconds{{{c}}})", instant=True)], unit="s",
            defaults={"color": {"mode": "thresholds"}, "thresholds": {"mode": "absolute",
                      "steps": [{"color": "green", "value": None},
                                {"color": "orange", "value": 2},
                                {"color": "red", "value": 10}]}}), 6, 5),
        lay.place(panel("stat", "Windows stored per second", [target(
            f"sum(rate(fleetlens_ingest_windows_total{{{c}}}[{RATE}]))", instant=True)],
            unit="ops"), 6, 5),
        lay.place(panel("stat", "Agents registered", [target(
            f"sum(fleetlens_registrations_total{{{c}}})", instant=True)]), 6, 5),
        lay.place(panel("timeseries", "Ingest rate", [
            target(f"sum(rate(fleetlens_ingest_windows_total{{{c}}}[{RATE}]))", "windows/s", "A"),
            target(f"sum by (result) (rate(fleetlens_ingest_batches_total{{{c}}}[{RATE}]))",
                   "batches/s {{result}}", "B")], unit="ops"), 12, 8),
        lay.place(panel("timeseries", "Ingest bytes", [target(
            f"sum(rate(fleetlens_ingest_bytes_total{{{c}}}[{RATE}]))", "bytes/s")],
            unit="Bps"), 12, 8),
        lay.place(panel("timeseries", "Rejected batches by reason", [target(
            f"sum by (reason) (rate(fleetlens_ingest_rejected_batches_total{{{c}}}[{RATE}]))",
            "{{reason}}")], unit="ops"), 12, 8),
        lay.place(panel("timeseries", "Writer lag and queue", [
            target(f"max(fleetlens_writer_lag_seconds{{{c}}})", "lag (s)", "A"),
            target(f"max(fleetlens_writer_queue_depth{{{c}}})", "queued batches", "B"),
            target(f"max(fleetlens_writer_queue_rows{{{c}}})", "queued rows", "C")],
            defaults={"custom": {"axisSoftMin": 0}}, description="Lag: age of the oldest "
            "batch waiting for the DuckDB writer. Past the queue bound ingest answers 503."),
            12, 8),
        lay.place(panel("timeseries", "Writer commit latency", [
            target(f"histogram_quantile(0.5, sum by (le) (rate(fleetlens_writer_commit_seconds_"
                   f"bucket{{{c}}}[{RATE}])))", "p50", "A"),
            target(f"histogram_quantile(0.99, sum by (le) (rate(fleetlens_writer_commit_seconds"
                   f"_bucket{{{c}}}[{RATE}])))", "p99", "B")], unit="s"), 12, 8),
        lay.place(panel("timeseries", "Writer saturation (busy CPU seconds per second)", [
            target(f"sum(rate(fleetlens_writer_busy_cpu_seconds_total{{{c}}}[{RATE}]))",
                   "busy")], unit="percentunit", defaults={"max": 1, "min": 0}), 12, 8),
        lay.place(panel("timeseries", "Background loops: duration and failures", [
            target(f"sum by (loop) (rate(fleetlens_loop_duration_seconds_sum{{{c}}}[{RATE}])) / "
                   f"clamp_min(sum by (loop) (rate(fleetlens_loop_duration_seconds_count{{{c}}}"
                   f"[{RATE}])), 1e-9)", "{{loop}} mean", "A"),
            target(f"sum by (loop) (rate(fleetlens_loop_errors_total{{{c}}}[{RATE}]))",
                   "{{loop}} failed/s", "B")], unit="s"), 12, 8),
        lay.place(panel("timeseries", "Verdict lag (window end to verdicts published)", [
            target(f"histogram_quantile(0.5, sum by (le) (rate(fleetlens_verdict_lag_seconds"
                   f"_bucket{{{c}}}[{RATE}])))", "p50", "A"),
            target(f"histogram_quantile(0.99, sum by (le) (rate(fleetlens_verdict_lag_seconds"
                   f"_bucket{{{c}}}[{RATE}])))", "p99", "B"),
            target(f"max(fleetlens_triangulated_window_age_seconds{{{c}}})",
                   "newest judged window age", "C")], unit="s"), 12, 8),
    ]  # fmt: skip
    return dashboard(
        "fleetlens-collector",
        "FleetLens / Collector health",
        "Ingest rate, rejects, writer lag and saturation, background loops, verdict lag.",
        p,
    )


# ---- NIC-pair matrix (optional, from the inventory) ------------------------------------------
def rack_nics(inventory: str, rack: str) -> list[str]:
    """NIC ids attached to ``rack`` (a leaf id) in an inventory file or topology spec."""
    from fleetlens.topology import Topology

    topo = Topology.load(inventory)
    nics = [n.id for n in topo.nics if n.leaf == rack]
    if len(nics) < 2:
        raise SystemExit(f"generate: rack {rack!r} has {len(nics)} NICs in {inventory}")
    return sorted(nics)


# JSONata run by the Infinity plugin's backend parser on each /owd answer: one row per pair.
PAIR_JSONATA = (
    '{"src": src_nic, "dst": dst_nic, '
    '"owd_p50_us": $average(points[owd_p50_ns != null].owd_p50_ns) / 1000, '
    '"loss": $sum(points.sent) > 0 ? 1 - $sum(points.received) / $sum(points.sent) : null}'
)


def pair_targets(nics: list[str]) -> Iterator[dict[str, Any]]:
    for i, src in enumerate(nics):
        for j, dst in enumerate(nics):
            if src == dst:
                continue
            path = f"/v1/pairs/{quote(src, safe='')}/{quote(dst, safe='')}/owd"
            yield {
                "refId": f"P{i}_{j}", "datasource": INFINITY, "type": "json",
                "source": "url", "parser": "backend", "format": "table",
                "url": path, "url_options": {"method": "GET", "params": [
                    {"key": "since", "value": "-5m"}, {"key": "step", "value": "60s"}]},
                "root_selector": PAIR_JSONATA,
            }  # fmt: skip


def pair_matrix(nics: list[str], rack: str) -> dict[str, Any]:
    lay = Layout()
    matrix = [
        {"id": "merge", "options": {}},
        {"id": "groupingToMatrix", "options": {
            "columnField": "dst", "rowField": "src", "valueField": "owd_p50_us",
            "emptyValue": "null"}},
    ]  # fmt: skip
    p = [
        lay.place({
            "type": "table", "title": f"Median one-way delay (µs), NIC pairs of {rack}",
            "description": "Rows: sender NIC, columns: receiver NIC, last 5 min; empty: the "
                           "pair is not probed (the planner picks a subset of peers).",
            "datasource": INFINITY, "targets": list(pair_targets(nics)),
            "transformations": matrix, "fieldConfig": {"defaults": {
                "unit": "µs", "color": {"mode": "continuous-GrYlRd"},
                "custom": {"cellOptions": {"type": "color-background"}}}, "overrides": []},
            "options": {"showHeader": True}}, 24, 12),
    ]  # fmt: skip
    return dashboard(
        f"fleetlens-pairs-{rack}",
        f"FleetLens / NIC pairs of {rack}",
        "NIC-pair matrix for one rack, read from the collector's REST API (per-pair data is "
        "kept out of Prometheus).",
        p,
    )


BUILDERS = {
    "fabric-overview": fabric_overview,
    "delay-loss": delay_and_loss,
    "clocks": clocks,
    "agents": agents,
    "collector": collector,
}


def render(d: dict[str, Any]) -> str:
    return json.dumps(d, indent=2, ensure_ascii=False) + "\n"


def all_dashboards(inventory: str = LAB_INVENTORY, rack: str = "leaf0") -> dict[str, str]:
    out = {f"{name}.json": render(build()) for name, build in BUILDERS.items()}
    out[f"pairs-{rack}.json"] = render(pair_matrix(rack_nics(inventory, rack), rack))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="fail if the files are out of date")
    ap.add_argument(
        "--inventory",
        default=LAB_INVENTORY,
        help="inventory file or spec for the pair matrix (default %(default)s)",
    )
    ap.add_argument("--rack", default="leaf0", help="leaf whose NICs form the matrix")
    a = ap.parse_args(argv)
    stale = []
    for name, text in all_dashboards(a.inventory, a.rack).items():
        path = a.out / name
        if a.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)} (run deploy/grafana/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
