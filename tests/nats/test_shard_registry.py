"""Registrations reach the shards (``api/registry.py``), on a real 3-node JetStream cluster:
a host the inventory does not list registers with the fleet tier and a shard stores its
windows; so does a NIC it registers later (plugged in after start); a host that never
registered is refused as an unknown NIC and counted; a fleet tier that cannot reach NATS
answers a registration 503 with Retry-After, and stores nothing of it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from collector_waits import until
from fleetlens.api import registry
from fleetlens.fixtures.collector import free_port
from fleetlens.fixtures.nats import NatsCluster, start_fleet, start_shard
from nats_helpers import EPOCH_NS, HOSTS, PARTS, SPEC, metric_sum, stored_ids, windows

from fleetlens.batch import encode_batch
from fleetlens.stream import Publisher

pytest.importorskip("nats")

OPEN = ["--insecure-no-auth"]
SEC = 1_000_000_000


def _from(nic: str, k: int, epoch_ns: int) -> pa.Table:
    """A window table of inventory host h00's shape, sent from ``nic``."""
    t = windows(HOSTS[0], k, epoch_ns)
    src = pa.array([nic] * t.num_rows, pa.string())
    return t.set_column(t.schema.get_field_index("src_nic"), "src_nic", src)


def _publish(pub: Publisher, nic: str, k: int, epoch_ns: int = EPOCH_NS) -> str:
    host = nic.split("/")[0]
    bid = f"b-{host}-{k}"
    body, ctype = encode_batch(host, _from(nic, k, epoch_ns), bid)
    assert pub.publish(PARTS.of(host), bid, body, ctype)
    return bid


def _counts(text: str) -> tuple[float, float]:
    """(batches stored, batches refused as of unknown NICs)."""
    refused = 'fleetlens_ingest_rejected_batches_total{reason="unknown_nic"}'
    return metric_sum(text, "fleetlens_shard_batches_stored"), metric_sum(text, refused)


def test_hosts_registered_with_the_tier_are_known_to_the_shards(tmp_path: Path) -> None:
    with NatsCluster(tmp_path / "nats") as cluster:
        fleet = start_fleet(tmp_path, cluster.url, 1, SPEC, OPEN)
        shard = start_shard(tmp_path, cluster.url, 0, 1, SPEC, OPEN)
        pub = Publisher(cluster.url)
        try:
            tier, c = fleet.client(), shard.client()
            out = tier.register("z01", [{"ifname": "eth0", "ip": "10.9.0.1"}], "software")
            assert out["nics"] == ["z01/eth0"]
            stored = [_publish(pub, "z01/eth0", 0)]
            refused = _publish(pub, "z02/eth0", 0)  # never registered
            until(lambda: _counts(c.metrics_text()) == (1, 1), 30, "z01 stored, z02 refused")
            # A NIC plugged in later: registered again, with both NICs.
            tier.register("z01", [{"ifname": "eth0", "ip": "10.9.0.1"},
                                  {"ifname": "eth1", "ip": "10.9.1.1"}], "software")  # fmt: skip
            now = time.time_ns() // SEC * SEC - 2 * SEC  # a window of the open minute
            stored.append(_publish(pub, "z01/eth1", 1, now - SEC))
            until(lambda: _counts(c.metrics_text()) == (2, 1), 30, "z01/eth1's window stored")
            # ... in the tier's history within the shard's export tick, minute still open
            # (each poll a new period: /v1/flows keeps a period's answer for a minute)
            until(lambda: tier.flow_count(now - 10 * SEC, time.time_ns()) == len(HOSTS) - 1,
                  30, "the open minute's window in the tier's /v1/flows")  # fmt: skip
            text = c.metrics_text()
            assert metric_sum(text, "fleetlens_shard_registrations_learned") == 2
            assert {n["nic_id"] for n in c.nics(host_id="z01")} == {"z01/eth0", "z01/eth1"}
        finally:
            pub.close()
            shard.stop()
            fleet.stop()
        ids = stored_ids([tmp_path / "shard0" / "shard.duckdb"])
        assert sorted(ids) == sorted(stored) and refused not in ids


def test_a_tier_without_nats_answers_registrations_503(tmp_path: Path) -> None:
    dead = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    fleet = start_fleet(tmp_path, dead, 1, SPEC, OPEN)
    try:
        body = {"host_id": "z01", "nics": [{"ifname": "eth0", "ip": "10.9.0.1"}]}
        r = httpx.post(f"{fleet.url}/v1/register", json=body, timeout=30)
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "1"
        assert r.json()["field"] == "host_id" and "shards" in r.json()["detail"]
        assert "z01/eth0" not in {n["nic_id"] for n in fleet.client().nics()}
    finally:
        fleet.stop()


def test_registry_documents_round_trip_and_refuse_garbage() -> None:
    nics = [{"ifname": "eth0", "ip": "10.9.0.1"}]
    meta = {"ts_source": "hardware", "metrics_port": 9100, "agent_version": "1.2"}
    assert registry.decode(registry.encode(nics, {**meta, "other": 1})) == (nics, meta)
    for bad in (b"", b"[]", b'{"nics": []}', json.dumps({"nics": [{"ip": "x"}]}).encode()):
        with pytest.raises(ValueError, match="not a registration"):
            registry.decode(bad)
