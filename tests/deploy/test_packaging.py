"""Container image, docker-compose, Kubernetes manifests and systemd units: validated with the
real tools where they exist here (docker-compose config, kubectl kustomize, systemd-analyze
verify) and by parsing for the properties the issue asks for."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import DEPLOY, PROM_DIR, load_rules

ROOT = DEPLOY.parent
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
TOKENS = {"FLEETLENS_INGEST_TOKEN": "ingest-test", "FLEETLENS_READ_TOKEN": "read-test"}


def _run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)


# ---- Dockerfile ------------------------------------------------------------------------------
def _stages() -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {}
    current = ""
    for line in DOCKERFILE.read_text().splitlines():
        m = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.I)
        if m:
            current = m.group(1)
            stages[current] = []
        elif current and line and not line.startswith("#"):
            stages[current].append(line)
    return stages


def test_dockerfile_is_multi_stage_with_a_compiler_only_in_the_build_stage() -> None:
    stages = _stages()
    assert {"build", "runtime", "collector", "agent"} <= set(stages)
    build = "\n".join(stages["build"])
    assert "gcc" in build and "pip wheel --no-deps --wheel-dir /wheels ." in build
    for name in ("runtime", "collector", "agent"):
        assert "gcc" not in "\n".join(stages[name]), name
    assert "USER 10001:10001" in stages["collector"]
    # Every Python component the wheel packages is copied into the build stage.
    copied = {m.group(1) for ln in stages["build"] if (m := re.match(r"COPY (\w+)/ ", ln))}
    assert copied == {"fleetlens", "probe", "sync", "triangulate", "api", "fixtures"}


def test_each_image_installs_only_its_role_extras() -> None:
    """The agent image holds fleetlens[agent,nats] (no DuckDB, FastAPI, SciPy), the collector
    image fleetlens[collector,sim,nats] (a shard, the fleet tier, the compose stand-in fleet);
    each copies its venv from the stage that installed it."""
    stages = _stages()
    wanted = {"agent": {"agent", "nats"}, "collector": {"collector", "sim", "nats"}}
    for role, extras in wanted.items():
        (copy,) = [ln for ln in stages[role] if ln.startswith("COPY --from=")]
        source = copy.split()[1].removeprefix("--from=")
        wheel_extras = (re.search(r"\.whl\)\[([\w,]+)\]", ln) for ln in stages[source])
        installs = [m.group(1) for m in wheel_extras if m]
        assert installs and all(set(i.split(",")) == extras for i in installs), (role, installs)
        assert all("bin/pip install" not in ln for ln in stages[role]), role


def test_every_command_has_the_extra_of_its_name_and_all_holds_them() -> None:
    """'fleetlens COMMAND' names fleetlens[COMMAND] when a dependency is missing."""
    from fleetlens.cli import SUBCOMMANDS

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert set(SUBCOMMANDS) <= set(extras)
    (everything,) = extras["all"]
    assert everything.startswith("fleetlens[") and everything.endswith("]"), everything
    # ... and the transport extras no command is named for (nats: agents, sim and shards)
    assert set(everything[len("fleetlens[") : -1].split(",")) == set(SUBCOMMANDS) | {"nats"}


# ---- docker-compose --------------------------------------------------------------------------
def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="needs Debian docker-compose")
def test_docker_compose_config_passes_and_requires_tokens() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    ok = _run(["docker-compose", "config"], cwd=ROOT, env=env | TOKENS)
    assert ok.returncode == 0, ok.stderr
    resolved = yaml.safe_load(ok.stdout)
    assert set(resolved["services"]) >= {"collector", "prometheus", "grafana", "agent0", "agent1"}
    assert resolved["services"]["grafana"]["environment"]["FLEETLENS_READ_TOKEN"] == "read-test"
    missing = _run(["docker-compose", "config", "-q"], cwd=ROOT, env=env)
    assert missing.returncode != 0 and "FLEETLENS_INGEST_TOKEN" in missing.stderr


def test_compose_services_are_wired_to_the_deploy_files() -> None:
    s = _compose()["services"]
    for svc in ("agent0", "agent1"):
        agent = s[svc]
        assert agent["cap_drop"] == ["ALL"] and agent["cap_add"] == ["NET_RAW"]
        assert agent["build"]["target"] == "agent"
        assert "--metrics=0.0.0.0:9478" in agent["command"]
    assert s["collector"]["build"]["target"] == "collector"
    for vol in s["prometheus"]["volumes"][:3]:
        src = vol.split(":")[0]
        assert (ROOT / src).exists(), src
    # The compose targets are the agents and the collector the compose file defines.
    agents = yaml.safe_load((PROM_DIR / "targets" / "agents.yml").read_text())
    hosts = {g["labels"]["host"]: g["targets"][0] for g in agents}
    assert hosts == {h: f"{h}:9478" for h in ("agent0", "agent1")}
    assert all(s[h]["hostname"] == h for h in hosts)
    dockerfile = s["collector"]["build"]["dockerfile"]
    assert (ROOT / dockerfile) == DOCKERFILE


# ---- Kubernetes ------------------------------------------------------------------------------
def _base_objects() -> list[dict[str, Any]]:
    if shutil.which("kubectl"):
        r = _run(["kubectl", "kustomize", str(K8S / "base")])
        assert r.returncode == 0, r.stderr
        return [d for d in yaml.safe_load_all(r.stdout) if d]
    kust = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    objs = []
    for res in kust["resources"]:
        objs += [d for d in yaml.safe_load_all((K8S / "base" / res).read_text()) if d]
    return objs


def _one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


@pytest.fixture(scope="module")
def k8s() -> list[dict[str, Any]]:
    return _base_objects()


def test_agent_daemonset(k8s: list[dict[str, Any]]) -> None:
    ds = _one(k8s, "DaemonSet", "fleetlens-agent")["spec"]["template"]["spec"]
    assert ds["hostNetwork"] is True and ds["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in ds[
        "tolerations"
    ]
    pc = _one(k8s, "PriorityClass", "fleetlens-agent")
    assert ds["priorityClassName"] == "fleetlens-agent" and pc["value"] >= 1_000_000
    (c,) = ds["containers"]
    caps = c["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["NET_RAW"]}  # no NET_ADMIN in the base
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert not c["securityContext"].get("privileged")
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind])
    assert {"name": "metrics", "containerPort": 9478} in c["ports"]
    env = {e["name"]: e for e in c["env"]}
    assert env["FLEETLENS_HOST_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_collector_statefulset_service_and_servicemonitors(k8s: list[dict[str, Any]]) -> None:
    sts = _one(k8s, "StatefulSet", "fleetlens-collector")["spec"]
    (claim,) = sts["volumeClaimTemplates"]
    (c,) = sts["template"]["spec"]["containers"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/var/lib/fleetlens"} in c[
        "volumeMounts"
    ]
    assert any(a.startswith("--db=/var/lib/fleetlens/") for a in c["args"])
    assert sts["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert {"cpu", "memory"} <= set(c["resources"]["limits"])
    svc = _one(k8s, "Service", "fleetlens-collector")
    assert svc["spec"]["ports"][0]["port"] == 8470
    # The job label the rules select on is the Service name.
    jobs = {r.expr for r in load_rules()}
    for name in ("fleetlens-collector", "fleetlens-agent"):
        sm = _one(k8s, "ServiceMonitor", name)
        assert sm["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": name}
        assert _one(k8s, "Service", name)["metadata"]["labels"]["app.kubernetes.io/name"] == name
        assert any(f'job="{name}"' in e for e in jobs)
    agent_sm = _one(k8s, "ServiceMonitor", "fleetlens-agent")["spec"]["endpoints"][0]
    assert agent_sm["relabelings"][0]["targetLabel"] == "host"
    assert agent_sm["port"] == "metrics"
    collector_sm = _one(k8s, "ServiceMonitor", "fleetlens-collector")["spec"]["endpoints"][0]
    assert collector_sm["authorization"]["credentials"]["key"] == "read-token"


def test_prometheus_rule_matches_the_rule_file(k8s: list[dict[str, Any]]) -> None:
    rule = _one(k8s, "PrometheusRule", "fleetlens")
    shipped = yaml.safe_load((PROM_DIR / "rules" / "fleetlens.yml").read_text())
    assert rule["spec"]["groups"] == shipped["groups"], "run: python deploy/k8s/prometheusrule.py"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
def test_hw_timestamps_overlay_adds_net_admin_only() -> None:
    r = _run(["kubectl", "kustomize", str(K8S / "overlays" / "hw-timestamps")])
    assert r.returncode == 0, r.stderr
    objs = [d for d in yaml.safe_load_all(r.stdout) if d]
    ds = _one(objs, "DaemonSet", "fleetlens-agent")["spec"]["template"]["spec"]
    caps = ds["containers"][0]["securityContext"]["capabilities"]
    assert caps == {"drop": ["ALL"], "add": ["NET_RAW", "NET_ADMIN"]}
    base = {(o["kind"], o["metadata"]["name"]) for o in _base_objects()}
    assert {(o["kind"], o["metadata"]["name"]) for o in objs} == base


# ---- systemd ---------------------------------------------------------------------------------
def _unit(name: str) -> dict[str, dict[str, list[str]]]:
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    text = (SYSTEMD / name).read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out[section] = {}
            continue
        key, _, value = line.partition("=")
        out[section].setdefault(key, []).append(value)
    return out


def test_agent_unit_uses_capabilities_not_root() -> None:
    svc = _unit("fleetlens-agent.service")["Service"]
    assert svc["User"] == ["fleetlens"]
    assert svc["AmbientCapabilities"] == ["CAP_NET_RAW"]
    assert svc["CapabilityBoundingSet"] == ["CAP_NET_RAW"]
    assert svc["Restart"] == ["on-failure"]
    assert svc["EnvironmentFile"] == ["/etc/fleetlens/agent.env"]
    env = dict(ln.split("=", 1) for ln in (SYSTEMD / "agent.env").read_text().splitlines()
               if ln and not ln.startswith("#"))  # fmt: skip
    used = set(re.findall(r"\$\{(\w+)\}", svc["ExecStart"][0]))
    assert used and used <= set(env), used - set(env)


def test_collector_unit_runs_without_privileges() -> None:
    svc = _unit("fleetlens-collector.service")["Service"]
    assert svc["User"] == ["fleetlens"] and svc["CapabilityBoundingSet"] == [""]
    assert svc["Restart"] == ["on-failure"]
    assert svc["EnvironmentFile"] == ["/etc/fleetlens/collector.env"]
    assert "--ingest-token-file" in svc["ExecStart"][0]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """The units point at /opt/fleetlens (the install path); verify checks that ExecStart
    exists, so it runs on copies pointing at this checkout's fleetlens entry point."""
    exe = Path(sys.executable).parent / "fleetlens"
    assert exe.exists()
    for unit in ("fleetlens-agent.service", "fleetlens-collector.service"):
        text = (SYSTEMD / unit).read_text().replace("/opt/fleetlens/bin/fleetlens", str(exe))
        (tmp_path / unit).write_text(text)
    r = _run(["systemd-analyze", "verify", *map(str, sorted(tmp_path.glob("*.service")))])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fleetlens" not in r.stderr  # no warning about our units either
