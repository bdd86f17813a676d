"""``bench/realtime.py``: the replay's time shift is exact, and the small path runs end to end.

The smoke run replays 64 hosts for 15 s into a real collector (after 6 s into the ingest-only
one), sampling the ages every second, and checks what it prints: every figure present and
measured (lags from answered batches, ages from the collector), not how large they are (this
box is shared). Both ages were first measured 3-4 s into the replay here (30 s replays
sampled every 2 s took 15 s longer to show the same figures).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from fleetlens.fixtures.sim import Simulator
from fleetlens.fixtures.sim.stream import split_by_host

from fleetlens.batch import CT_ARROW, decode_batch, encode_batch
from fleetlens.topology import from_spec

BENCH = Path(__file__).resolve().parents[2] / "bench" / "realtime.py"
NUM = r"(\d+(?:\.\d+)?)"


def _bench():
    spec = importlib.util.spec_from_file_location("realtime_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_shifted_body_is_the_window_moved_in_time() -> None:
    rt = _bench()
    topo = from_spec(rt.fleet_spec(64))
    win = next(iter(Simulator(topo, rt.sim_config(), seed=2).stream(1)))
    host, rows = next(iter(split_by_host(win.windows)))
    rows = rows.combine_chunks()
    bid = rt.batch_id(0, 5)
    body = encode_batch(host, rows, bid)[0]
    point = np.array([0, len(body), *rt.patch_points(body, bid)])
    delta = 123_456 * rt.SEC + 789
    got = decode_batch(rt.shifted(body, point, delta, 4242), CT_ARROW)
    assert got.batch_id == rt.batch_id(0, 5, 4242) and got.host_id == host
    want = rows.set_column(3, "start_ns", pc.add(rows["start_ns"], delta))
    hull = rows["hull_t_ns"].combine_chunks()
    moved = pa.ListArray.from_arrays(hull.offsets, pc.add(hull.flatten(), delta))
    want = want.set_column(want.schema.get_field_index("hull_t_ns"), "hull_t_ns", moved)
    assert got.windows.select(want.column_names).equals(want.cast(got.windows.schema))
    assert hull.flatten().to_numpy().size > 0  # the hulls were there to move
    # The cached body is untouched (every replay second starts from it).
    assert decode_batch(body, CT_ARROW).windows["start_ns"].equals(rows["start_ns"])


# Not serial: it replays at wall-clock pace, but asserts only that every figure is printed and
# measured, never how large a lag is (the bench's own PASS/FAIL line may say either), so a
# busy machine slows the figures without failing it; a collector on a free port, its own
# work directory. It held 33 s of the serial phase.
@pytest.mark.slow
def test_smoke_run_prints_measured_lags(tmp_path: Path) -> None:
    args = ["--hosts", "64", "--minutes", "0.25", "--baseline-minutes", "0.1", "--windows", "3",
            "--sample-s", "1", "--cache", str(tmp_path / "cache"),
            "--workdir", str(tmp_path)]  # fmt: skip
    run = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "3 windows simulated and encoded" in out and "64 hosts registered" in out
    minutes = re.findall(
        rf"minute 1: ingest lag p50 +{NUM} p99 +{NUM} max +{NUM} s, batches stored/due "
        rf"(\d+)/(\d+) \(oldest unanswered due {NUM} s ago\); (.*)collector {NUM} cores, RSS "
        rf"([\d,]+) MiB", out)  # fmt: skip
    assert len(minutes) == 2, out  # the ingest-only baseline, then the full collector
    for p50, p99, mx, stored, due, backlog, _, cores, rss in minutes:
        assert 0 <= float(p50) <= float(p99) <= float(mx) and float(backlog) >= 0
        assert 0 < int(stored) <= int(due)  # batches answered 200 and counted
        assert float(cores) > 0 and int(rss.replace(",", "")) > 0
    assert minutes[0][6] == ""  # no loops, no ages
    ages = re.search(rf"verdict age p50 +{NUM} max +{NUM} s; clock-model age p50 +{NUM} max "
                     rf"+{NUM} s", minutes[1][6])  # fmt: skip
    assert ages is not None, out  # both ages measured (not nan) within the minute
    assert re.search(r"loops clocks [\d.]+ s, .*triangulate [\d.]+ s", out), out
    groups = [float(g) for g in re.findall(rf"; {NUM} batches per commit;", out)]
    assert len(groups) == 2 and all(g >= 1 for g in groups), out  # the writer's groups
    assert re.search(rf"CPU split +: full collector {NUM} cores, ingest-only {NUM} cores", out)
    assert re.search(r"collector RSS: peak [\d,]+ MiB at 64 hosts", out)
    assert re.search(r"^(PASS|FAIL): lags <= 3 s and not growing", out, re.M), out
    assert not list(tmp_path.glob("tmp*")), "the work directory is removed"
