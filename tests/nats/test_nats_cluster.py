"""The 3-node JetStream fixture: the cluster forms, an R3 stream survives a node's kill -9."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fleetlens.fixtures.nats import NatsCluster
from nats_helpers import ELECTION_WAIT_S

nats = pytest.importorskip("nats")
from nats.js.api import StreamConfig  # noqa: E402


async def _publish(url: str, subject: str, n: int, start: int) -> None:
    nc = await nats.connect(url.split(","))
    js = nc.jetstream()
    for i in range(start, start + n):
        deadline = time.monotonic() + ELECTION_WAIT_S  # the stream electing its leader
        while True:
            try:
                await js.publish(subject, str(i).encode(), headers={"Nats-Msg-Id": f"m{i}"})
                break
            except (nats.js.errors.NoStreamResponseError, nats.errors.TimeoutError) as e:
                if time.monotonic() > deadline:
                    raise AssertionError(f"m{i} never stored: {e}") from e
                await asyncio.sleep(0.1)
    await nc.close()


async def _ping(url: str) -> None:
    nc = await nats.connect(url.split(","))
    await nc.publish("x", b"1")
    await nc.flush()
    await nc.close()


async def _read_all(url: str, stream: str) -> list[bytes]:
    nc = await nats.connect(url.split(","))
    js = nc.jetstream()
    info = await js.stream_info(stream)
    out = [(await js.get_msg(stream, seq)).data or b"" for seq in
           range(info.state.first_seq, info.state.last_seq + 1)]  # fmt: skip
    await nc.close()
    return out


@pytest.mark.serial  # kill -9 of a node; the re-election is waited on against a deadline
def test_r3_stream_survives_a_node_kill(tmp_path: Path) -> None:
    with NatsCluster(tmp_path) as nc:
        assert len(nc.urls) == 3 and all(p is not None for p in nc.procs)

        async def setup() -> None:
            c = await nats.connect(nc.urls)
            await c.jetstream().add_stream(StreamConfig(name="T", subjects=["t.>"], num_replicas=3))
            await c.close()

        asyncio.run(setup())
        asyncio.run(_publish(nc.url, "t.a", 50, 0))
        nc.kill(0)  # whichever node led the stream, a quorum of 2 remains
        asyncio.run(_publish(nc.url, "t.a", 50, 50))
        asyncio.run(_publish(nc.url, "t.a", 10, 90))  # retries of ids already stored: dropped
        nc.start(0)
        nc.wait_ready([0])
        got = asyncio.run(_read_all(nc.url, "T"))
        assert [int(b) for b in got] == list(range(100))
    assert all(p is None for p in nc.procs)


def _shell(*args: str) -> str:
    cmd = [sys.executable, "-m", "fleetlens.fixtures.nats", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60).stdout


def test_shell_up_and_down(tmp_path: Path) -> None:
    url = _shell("up", str(tmp_path)).strip()
    pids = json.loads((tmp_path / "cluster.json").read_text())["pids"]
    try:
        assert len(url.split(",")) == 3
        asyncio.run(_ping(url))
    finally:
        _shell("down", str(tmp_path))
    assert not (tmp_path / "cluster.json").exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_port_taken_before_the_server_binds_it_moves_the_cluster(tmp_path: Path) -> None:
    """free_port's pick is free when chosen, not when the server binds it: a node that finds
    it taken sends the whole cluster to new ports, and it still forms."""
    cluster = NatsCluster(tmp_path)
    held = socket.socket()
    held.bind((cluster.host, cluster.ports[1][1]))  # node 1's route port, taken meanwhile
    held.listen()
    first = list(cluster.ports)
    try:
        with cluster:
            assert cluster.ports != first
            asyncio.run(_ping(cluster.url))
    finally:
        held.close()
    assert "address already in use" in cluster.log(1).read_text()
