"""The deployments past one collector (issue 27): docker-compose's ``scale`` profile and the
Kubernetes ``scale`` overlay. Validated with the real tools (``docker-compose config``,
``kubectl kustomize``) and for how the parts fit: every NATS server routes to the others, the
shards' ``--shard I/K`` cover 0..K-1 and the fleet tier's ``--shards`` is K, one inventory
everywhere, the Parquet minutes the shards write are where the tier reads them, and every
command line is accepted by the real ``fleetlens`` parser of its command."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import DEPLOY, PROM_DIR

ROOT = DEPLOY.parent
SCALE = DEPLOY / "k8s" / "overlays" / "scale"
TOKENS = {"FLEETLENS_INGEST_TOKEN": "ingest-test", "FLEETLENS_READ_TOKEN": "read-test"}


def _opts(args: list[str]) -> dict[str, str]:
    """``--name=value`` arguments as a dict (every deployment here writes them that way)."""
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def _accepted(args: list[str]) -> None:
    """The command line parses with the real CLI of its command (no unknown or bad flag)."""
    from fleetlens.api import cli as collector_cli
    from fleetlens.api import fleetcli
    from fleetlens.fixtures.sim import cli as sim_cli

    command = args[0]
    with tempfile.TemporaryDirectory() as tmp:
        # Kubernetes' $(VAR) as a value; the token files as one that exists here.
        token = Path(tmp) / "token"
        token.write_text("a-token\n")
        rest = [re.sub(r"\$\(\w+\)", "0", a) for a in args[1:]]
        rest = [re.sub(r"^(--\w+-token-file=).*", rf"\g<1>{token}", a) for a in rest]
        if command == "collector":
            collector_cli.settings_from_args(rest)
        elif command == "fleet":
            _, others = fleetcli._fleet_parser().parse_known_args(rest)
            collector_cli.settings_from_args(others)
        elif command == "sim":
            sim_cli._parser().parse_args(rest)
        else:
            pytest.fail(f"no parser known for {command!r}")


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """A compose service's volumes as {target: (source, mode)} (``config`` writes strings)."""
    return {t: (src, mode) for src, t, mode in (v.rsplit(":", 2) for v in service["volumes"])}


def _shard_split(shards: list[list[str]]) -> int:
    """K, after checking that the shards' --shard I/K are 0/K .. K-1/K."""
    given = sorted(_opts(a)["shard"] for a in shards)
    k = len(shards)
    assert given == [f"{i}/{k}" for i in range(k)], given
    return k


