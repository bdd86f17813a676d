"""The audit report names the collector's ambiguity groups: per link (``live_group_id``), as a
list of groups, in the summary and in the HTML."""

from __future__ import annotations

from pathlib import Path

from fleetlens.audit.data import RestEvidence
from fleetlens.audit.options import Thresholds
from fleetlens.audit.render import write_html, write_json
from fleetlens.audit.report import build_report


def _row(link: str, state: str, group: str | None = None, size: int = 1) -> dict:
    a, b = link.split("->")
    return {
        "link_id": link, "a": a, "b": b, "tier": "fabric", "state": state, "since": 1,
        "excess_delay_ns": 0.0, "loss_rate": 0.05 if state != "healthy" else 0.0,
        "confidence": 0.5, "flows": 10, "group_id": group, "group_size": size,
        "group_members": [],
    }  # fmt: skip


def test_report_lists_the_group(tmp_path: Path) -> None:
    rest = RestEvidence(
        links=[
            _row("leaf0->spine0", "faulty", "gab", 2),
            _row("spine0->leaf1", "suspect", "gab", 2),
            _row("leaf0->spine1", "healthy"),
        ]
    )
    rep = build_report(
        source="test", since_ns=0, until_ns=60 * 10**9, warmup_s=0.0, th=Thresholds(),
        rest=rest, verdict=None, live_fraction=0.5,
    )  # fmt: skip
    links = {lk["link_id"]: lk for lk in rep["links"]}
    assert links["spine0->leaf1"]["live_group_id"] == "gab"
    assert links["spine0->leaf1"]["live_group_size"] == 2
    assert links["leaf0->spine1"]["live_group_id"] is None
    assert rep["ambiguity_groups"] == [
        {"group_id": "gab", "size": 2, "links": ["leaf0->spine0", "spine0->leaf1"],
         "states": {"leaf0->spine0": "faulty", "spine0->leaf1": "suspect"}}
    ]  # fmt: skip
    assert "gab = leaf0->spine0, spine0->leaf1" in rep["summary"]
    write_json(rep, tmp_path)
    page = write_html(rep, tmp_path).read_text()
    assert "Ambiguity groups (1)" in page and "spine0-&gt;leaf1: suspect" in page


def test_report_without_groups_says_nothing_of_them() -> None:
    rest = RestEvidence(links=[_row("leaf0->spine1", "healthy")])
    rep = build_report(
        source="test", since_ns=0, until_ns=60 * 10**9, warmup_s=0.0, th=Thresholds(),
        rest=rest, verdict=None, live_fraction=0.5,
    )  # fmt: skip
    assert rep["ambiguity_groups"] == [] and "group" not in rep["summary"]
