"""promtool on the shipped Prometheus config, rules and rule unit tests (and that those unit
tests catch a broken rule)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_helpers import PROM_DIR, RULE_FILES, load_rules

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="needs Debian's prometheus package (promtool)"
)
REQUIRED_ALERTS = {
    "FleetLensFaultyLink",
    "FleetLensHostUnsynchronized",
    "FleetLensAgentDown",
    "FleetLensIngestLag",
    "FleetLensVerdictsLate",
}
UNIT_TESTS = PROM_DIR / "tests" / "fleetlens_test.yml"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_promtool_check_config_passes_on_the_shipped_config() -> None:
    r = promtool("check", "config", str(PROM_DIR / "prometheus.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(load_rules())} rules found" in r.stdout


def test_promtool_check_rules_passes() -> None:
    r = promtool("check", "rules", *map(str, RULE_FILES))
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_rule_unit_tests_pass() -> None:
    r = promtool("test", "rules", str(UNIT_TESTS))
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_required_alert_exists_is_labelled_and_unit_tested() -> None:
    alerts = {r.name for r in load_rules() if r.alert}
    assert alerts >= REQUIRED_ALERTS
    tested = {
        case["alertname"]
        for t in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert tested >= REQUIRED_ALERTS, REQUIRED_ALERTS - tested
    for f in RULE_FILES:
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                if "alert" in r:
                    assert r["labels"]["severity"] in ("warning", "critical"), r["alert"]
                    assert {"summary", "description"} <= set(r["annotations"]), r["alert"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("for: 2m\n        labels:\n          severity: critical\n        annotations:\n"
         '          summary: "FleetLens agent', "for: 0s\n        labels:\n          severity: "
         'critical\n        annotations:\n          summary: "FleetLens agent'),
        ("fleetlens_writer_lag_seconds) > 10", "fleetlens_writer_lag_seconds) > 30"),
        ("fleetlens_clock_synced == 0", "fleetlens_clock_synced == 1"),
        ("fleetlens_triangulated_window_age_seconds) > 30",
         "fleetlens_triangulated_window_age_seconds) > 300"),
    ],
    ids=["agent-down-without-for", "ingest-lag-threshold", "unsynced-inverted", "late-verdicts"],
)  # fmt: skip
def test_the_unit_tests_catch_a_broken_rule(tmp_path: Path, old: str, new: str) -> None:
    """Break one rule in a copy: promtool test rules must now fail."""
    rules = tmp_path / "rules"
    rules.mkdir()
    text = (PROM_DIR / "rules" / "fleetlens.yml").read_text()
    assert old in text
    (rules / "fleetlens.yml").write_text(text.replace(old, new, 1))
    (tmp_path / "tests").mkdir()
    shutil.copy(UNIT_TESTS, tmp_path / "tests" / UNIT_TESTS.name)
    r = promtool("test", "rules", f"tests/{UNIT_TESTS.name}", cwd=tmp_path)
    assert r.returncode != 0, r.stdout
    assert "FAILED" in r.stdout + r.stderr
