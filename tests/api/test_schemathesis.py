"""Property-based run of schemathesis against the live /openapi.json: no 5xx, and every response
matches the documented status codes, content types and schemas. Bounded (few examples per
operation, fixed seed) so it finishes in seconds."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from collector_helpers import INGEST, READ, Server, make_windows

from fleetlens.batch import encode_batch
from fleetlens.topology import Topology

ST = str(Path(sys.executable).with_name("st"))
CHECKS = ("not_a_server_error,response_schema_conformance,status_code_conformance,"
          "content_type_conformance")  # fmt: skip


# Real ids for the path parameters, so the run reaches the data and not only 404s.
CONFIG = """
[[operations]]
include-path = "/v1/pairs/{src_nic}/{dst_nic}/owd"
parameters = { src_nic = "h00/eth0", dst_nic = "h01/eth1" }

[[operations]]
include-path = "/v1/jobs/{name}/impact"
parameters = { name = "train" }

[[operations]]
include-path = "/v1/plan/{host_id}"
parameters = { host_id = "h00" }
"""


def _run(server: Server, token: str, *extra: str) -> subprocess.CompletedProcess:
    config = server.db.parent / "schemathesis.toml"
    config.write_text(CONFIG)
    cmd = [ST, "--config-file", str(config), "run", f"{server.url}/openapi.json",
           "-H", f"Authorization: Bearer {token}",
           "--checks", CHECKS, "-n", "15", "--seed", "4", "--generation-database", "none",
           "--no-color", "--phases", "coverage,fuzzing", "--request-timeout", "20",
           "--workers", "1", *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def with_data(server: Server, topo: Topology) -> Server:
    with server.client(INGEST) as c:
        for host in topo.hosts:
            body, ctype = encode_batch(host, make_windows(topo, host, time.time_ns() - 5 * 10**9))
            assert c.post("/v1/ingest", content=body, headers={"Content-Type": ctype}).is_success
    with server.client(READ) as c:
        assert c.post("/v1/jobs", json={"name": "train", "hosts": ["h00", "h01"]}).is_success
    return server


def test_read_api_conforms(with_data: Server) -> None:
    r = _run(with_data, READ, "--exclude-tag", "ingest")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "Tested: 12" in r.stdout  # every read operation was exercised (/v1/flows too)
    assert "Missing test data" not in r.stdout  # ... with ids that exist


def test_ingest_api_conforms(with_data: Server) -> None:
    r = _run(with_data, INGEST, "--include-tag", "ingest")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "Tested: 4" in r.stdout  # ingest, register, plan, interfaces
