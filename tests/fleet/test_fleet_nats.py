"""The fleet tier over a real 3-node NATS JetStream cluster: the simulator's windows (256
hosts, a loss and a delay fault, 10 windows) through one collector, and published to
``FLEETLENS_WINDOWS`` as agents do, through 3 collector shards (``fleetlens collector --nats
--shard I/3``, whose ``SummaryPublisher`` hands each committed batch's summary on) and the
fleet tier, give the same verdicts and decisions after every
round and clock models within 5 ns for every window (``CLOCK_NS``), also across a shard's
``kill -9`` mid-stream (restarted 10 s later) and another shard paused 20 s (its partitions
taken over meanwhile, its backlog drained after); afterwards the tier's ``/v1/flows`` totals,
read from the shards' Parquet minutes, are the single collector's, flow by flow (no window
missing, none counted twice); hostile summaries are rejected, counted and acknowledged while
the partition keeps flowing."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pyarrow.compute as pc
import pytest
from fleet_helpers import DELAY, LOSS, host_batches, same_clocks
from fleetlens.api import clockgate, rounds, summaries
from fleetlens.api.config import Settings
from fleetlens.api.service import Collector

from fleetlens.batch import Batch, encode_batch
from fleetlens.records import WINDOW_SCHEMA
from fleetlens.stream import Partitions, Publisher
from fleetlens.topology import from_spec

nats = pytest.importorskip("nats")
fixture = pytest.importorskip("fleetlens.fixtures.nats")
fleet_mod = pytest.importorskip("fleetlens.api.fleet")
procs = pytest.importorskip("fleetlens.fixtures.collector")
sim = pytest.importorskip("fleetlens.fixtures.sim")

pytestmark = pytest.mark.serial  # a 3-node NATS cluster and the fleet tier held to deadlines

SHARDS = 3
ROUNDS = 10
# Delays count once a host's clock is synced (clockgate.py, a window or two in), and
# triangulation needs a per-flow baseline before the delay fault: it starts at 6 s.
DELAY_S = 6
# Clock models within 5 ns of the single collector's in every window: the solve reads only
# each directed pair's hull, its reference time included, which is what a summary carries.
CLOCK_NS = 5.0
ARRIVAL_NS = 500_000_000
SETTLED_NS = 2_000_000_000  # rounds run this long after a window's end: settled
KILL_AT, DOWN_S = 3, 10.0  # shard 1 killed (-9) right after this window's publication
PAUSE_AT, PAUSE_S = 6, 20.0  # shard 2 stopped (SIGSTOP) right after this window's publication
# Agents publish side by side (one process each), not one after another: a publish waits for
# JetStream's ack, ~6 ms, so 256 of them in a row took 1.6 s of every window.
PUBLISHERS = 16


def _settings(db: Path, inventory: Path) -> Settings:
    return Settings(db_path=db, inventory=str(inventory), insecure_no_auth=True)


def _stored(c: Collector) -> float:
    return c.metrics.batches.labels("stored")._value.get()


def _wait(cond, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


async def _publish_raw(url: str, subject: str, body: bytes, msg_id: str) -> None:
    nc = await nats.connect(url.split(","))
    try:
        js = nc.jetstream()
        await fleet_mod.ensure_summaries(js, 3)
        await fleet_mod.publish(js, subject, body, {"Nats-Msg-Id": msg_id}, 30.0)
    finally:
        await nc.close()


def _ahead(windows: Iterator[sim.SimWindow]) -> Iterator[sim.SimWindow]:
    """``windows`` made one ahead on a thread: the simulator (2 s of CPU a window at 256 hosts)
    runs while the previous window's batches are published, stored and judged."""
    with ThreadPoolExecutor(1) as pool:
        nxt = pool.submit(next, windows, None)
        while (w := nxt.result()) is not None:
            nxt = pool.submit(next, windows, None)
            yield w


def _start_shard(tmp: Path, url: str, inventory: Path, i: int) -> procs.CollectorProcess:
    d = tmp / f"shard{i}"
    d.mkdir(exist_ok=True)  # a restarted shard opens its own file again
    args = ["--nats", url, "--shard", f"{i}/{SHARDS}", "--insecure-no-auth",
            "--parquet-dir", str(tmp / "parquet")]  # fmt: skip
    return procs.start_collector(d / "shard.duckdb", inventory, args, log=d / "shard.log")


