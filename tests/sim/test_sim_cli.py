"""``fleetlens sim``: files on disk, and streaming into a real collector subprocess."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from fleetlens.fixtures.collector import CollectorProcess, free_port, start_collector
from fleetlens.fixtures.sim.cli import main
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import SIM_SCHEMA, Simulator

from fleetlens.topology import Topology, from_spec

SPEC = "leafspine:hosts=8,nics=2,leaves=4,spines=2"


def test_cli_writes_windows_truth_and_topology(tmp_path: Path) -> None:
    out = tmp_path / "run"
    faults = ["--fault", "leaf1->spine0:delay_us=20", "--fault", "h03/eth1:drop=0.3"]
    rc = main(["--topology", SPEC, "--seconds", "2", "--seed", "3", *faults, "--out", str(out)])
    assert rc == 0
    windows = pq.read_table(out / "windows.parquet")
    assert windows.schema.remove_metadata().equals(SIM_SCHEMA)
    cfg = SimConfig(faults=("leaf1->spine0:delay_us=20", "h03/eth1:drop=0.3"))
    same = Simulator(from_spec(SPEC), cfg, seed=3).run(2)
    assert windows.equals(same.windows.replace_schema_metadata(windows.schema.metadata))
    links = pq.read_table(out / "truth_links.parquet").to_pylist()
    assert {r["link_id"] for r in links if r["faulty"]} == {"leaf1->spine0"}
    assert (
        pq.read_table(out / "truth_devices.parquet").column("device").to_pylist()
        == ["h03/eth1"] * 2
    )
    assert pq.read_table(out / "truth_clocks.parquet").num_rows == 2 * 8
    assert pq.read_table(out / "truth_paths.parquet").num_rows == same.truth_paths.num_rows
    topo = Topology.load(out / "topology.json")
    assert [n.id for n in topo.nics] == [n.id for n in from_spec(SPEC).nics]


def test_cli_rejects_bad_input_clearly(tmp_path: Path, capsys) -> None:
    assert main(["--topology", SPEC, "--fault", "leaf9->x:loss=1", "--out", str(tmp_path)]) == 2
    assert "no link" in capsys.readouterr().err
    assert main(["--topology", "ring:n=3", "--out", str(tmp_path)]) == 2
    assert "unknown topology kind" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--topology", SPEC])  # neither --out nor --collector
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert main(["--topology", SPEC, "--seconds", "1", "--collector", dead, "--fast"]) == 1
    assert "refused" in capsys.readouterr().err.lower()


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[CollectorProcess]:
    """A real `fleetlens collector` on 127.0.0.1 with a DuckDB file and ingest auth."""
    inv = tmp_path / "topo.json"
    from_spec(SPEC).save(inv)
    with start_collector(tmp_path / "fleet.duckdb", inv, tokens=("sim-ingest", "sim-read")) as c:
        yield c


def test_stream_into_real_collector(
    collector: CollectorProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, db = collector.url, collector.db
    tok = tmp_path / "token"
    tok.write_text("sim-ingest\n")
    epoch = (time.time_ns() - 10 * 10**9) // 10**9 * 10**9  # recent, whole seconds
    fault = "leaf0->spine1:blackhole"
    args = ["--topology", SPEC, "--seconds", "3", "--seed", "2", "--collector", url, "--fast",
            "--token-file", str(tok), "--fault", fault, "--epoch-ns", str(epoch)]  # fmt: skip
    assert main(args) == 0
    # The same run again re-sends the same batch ids: the collector stores them once.
    assert main(args) == 0
    # Real time: the window is posted when it ends on the wall clock.
    t0 = time.time_ns()
    rt = ["--topology", SPEC, "--seconds", "1", "--seed", "9", "--collector", url,
          "--token-file", str(tok)]  # fmt: skip
    assert main(rt) == 0
    assert time.time_ns() >= (t0 // 10**9 + 1) * 10**9
    # Wrong token: refused, and the CLI says so.
    tok.write_text("wrong\n")
    capsys.readouterr()
    assert main(args) == 1
    assert "401" in capsys.readouterr().err
    collector.stop(timeout_s=20)  # its DuckDB file is ours to read once it has exited
    want = (
        Simulator(from_spec(SPEC), SimConfig(faults=(fault,), epoch_ns=epoch), seed=2)
        .run(3)
        .windows
    )
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("select count(*) from hosts").fetchone()[0] == 8
        got = con.execute(
            "select count(*), sum(sent), sum(received), sum(pure) from windows where start_ns < ?",
            [epoch + 3 * 10**9],
        ).fetchone()
        realtime_rows = con.execute(
            "select count(*) from windows where start_ns >= ?", [epoch + 3 * 10**9]
        ).fetchone()[0]
    finally:
        con.close()
    cols = [want.column(c).to_pylist() for c in ("sent", "received", "pure")]
    assert got == (want.num_rows, *(sum(c) for c in cols))
    assert got[1] > got[2]  # the black hole's losses arrived
    assert realtime_rows == Simulator(from_spec(SPEC), SimConfig(), seed=9).n_flows


def test_cli_duckdb_output_matches_parquet(tmp_path: Path) -> None:
    args = ["--topology", SPEC, "--seconds", "2", "--seed", "5", "--fault", "spine1:fail"]
    assert main([*args, "--out", str(tmp_path / "pq")]) == 0
    assert main([*args, "--out", str(tmp_path / "db"), "--format", "duckdb"]) == 0
    con = duckdb.connect(str(tmp_path / "db" / "sim.duckdb"), read_only=True)
    try:
        for name in ("windows", "truth_links", "truth_clocks", "truth_devices", "truth_paths"):
            want = pq.read_table(tmp_path / "pq" / f"{name}.parquet")
            got = con.execute(f'select count(*) from "{name}"').fetchone()[0]
            assert got == want.num_rows, name
        lost = con.execute("select sum(sent - received) from windows").fetchone()[0]
    finally:
        con.close()
    w = pq.read_table(tmp_path / "pq" / "windows.parquet")
    assert lost == sum(w.column("sent").to_pylist()) - sum(w.column("received").to_pylist()) > 0
