"""``fleetlens audit --collector URL`` against a running collector (no root): the simulator
streams an 8-host fabric with a hidden 0.5 % loss into a real collector in real time while
two audits wait out the same period at once — one remote (per-flow totals from
GET /v1/flows, the topology from the collector's inventory: what an operator on another
machine runs), one reading a copy of the collector's live DuckDB file (``--db``) — and
both fail exactly that link; without the fault the remote audit passes. The two fabrics (with
and without the fault: a collector and a simulator each) stream at the same time: they share
nothing but the box, and the module waits ~25 s once instead of twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from fleetlens.fixtures.collector import start_collector, stop_process

from fleetlens.topology import from_spec

SPEC = "leafspine:hosts=8,nics=2,leaves=4,spines=2"
FAULT = "leaf2->spine1"


def _audits_while_streaming(
    tmp_path: Path, fault: str | None, with_db: bool
) -> dict[str, tuple[int, str, dict]]:
    """Collector + simulator streaming in real time; the remote audit (and with ``with_db``
    the --db one) over the same period, at once. Per audit: (exit code, stderr, report)."""
    topo = tmp_path / "topology.json"
    from_spec(SPEC).save(topo)
    db, tokens = tmp_path / "c.duckdb", ("in-tok", "rd-tok")
    env = {**os.environ, "FLEETLENS_INGEST_TOKEN": tokens[0], "FLEETLENS_READ_TOKEN": tokens[1]}
    py = [sys.executable, "-m", "fleetlens.cli"]
    audits = {"remote": []}  # nothing but the URL (and the read token)
    if with_db:
        audits["db"] = ["--db", str(db), "--inventory", str(topo)]
    procs: list[subprocess.Popen] = []
    with (
        start_collector(db, topo, tokens=tokens, timeout_s=60) as collector,
        open(tmp_path / "sim.log", "wb") as slog,
    ):
        url = collector.url
        try:
            procs.append(subprocess.Popen(
                [*py, "sim", "--topology", SPEC, "--seconds", "35", "--seed", "3", "--paths-known",
                 *(["--fault", f"{fault}:loss=0.005"] if fault else []), "--collector", url],
                env=env, stdout=slog, stderr=slog,
            ))  # fmt: skip
            time.sleep(4)  # the simulated agents' first windows are in
            runs = {}
            for name, extra in audits.items():
                runs[name] = subprocess.Popen(
                    [*py, "audit", "--collector", url, "--minutes", "0.25", *extra,
                     "--report", str(tmp_path / name)],
                    env={**env, "FLEETLENS_INGEST_TOKEN": ""}, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                )  # fmt: skip
                procs.append(runs[name])
            done = {name: (p, p.communicate(timeout=180)[1]) for name, p in runs.items()}
        finally:
            for p in procs:  # (the audits have exited unless the test failed)
                stop_process(p, timeout_s=30)
    out = {}
    for name, (p, err) in done.items():
        assert p.returncode in (0, 1), f"{name}: {err}"
        out[name] = (p.returncode, err, json.loads((tmp_path / name / "report.json").read_text()))
        assert (tmp_path / name / "report.html").exists()
    return out


Runs = dict[str, tuple[int, str, dict]]


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[Runs]]]:
    """Both scenarios at once, each in its own directory; a test reads its own (its failure
    stays its own: ``result()`` raises what that scenario raised)."""
    with ThreadPoolExecutor(2) as pool:
        yield {
            "lossy": pool.submit(_audits_while_streaming, tmp_path_factory.mktemp("lossy"),
                                 FAULT, True),
            "clean": pool.submit(_audits_while_streaming, tmp_path_factory.mktemp("clean"),
                                 None, False),
        }  # fmt: skip


def test_audit_of_a_running_collector_finds_the_lossy_link(
    streams: dict[str, Future[Runs]],
) -> None:
    reports = {}
    for name, (code, err, rep) in streams["lossy"].result().items():
        assert code == 1, f"{name}: {err}"
        reports[name] = rep
        assert rep["method"].startswith("tomography"), rep["method"]
        assert rep["failed_links"] == [FAULT], (name, rep["summary"])
        assert rep["failed_nics"] == [], name
        bad = next(lk for lk in rep["links"] if lk["link_id"] == FAULT)
        assert 0.003 <= bad["loss_rate"] <= 0.007, (name, bad["loss_rate"])
        assert rep["flows"]["known_path"] == rep["flows"]["count"] > 0, name
        assert len(rep["hosts"]) == 8
    remote, local = reports["remote"], reports["db"]
    assert "GET /v1/flows" in remote["method"] and "--db" in local["method"]
    # Same period, same windows: the same flows and the same evidence on the bad link.
    assert remote["flows"]["count"] == local["flows"]["count"]
    lossy = {r: next(lk for lk in reports[r]["links"] if lk["link_id"] == FAULT)
             for r in reports}  # fmt: skip
    assert lossy["remote"]["probes"] == pytest.approx(lossy["db"]["probes"], rel=0.02)
    assert lossy["remote"]["loss_rate"] == pytest.approx(lossy["db"]["loss_rate"], rel=0.1)


def test_remote_audit_of_a_clean_fabric_passes(streams: dict[str, Future[Runs]]) -> None:
    ((code, err, rep),) = streams["clean"].result().values()
    assert code == 0, (err, rep["summary"])
    assert rep["result"] == "pass" and "GET /v1/flows" in rep["method"]
    assert rep["failed_links"] == rep["failed_nics"] == rep["unobserved_links"] == []
    assert all(lk["status"] == "validated" for lk in rep["links"]) and len(rep["links"]) == 48
    # flows are path groups (fleetlens.pathgroups): up to 2 per NIC pair on 2 spines
    assert rep["flows"]["known_path"] == rep["flows"]["count"] > 300