def _start_shards(tmp: Path, url: str, inventory: Path) -> list[procs.CollectorProcess]:
    """Every shard at once: each start is a process's imports and a health check (~2.5 s
    here) that the others overlap. A shard that fails to start stops the ones that did."""
    with ThreadPoolExecutor(SHARDS) as pool:
        started = [pool.submit(_start_shard, tmp, url, inventory, i) for i in range(SHARDS)]
    if any(f.exception() for f in started):
        for f in started:
            if f.exception() is None:
                f.result().stop()
    return [f.result() for f in started]


def _after(delay_s: float, start: Callable[[], procs.CollectorProcess]) -> procs.CollectorProcess:
    time.sleep(delay_s)
    return start()


def test_fleet_tier_equals_one_collector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The rounds run at explicit times after each simulated window; the arrival times the
    # writers' commit hooks note are on the same clock (windows arrive 0.5 s after their end).
    clock = [0]
    monkeypatch.setattr(rounds, "time", SimpleNamespace(time_ns=lambda: clock[0]))
    # Both take a host's delays as soon as its clock is synced (the agents' 4 s to fetch the
    # model is not what is compared): the delay fault shows within the run.
    monkeypatch.setattr(clockgate, "CLOCK_ADOPTION_NS", 0)
    spec = "leafspine:hosts=256,nics=2,leaves=8,spines=4"
    topo = from_spec(spec)
    inventory = tmp_path / "topology.json"
    topo.save(inventory)
    epoch = (time.time_ns() // 10**9 - 120) * 10**9  # recent past: not "from the future"
    cfg = sim.SimConfig(
        paths_known=True,
        faults=(f"{LOSS}:loss=0.05:start_s=1", f"{DELAY}:delay_us=20:start_s={DELAY_S}"),
        epoch_ns=epoch,
    )
    part = Partitions(topo)
    one = Collector(_settings(tmp_path / "one.duckdb", inventory))
    fleet = fleet_mod.FleetCollector(
        _settings(tmp_path / "fleet.duckdb", inventory), parquet=[tmp_path / "parquet"]
    )
    with fixture.NatsCluster(tmp_path / "nats") as nc:
        shards = _start_shards(tmp_path, nc.url, inventory)
        agents = Publisher(nc.url)
        consumer = fleet_mod.SummaryConsumer(fleet, nc.url, replicas=3)
        one.start(loops=False)
        fleet.start(loops=False)
        consumer.start()
        publishers = ThreadPoolExecutor(PUBLISHERS)
        # Shard 1 comes back DOWN_S after its kill while the stream goes on (the windows
        # after the kill are stored by the others meanwhile), and before shard 2's pause:
        # one shard is out at a time.
        outage = ThreadPoolExecutor(1)
        restarted: Future[procs.CollectorProcess] | None = None
        try:
            # hostile: garbage, and a summary whose rows are another host's (forged)
            asyncio.run(_publish_raw(nc.url, fleet_mod.subject("leaf0"), b"garbage", "g1"))
            batches = 0
            for w in _ahead(sim.Simulator(topo, cfg, seed=7).stream(ROUNDS)):
                if w.index == PAUSE_AT:
                    assert restarted is not None
                    shards[1] = restarted.result()
                window = w.windows.select(WINDOW_SCHEMA.names)
                end = pc.max(window["start_ns"]).as_py() + 10**9
                clock[0] = end + ARRIVAL_NS
                if w.index == 0:
                    h, rows = next(host_batches(window))
                    forged = summaries.of_batch(part.of(h), Batch("forged", "h9999", rows))
                    [(_, body)] = summaries.encode([forged])
                    asyncio.run(_publish_raw(nc.url, fleet_mod.subject(part.of(h)), body, "f1"))
                futures, acks, last = [], [], []
                for h, rows in host_batches(window):  # as the agents send them, to both
                    b = Batch(f"sim-{w.index}-{h}", h, rows)
                    futures.append(one.submit(b))
                    body, ctype = encode_batch(h, rows, b.batch_id)
                    acks.append(
                        publishers.submit(agents.publish, part.of(h), b.batch_id, body, ctype)
                    )
                    last.append(b)
                    batches += 1
                assert all(f.result(timeout=60) for f in futures)
                assert all(f.result(timeout=60) for f in acks)  # each one new
                if w.index == KILL_AT:  # mid-stream: its group in flight is never acknowledged
                    shards[1].stop(signal.SIGKILL)
                    restart = partial(_start_shard, tmp_path, nc.url, inventory, 1)
                    restarted = outage.submit(_after, DOWN_S, restart)
                if w.index == PAUSE_AT:
                    shards[2].proc.send_signal(signal.SIGSTOP)
                    resume = time.monotonic() + PAUSE_S
                _wait(lambda n=batches: _stored(fleet) >= n)  # the others took over
                time.sleep(0.2)  # the commit hook's last steps (arrivals) after the count
                now = end + SETTLED_NS
                one.run_round(now)
                fleet.run_round(now)
                assert one.published.verdicts == fleet.published.verdicts
                assert one.published.decisions == fleet.published.decisions
                middle = pc.max(window["start_ns"]).as_py() + 10**9 // 2  # the solved window
                worst = same_clocks(
                    list(one.published.clocks.values()), list(fleet.published.clocks.values()),
                    middle, CLOCK_NS,
                )  # fmt: skip
                print(f"window {w.index}: clock models {worst:.2f} ns apart")
                if w.index == PAUSE_AT:  # the round above did not need it: judged meanwhile
                    time.sleep(max(0.0, resume - time.monotonic()))
                    shards[2].proc.send_signal(signal.SIGCONT)
            # republished after a "restart", grouped anew: dropped (the tier's batch ids)
            again = fleet_mod.SummaryPublisher(nc.url, f"0/{SHARDS}")
            again.committed(part.of(last[0].host_id), last[:8])
            again.close()
            time.sleep(1.0)
            assert _stored(fleet) == batches
            assert _total(fleet.metrics.rejected) == 2  # the garbage and the forged one
            # every summary stored and counted once (not the republished ones), from the shards
            # that own partitions (4 pods here: the hash may leave a shard without one)
            published = [fleet.summaries.labels(f"{i}/{SHARDS}")._value.get() for i in range(3)]
            assert sum(published) == batches and sum(map(bool, published)) >= 2, published
            # Each writes every minute it touched as it stops (side by side: ~1 s each).
            # uvicorn raises the signal again once it shut down: -SIGTERM, not a SIGKILL.
            with ThreadPoolExecutor(SHARDS) as pool:
                assert list(pool.map(procs.CollectorProcess.stop, shards)) == [-signal.SIGTERM] * 3
            _same_flow_totals(one, fleet, epoch, clock[0])
        finally:
            if restarted is not None and restarted.exception() is None:
                shards[1] = restarted.result()  # a shard restarted as the test failed: stopped
            outage.shutdown()
            publishers.shutdown()
            consumer.stop()
            agents.close()
            for shard in shards:
                shard.stop()
            one.stop()
            fleet.stop()
    bad = {s for s, v in fleet.published.verdicts.items() if v.state == "faulty"}
    assert LOSS in bad and DELAY in bad, bad
    assert sum(c.synced for c in fleet.published.clocks.values()) >= 0.9 * len(topo.hosts)
    print(f"clock models: largest difference {worst:.2f} ns")


def _same_flow_totals(one: Collector, fleet: Collector, since_ns: int, until_ns: int) -> None:
    """``/v1/flows``'s totals over the run: the tier's from the shards' Parquet files, the
    single collector's from its DuckDB file; flow by flow the same windows and counts."""
    cols = ["src_nic", "dst_nic", "sport", "windows", "sent", "received", "owd_min_ns"]
    a = one.store.flow_totals(since_ns, until_ns).select(cols)
    b = fleet.store.flow_totals(since_ns, until_ns).select(cols)
    assert a.num_rows > 0
    if not a.equals(b):  # the flows that differ, both sides
        diff = a.join(b, cols[:3], right_suffix="_tier", join_type="full outer").to_pylist()
        bad = [r for r in diff if any(r[c] != r.get(c + "_tier") for c in cols[3:])]
        raise AssertionError(f"{len(bad)} of {a.num_rows} flows' totals differ: {bad[:5]}")


def _total(counter) -> float:
    """A labelled counter's sum over its labels."""
    return sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total"))
