"""Engines on loopback addresses: two "hosts" in one process, each on its own thread."""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
from fleetlens.probe.fastpath import Engine
from fleetlens.probe.nics import LocalNic, probe_socket

KEY = bytes(range(16))
DPORT = 9470
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: SO_BINDTODEVICE on probe sockets"
)


@dataclass
class Host:
    ip: str
    engine: Engine
    sockets: list[socket.socket] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)

    def close(self) -> None:
        for s in self.sockets:
            s.close()


def make_host(
    ip: str, first_port: int, nports: int, key: bytes = KEY, primer: bool = False
) -> Host:
    nic = LocalNic("lo", ip, True)
    eng = Engine(key, int.from_bytes(os.urandom(7), "big"))
    socks = [probe_socket(nic, DPORT, 0)] + [
        probe_socket(nic, first_port + i, 0) for i in range(nports)
    ]
    eng.add_nic(socks[0].fileno(), [s.fileno() for s in socks[1:]], False, primer)
    eng.set_timeouts(300_000_000, 2_000_000)
    return Host(ip, eng, socks, list(range(first_port, first_port + nports)))


def aim(src: Host, dst: Host | str, nports: int) -> None:
    ip = dst if isinstance(dst, str) else dst.ip
    src.engine.set_plan(
        DPORT,
        np.array([0], np.int32),
        np.array([int(ipaddress.IPv4Address(ip))], np.uint32),
        np.array([nports], np.int32),
        np.array([0], np.int32),
    )


def run_rounds(
    hosts: list[Host], rounds: int, period_ns: int = 10_000_000, linger_ns: int = 400_000_000
) -> None:
    """Every host runs its rounds on its own thread (the engine releases the GIL)."""

    def loop(h: Host) -> None:
        deadline = time.monotonic_ns() + period_ns
        for r in range(rounds):
            h.engine.run_round(r, deadline)
            deadline += period_ns
        h.engine.serve_until(time.monotonic_ns() + linger_ns)

    threads = [threading.Thread(target=loop, args=(h,)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
