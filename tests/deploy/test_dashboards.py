"""Grafana cannot run here: the provisioned dashboards are checked structurally (the fields
Grafana needs, datasource references, ids, layout, panel types, variables), and are the
generator's current output. Their queries are run through Prometheus in test_prometheus_live."""

from __future__ import annotations

import re
from itertools import combinations
from typing import Any

import pytest
import yaml
from deploy_helpers import (
    DASHBOARDS,
    DEPLOY,
    all_panels,
    dashboard_queries,
    generate,
    load_dashboards,
)

PROVISIONING = DEPLOY / "grafana" / "provisioning"
# Panel types that ship with Grafana core (no plugin needed).
CORE_PANELS = {
    "row", "stat", "timeseries", "state-timeline", "heatmap", "table", "bargauge", "gauge",
    "barchart", "status-history", "text", "piechart", "histogram", "logs",
}  # fmt: skip
REQUIRED = {"uid", "title", "schemaVersion", "panels", "templating", "time", "tags"}
BUILTIN_VARS = {"__rate_interval", "__interval", "__range"}


def _datasources() -> dict[str, str]:
    doc = yaml.safe_load((PROVISIONING / "datasources" / "fleetlens.yml").read_text())
    return {d["uid"]: d["type"] for d in doc["datasources"]}


@pytest.fixture(scope="module")
def boards() -> dict[str, dict[str, Any]]:
    return load_dashboards()


def test_committed_dashboards_are_the_generator_output() -> None:
    assert generate.main(["--check"]) == 0, "run: python deploy/grafana/generate.py"
    assert {p.name for p in DASHBOARDS.glob("*.json")} == set(generate.all_dashboards())


def test_dashboards_cover_the_issue(boards: dict[str, dict[str, Any]]) -> None:
    kinds = {(d["uid"], p["type"]) for d in boards.values() for p in all_panels(d["panels"])}
    assert ("fleetlens-fabric", "state-timeline") in kinds  # faulty links over time
    assert ("fleetlens-delay", "heatmap") in kinds  # OWD per NIC / rail
    assert ("fleetlens-pairs-leaf0", "table") in kinds  # rack NIC-pair matrix
    titles = {p["title"] for d in boards.values() for p in all_panels(d["panels"])}
    for needed in ("Faulty links by tier", "Clock error bound per host",
                   "Late or skipped probe rounds per host", "Upload buffer depth",
                   "Timestamp source per NIC", "Ingest rate", "Writer lag and queue",
                   "Probe loss per host (agent side)"):  # fmt: skip
        assert needed in titles
    pairs = boards["pairs-leaf0.json"]["panels"][0]
    ids = [t["id"] for t in pairs["transformations"]]
    assert ids == ["merge", "groupingToMatrix"]


def test_dashboard_fields_ids_and_unique_uids(boards: dict[str, dict[str, Any]]) -> None:
    uids = [d["uid"] for d in boards.values()]
    assert len(uids) == len(set(uids))
    for name, d in boards.items():
        assert set(d) >= REQUIRED, (name, REQUIRED - set(d))
        assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
        assert len(d["uid"]) <= 40 and re.fullmatch(r"[a-zA-Z0-9_-]+", d["uid"])
        panels = list(all_panels(d["panels"]))
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids)), name
        for p in panels:
            assert p["type"] in CORE_PANELS, (name, p["type"])
            refs = [t["refId"] for t in p.get("targets", [])]
            assert len(refs) == len(set(refs)), (name, p["title"])
            assert p["type"] == "row" or refs, (name, p["title"])


def test_grid_positions_fit_and_do_not_overlap(boards: dict[str, dict[str, Any]]) -> None:
    for name, d in boards.items():
        boxes = []
        for p in all_panels(d["panels"]):
            g = p["gridPos"]
            assert all(isinstance(g[k], int) and g[k] >= 0 for k in "xywh"), (name, g)
            assert g["w"] >= 1 and g["h"] >= 1 and g["x"] + g["w"] <= 24, (name, p["title"], g)
            boxes.append((p["title"], g))
        for (ta, a), (tb, b) in combinations(boxes, 2):
            apart = (
                a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"]
                or a["y"] + a["h"] <= b["y"] or b["y"] + b["h"] <= a["y"]
            )  # fmt: skip
            assert apart, (name, ta, tb)


def test_datasource_references_resolve_to_provisioned_datasources(
    boards: dict[str, dict[str, Any]],
) -> None:
    known = _datasources()
    for name, d in boards.items():
        refs = [p["datasource"] for p in all_panels(d["panels"]) if "datasource" in p]
        refs += [t["datasource"] for p in all_panels(d["panels"]) for t in p.get("targets", [])]
        refs += [v["datasource"] for v in d["templating"]["list"] if "datasource" in v]
        assert refs, name
        for ref in refs:
            assert known.get(ref["uid"]) == ref["type"], (name, ref)


def test_variables_used_are_defined_and_repeats_exist(boards: dict[str, dict[str, Any]]) -> None:
    for name, d in boards.items():
        defined = {v["name"] for v in d["templating"]["list"]}
        for v in d["templating"]["list"]:
            assert v["type"] in ("query", "custom", "datasource", "interval", "constant"), v
        for q in dashboard_queries({name: d}):
            used = set(re.findall(r"\$\{?(\w+)", q.expr)) - BUILTIN_VARS
            assert used <= defined, (name, q.panel, used - defined)
        for p in all_panels(d["panels"]):
            if "repeat" in p:
                assert p["repeat"] in defined, (name, p["title"])


def test_heatmaps_read_buckets_and_tables_are_instant(boards: dict[str, dict[str, Any]]) -> None:
    for d in boards.values():
        for p in all_panels(d["panels"]):
            for t in p.get("targets", []):
                if p["type"] == "heatmap":
                    assert t["format"] == "heatmap" and "_bucket" in t["expr"], p["title"]
                    assert p["options"]["calculate"] is False  # buckets from Prometheus
                if p["type"] == "table" and "expr" in t:
                    assert t.get("instant") is True and t.get("format") == "table", p["title"]


def test_provider_points_where_compose_mounts_the_dashboards() -> None:
    prov = yaml.safe_load((PROVISIONING / "dashboards" / "fleetlens.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file"
    compose = yaml.safe_load((DEPLOY.parent / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{provider['options']['path']}:ro" in mounts


def test_pair_matrix_queries_every_ordered_pair_of_the_rack() -> None:
    nics = generate.rack_nics(generate.LAB_INVENTORY, "leaf0")
    targets = list(generate.pair_targets(nics))
    assert len(targets) == len(nics) * (len(nics) - 1) == len({t["url"] for t in targets})
    assert all(t["url"].startswith("/v1/pairs/") and "%2F" in t["url"] for t in targets)
    with pytest.raises(SystemExit, match="has 0 NICs"):
        generate.rack_nics(generate.LAB_INVENTORY, "spine0")


def test_collector_api_panels_group_by_declared_columns(boards: dict[str, dict[str, Any]]) -> None:
    checked = 0
    for d in boards.values():
        for p in all_panels(d["panels"]):
            for t in p.get("targets", []):
                if t["datasource"]["uid"] != "fleetlens-collector-api" or "columns" not in t:
                    continue
                names = {c["text"] for c in t["columns"]}
                for tr in p.get("transformations", []):
                    if tr["id"] == "groupBy":
                        assert set(tr["options"]["fields"]) <= names, p["title"]
                        checked += 1
    assert checked >= 1
