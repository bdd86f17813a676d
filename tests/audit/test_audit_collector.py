"""``fleetlens audit --collector URL --db FILE`` against a running collector (no root): the
simulator streams an 8-host fabric with a hidden 0.5 % loss into a real collector in real
time while the audit waits out its period, then reads the REST API and a copy of the
collector's live DuckDB file and fails exactly that link."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from fleetlens.topology import from_spec

SPEC = "leafspine:hosts=8,nics=2,leaves=4,spines=2"
FAULT = "leaf2->spine1"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_audit_of_a_running_collector_finds_the_lossy_link(tmp_path: Path) -> None:
    topo = tmp_path / "topology.json"
    from_spec(SPEC).save(topo)
    db, url = tmp_path / "c.duckdb", f"http://127.0.0.1:{_port()}"
    env = {**os.environ, "FLEETLENS_INGEST_TOKEN": "in-tok", "FLEETLENS_READ_TOKEN": "rd-tok"}
    py = [sys.executable, "-m", "fleetlens.cli"]
    procs: list[subprocess.Popen] = []
    with open(tmp_path / "collector.log", "wb") as clog, open(tmp_path / "sim.log", "wb") as slog:
        try:
            procs.append(subprocess.Popen(
                [*py, "collector", "--db", str(db), "--listen", url[7:], "--inventory", str(topo)],
                env=env, stdout=clog, stderr=clog,
            ))  # fmt: skip
            _wait_healthy(url)
            procs.append(subprocess.Popen(
                [*py, "sim", "--topology", SPEC, "--seconds", "35", "--seed", "3", "--paths-known",
                 "--fault", f"{FAULT}:loss=0.005", "--collector", url],
                env=env, stdout=slog, stderr=slog,
            ))  # fmt: skip
            time.sleep(4)  # the simulated agents' first windows are in
            r = subprocess.run(
                [*py, "audit", "--collector", url, "--minutes", "0.25", "--db", str(db),
                 "--inventory", str(topo), "--report", str(tmp_path / "r")],
                env={**env, "FLEETLENS_INGEST_TOKEN": ""}, capture_output=True, text=True,
                timeout=180,
            )  # fmt: skip
        finally:
            for p in procs:
                p.terminate()
                p.wait(30)
    assert r.returncode == 1, r.stderr
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert rep["method"].startswith("tomography"), rep["method"]
    assert rep["failed_links"] == [FAULT], rep["summary"]
    assert rep["failed_nics"] == []
    bad = next(lk for lk in rep["links"] if lk["link_id"] == FAULT)
    assert 0.003 <= bad["loss_rate"] <= 0.007
    assert rep["flows"]["known_path"] == rep["flows"]["count"] > 0
    assert len(rep["hosts"]) == 8 and (tmp_path / "r" / "report.html").exists()


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError("collector did not start")
