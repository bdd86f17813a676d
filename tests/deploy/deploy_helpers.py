"""Shared helpers for tests/deploy: the deploy files, their PromQL, a real Prometheus process."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from fleetlens.fixtures.collector import free_port, stop_process, wait_until_up

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROM_DIR = DEPLOY / "prometheus"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
RULE_FILES = sorted((PROM_DIR / "rules").glob("*.yml"))

sys.path.insert(0, str(DEPLOY / "grafana"))
import generate  # noqa: E402, F401  (deploy/grafana/generate.py is a script, not a package)


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Panels in layout order, including those nested in collapsed rows."""
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref: str
    expr: str
    instant: bool


def dashboard_queries(dashboards: dict[str, dict[str, Any]]) -> list[PanelQuery]:
    out = []
    for name, d in dashboards.items():
        for p in all_panels(d["panels"]):
            for t in p.get("targets", []):
                if "expr" in t:
                    out.append(
                        PanelQuery(name, p["title"], t["refId"], t["expr"], bool(t.get("instant")))
                    )
    return out


@dataclass(frozen=True)
class Rule:
    group: str
    name: str
    expr: str
    alert: bool


def load_rules() -> list[Rule]:
    out = []
    for f in RULE_FILES:
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                alert = "alert" in r
                out.append(Rule(g["name"], r.get("alert") or r["record"], r["expr"].strip(), alert))
    return out


_THRESHOLD = re.compile(r"^(?P<lhs>.+?)\s*(?:==|!=|>=|<=|>|<)\s*(?P<value>[-+0-9.eE]+)$", re.S)


def alert_signal(expr: str) -> str:
    """The expression an alert compares to its threshold (``LHS > 10`` gives ``LHS``)."""
    m = _THRESHOLD.match(expr.strip())
    if m is None:
        raise AssertionError(f"alert expression is not 'signal <op> threshold': {expr!r}")
    return m.group("lhs")


class Prometheus:
    """Debian's prometheus binary on a free loopback port with the deploy config and rules,
    intervals shortened to 1 s; stopped by PID."""

    def __init__(self, workdir: Path, collector: list[str], agents: dict[str, str]) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = self._write_config(collector, agents)
        self.proc: subprocess.Popen[bytes] | None = None

    def _write_config(self, collector: list[str], agents: dict[str, str]) -> Path:
        d = self.workdir / "prometheus"
        shutil.copytree(PROM_DIR / "rules", d / "rules")
        (d / "targets").mkdir(parents=True)
        cfg = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
        cfg["global"].update(scrape_interval="1s", evaluation_interval="1s", scrape_timeout="1s")
        (d / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        # Same file_sd layout as deploy/prometheus/targets: only the addresses differ.
        (d / "targets" / "collector.json").write_text(json.dumps([{"targets": collector}]))
        # An agent keyed by its bare address gets no host label: the shipped relabel rule
        # must then derive one from the address.
        groups = [
            {"targets": [a], "labels": {} if h == a.split(":")[0] else {"host": h}}
            for h, a in sorted(agents.items())
        ]
        (d / "targets" / "agents.json").write_text(json.dumps(groups))
        return d / "prometheus.yml"

    def start(self) -> None:
        argv = [
            "prometheus", f"--config.file={self.config}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h", "--web.enable-lifecycle",
        ]  # fmt: skip
        log = self.workdir / "prometheus.log"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=out, start_new_session=True)
        wait_until_up(self.proc, self._ready, "prometheus", log, timeout_s=30)

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        self.proc = None

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        if body.get("status") != "success":
            raise AssertionError(f"query failed: {expr!r}: {body.get('error')}")
        return body["data"]["result"]

    def query_range(self, expr: str, seconds: float, step: str = "1s") -> list[dict[str, Any]]:
        """What a Grafana time-series panel asks for: the last ``seconds`` of ``expr``."""
        now = time.time()
        params = {"query": expr, "start": now - seconds, "end": now, "step": step}
        body = httpx.get(f"{self.url}/api/v1/query_range", params=params, timeout=10).json()
        if body.get("status") != "success":
            raise AssertionError(f"range query failed: {expr!r}: {body.get('error')}")
        return body["data"]["result"]

    def query_soon(self, expr: str, timeout_s: float) -> list[dict[str, Any]]:
        """An instant query polled until it returns data or ``timeout_s`` passes (the
        collector's placeholder verdicts flicker for a few seconds at a time)."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    def label_values(self, label: str, match: str) -> list[str]:
        r = httpx.get(
            f"{self.url}/api/v1/label/{label}/values", params={"match[]": match}, timeout=10
        )
        return list(r.json()["data"])

    def api(self, path: str) -> Any:
        return httpx.get(f"{self.url}{path}", timeout=10).json()["data"]


_LABEL_VALUES = re.compile(r"^label_values\((?P<match>.+),\s*(?P<label>\w+)\)$")


def variable_values(prom: Prometheus, var: dict[str, Any]) -> list[str]:
    """What Grafana would offer for a template variable, resolved through Prometheus."""
    if var["type"] == "custom":
        return [o["value"] for o in var["options"]]
    m = _LABEL_VALUES.match(var["query"]["query"])
    assert m, f"unsupported variable query {var['query']!r}"
    values = prom.label_values(m.group("label"), m.group("match"))
    if var.get("regex"):
        pattern = re.compile(var["regex"].strip("/"))
        values = sorted({mm.group(1) for v in values if (mm := pattern.match(v))})
    return values


def substitute(expr: str, values: dict[str, str], rate_interval: str) -> str:
    out = expr.replace("$__rate_interval", rate_interval)
    for name in sorted(values, key=len, reverse=True):
        out = out.replace(f"${{{name}}}", values[name]).replace(f"${name}", values[name])
    assert "$" not in out, f"unresolved variable in {out!r}"
    return out


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(fleetlens_[a-z_]+|up)\b", expr))
