"""``fleetlens audit`` without root: bad parameters and an unusable collector give exit 2 with
a sentence (never a traceback); against a real collector nobody probes, every NIC fails."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleetlens.fixtures.collector import free_port, start_collector

from fleetlens.audit.cli import main
from fleetlens.audit.data import RestReader, topology_from_rest
from fleetlens.topology import from_spec

CLI = [sys.executable, "-m", "fleetlens.cli", "audit"]


def audit(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--minutes", "0"], "--minutes must be > 0"),
        (["--minutes", "-1"], "--minutes must be > 0"),
        (["--minutes", "nan"], "--minutes must be > 0"),
        (["--minutes", "inf"], "--minutes must be > 0"),
        (["--minutes", "1e9"], "--minutes must be > 0 and <= 1440"),
        (["--minutes", "1", "--max-loss", "0"], "--max-loss"),
        (["--minutes", "1", "--max-delay-us", "-5"], "--max-delay-us"),
        (["--minutes", "1", "--warmup", "-1"], "--warmup"),
        (["--minutes", "1", "--inject", "loss:0.5%"], "--inject only works with --lab"),
    ],
)
def test_bad_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    code = main([*args, "--report", str(tmp_path), "--collector", "http://127.0.0.1:9"])
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "one of the arguments --collector --lab is required"),
        (["--minutes", "abc"], "invalid float value"),
        (["--collector", "ftp://x"], "http(s)://"),
        (["--lab", "--collector", "http://x"], "not allowed with argument"),
    ],
)
def test_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    base = ["--minutes", "1"] if "--minutes" not in args else []
    code = _exit_code(lambda: main([*base, *args, "--report", str(tmp_path)]))
    assert code == 2
    assert message in capsys.readouterr().err


def _exit_code(fn) -> int:  # type: ignore[no-untyped-def]
    """argparse's own errors exit 2 through SystemExit."""
    try:
        return fn()
    except SystemExit as e:
        return int(e.code or 0)


def test_bad_parameter_through_the_cli(tmp_path: Path) -> None:
    r = audit("--minutes", "0", "--report", str(tmp_path), "--collector", "http://127.0.0.1:9")
    assert r.returncode == 2
    assert "--minutes must be > 0" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="checks the --lab argument checks, which run as root")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--inject", "loss:x"], "--inject wants loss:PCT% or delay:USus"),
        (["--inject", "loss:150%"], "(0, 100]"),
        (["--inject", "delay:50%"], "microseconds"),
        (["--name", "toolongname"], "--name: 1-6"),
        (["--leaves", "3"], "divisible"),
    ],
)
def test_bad_lab_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    assert main(["--minutes", "1", "--lab", *args, "--report", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing was run


def test_unreachable_collector_fractional_minutes(tmp_path: Path) -> None:
    """0.5 min is accepted (the check happens before any waiting); nothing listens there."""
    t0 = time.monotonic()
    r = audit(
        "--minutes", "0.5", "--report", str(tmp_path),
        "--collector", f"http://127.0.0.1:{free_port()}",
    )  # fmt: skip
    assert r.returncode == 2
    assert "unreachable" in r.stderr and "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 20  # it did not wait the half minute first
    assert not (tmp_path / "report.json").exists()


def test_missing_token_file(tmp_path: Path) -> None:
    r = audit(
        "--minutes", "1", "--report", str(tmp_path), "--collector", "http://127.0.0.1:9",
        "--token-file", str(tmp_path / "nope"),
    )  # fmt: skip
    assert r.returncode == 2 and "--token-file" in r.stderr


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real collector with tokens, a 4-host x 2-NIC inventory, and no agents."""
    d = tmp_path_factory.mktemp("collector")
    inventory = "leafspine:hosts=4,nics=2,leaves=2"
    with start_collector(
        d / "c.duckdb", inventory, tokens=("ingest-secret", "rd"), timeout_s=60
    ) as c:
        yield c.url


def test_wrong_token(tmp_path: Path, collector: str) -> None:
    (tmp_path / "tok").write_text("wrong\n")
    r = audit("--minutes", "0.01", "--report", str(tmp_path / "r"), "--collector", collector,
              "--token-file", str(tmp_path / "tok"))  # fmt: skip
    assert r.returncode == 2
    assert "refused" in r.stderr and "read token" in r.stderr and "Traceback" not in r.stderr


def test_collector_without_agents_fails_every_nic(tmp_path: Path, collector: str) -> None:
    """Nobody probes: no link can be validated from data and every NIC is silent (exit 1)."""
    r = audit("--minutes", "0.02", "--report", str(tmp_path), "--collector", collector,
              env={"FLEETLENS_READ_TOKEN": "rd"})  # fmt: skip
    assert r.returncode == 1, r.stderr
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["result"] == "fail"
    assert rep["method"].startswith("tomography"), rep["method"]  # from GET /v1/flows: none
    assert "GET /v1/flows" in rep["method"] and rep["flows"]["count"] == 0
    assert all(lk["status"] == "unobserved" for lk in rep["links"])
    assert len(rep["nics"]) == 8
    assert all(n["status"] == "failed" for n in rep["nics"])
    assert sorted(rep["failed_nics"]) == sorted(n["nic_id"] for n in rep["nics"])
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_topology_from_the_collector_equals_its_inventory(collector: str) -> None:
    """Without --inventory the remote audit judges on the inventory the collector serves:
    the same hosts, NICs (and leaves), links (and tiers) and every pair's ECMP paths."""
    rest = RestReader(collector, "rd")
    try:
        ev = rest.gather(time.time_ns() - 10**9, time.time_ns(), [])
    finally:
        rest.close()
    got, want = (
        topology_from_rest(ev.links, ev.nics),
        from_spec("leafspine:hosts=4,nics=2,leaves=2"),
    )
    assert got is not None
    assert got.hosts == want.hosts
    assert sorted((n.id, n.leaf) for n in got.nics) == sorted((n.id, n.leaf) for n in want.nics)
    assert sorted((lk.id, lk.tier) for lk in got.links) == sorted(
        (lk.id, lk.tier) for lk in want.links
    )
    for a, b in itertools.permutations([n.id for n in want.nics], 2):
        assert sorted(got.ecmp_paths(a, b)) == sorted(want.ecmp_paths(a, b)), (a, b)
    assert topology_from_rest(ev.links, [dict(n, leaf=None) for n in ev.nics]) is None