# ---- docker-compose --profile scale ----------------------------------------------------------
@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    if shutil.which("docker-compose") is None:
        pytest.skip("needs Debian docker-compose")
    r = subprocess.run(
        ["docker-compose", "--profile", "scale", "config"],
        cwd=ROOT, env=TOKENS | {"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)["services"]


def test_compose_scale_profile_is_apart_from_the_default_stack(compose: dict[str, Any]) -> None:
    scale = {n for n, s in compose.items() if "scale" in s.get("profiles", [])}
    assert scale == {"nats-1", "nats-2", "nats-3", "shard-0", "shard-1", "fleet", "sim",
                     "prometheus-scale"}  # fmt: skip
    assert not compose["collector"].get("profiles"), "plain 'up' keeps the single collector"


def test_compose_nats_servers_form_one_cluster(compose: dict[str, Any]) -> None:
    names = {"nats-1", "nats-2", "nats-3"}
    for name in names:
        args = compose[name]["command"]
        opts = _opts(args)
        assert "-js" in args and opts["cluster_name"] == "fleetlens"
        assert opts["server_name"] == name
        routes = {re.match(r"nats://([\w-]+):6222", r).group(1) for r in opts["routes"].split(",")}  # type: ignore[union-attr]
        assert routes == names - {name}


def test_compose_shards_fleet_and_sim_fit_together(compose: dict[str, Any]) -> None:
    shards = [compose[n]["command"] for n in ("shard-0", "shard-1")]
    fleet, sim = compose["fleet"]["command"], compose["sim"]["command"]
    for args in (*shards, fleet, sim):
        _accepted(args)
    k = _shard_split(shards)
    assert int(_opts(fleet)["shards"]) == k
    urls = {f"nats://nats-{i}:4222" for i in (1, 2, 3)}
    for args in (*shards, fleet, sim):
        assert set(_opts(args)["nats"].split(",")) == urls
    inventories = {_opts(a)["inventory"] for a in (*shards, fleet)} | {_opts(sim)["topology"]}
    assert len(inventories) == 1, inventories
    # Parquet: every shard writes into the volume the tier reads, read-only there.
    dirs = {_opts(a)["parquet-dir"] for a in shards}
    (parquet,) = dirs
    assert _opts(fleet)["parquet"] == parquet
    for name in ("shard-0", "shard-1", "fleet"):
        assert _mounts(compose[name])[parquet] == ("parquet", "ro" if name == "fleet" else "rw")
    dbs = {_opts(a)["db"] for a in shards}
    assert len(dbs) == k, "each shard writes its own DuckDB file"


def test_compose_prometheus_scrapes_the_shards_and_the_tier(compose: dict[str, Any]) -> None:
    prom = compose["prometheus-scale"]
    targets, _ = _mounts(prom)["/etc/prometheus/targets"]
    groups = yaml.safe_load((Path(targets) / "collector.yml").read_text())
    scraped = {t.split(":")[0] for g in groups for t in g["targets"]}
    assert scraped == {"fleet", "shard-0", "shard-1"}
    assert Path(targets).parent == PROM_DIR
    for name in scraped:
        assert "--public-metrics" in compose[name]["command"]
        assert "--listen=0.0.0.0:8470" in compose[name]["command"]


# ---- kubectl kustomize deploy/k8s/overlays/scale ---------------------------------------------
@pytest.fixture(scope="module")
def k8s() -> list[dict[str, Any]]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl (kustomize) not installed")
    r = subprocess.run(
        ["kubectl", "kustomize", str(SCALE)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    (c,) = obj["spec"]["template"]["spec"]["containers"]
    return c


def test_k8s_scale_replaces_the_collector_with_shards_and_a_tier(k8s: list[dict[str, Any]]) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in k8s}
    assert ("StatefulSet", "fleetlens-collector") not in kinds
    assert ("Service", "fleetlens-collector-headless") not in kinds
    shard_set = _one(k8s, "StatefulSet", "fleetlens-shard")
    k = shard_set["spec"]["replicas"]
    shard, fleet = _container(shard_set), _container(_one(k8s, "Deployment", "fleetlens-fleet"))
    _accepted(shard["args"])
    _accepted(fleet["args"])
    assert _opts(shard["args"])["shard"] == f"$(SHARD_INDEX)/{k}"
    (index,) = [e for e in shard["env"] if e["name"] == "SHARD_INDEX"]
    assert "apps.kubernetes.io/pod-index" in index["valueFrom"]["fieldRef"]["fieldPath"]
    assert int(_opts(fleet["args"])["shards"]) == k
    # The base's collector Service (agents' --collector, the ServiceMonitor) selects the tier.
    svc = _one(k8s, "Service", "fleetlens-collector")["spec"]["selector"]
    labels = _one(k8s, "Deployment", "fleetlens-fleet")["spec"]["template"]["metadata"]["labels"]
    assert svc.items() <= labels.items()
    shard_labels = shard_set["spec"]["template"]["metadata"]["labels"]
    assert not svc.items() <= shard_labels.items()


def test_k8s_scale_parquet_inventory_and_nats_are_shared(k8s: list[dict[str, Any]]) -> None:
    shard_set = _one(k8s, "StatefulSet", "fleetlens-shard")
    fleet_dep = _one(k8s, "Deployment", "fleetlens-fleet")
    shard, fleet = _container(shard_set), _container(fleet_dep)
    agent = _container(_one(k8s, "DaemonSet", "fleetlens-agent"))
    pvc = _one(k8s, "PersistentVolumeClaim", "fleetlens-parquet")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    parquet = _opts(shard["args"])["parquet-dir"]
    assert _opts(fleet["args"])["parquet"] == parquet
    for obj, c, ro in ((shard_set, shard, False), (fleet_dep, fleet, True)):
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == parquet]
        (vol,) = [
            v for v in obj["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
        ]
        assert vol["persistentVolumeClaim"]["claimName"] == "fleetlens-parquet"
        assert mount.get("readOnly", False) == ro
    inventories = {_opts(c["args"])["inventory"] for c in (shard, fleet, agent)}
    assert len(inventories) == 1
    nats = {_opts(c["args"])["nats"] for c in (shard, fleet, agent)}
    assert nats == {"nats://fleetlens-nats:4222"}
    assert _opts(agent["args"])["collector"] == "http://fleetlens-collector:8470"


def test_k8s_scale_nats_is_a_three_server_cluster(k8s: list[dict[str, Any]]) -> None:
    sts = _one(k8s, "StatefulSet", "fleetlens-nats")
    assert sts["spec"]["replicas"] == 3
    opts = _opts(_container(sts)["args"])
    head = sts["spec"]["serviceName"]
    routes = opts["routes"].split(",")
    assert routes == [f"nats://fleetlens-nats-{i}.{head}:6222" for i in range(3)]
    assert _one(k8s, "Service", head)["spec"]["clusterIP"] == "None"
    assert "--jetstream" in _container(sts)["args"]
    assert _one(k8s, "ServiceMonitor", "fleetlens-shard")
