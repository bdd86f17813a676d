"""Probe agent data path: the Cython fast path against a pure-Python implementation.

Run as root (probe sockets bind to a device): ``.venv/bin/python bench/probe_bench.py``.

1. Throughput: two "hosts" on loopback addresses, one probing the other as fast as it can,
   the other answering. Figure: timestamped packets handled (probes and acks, sent and
   received) per CPU-second of the process, user + sys, kernel work included. The baseline is
   the same protocol (wire format, SipHash MAC, SO_TIMESTAMPING, error-queue TX stamps) written
   with socket.sendmsg/recvmsg in plain Python, run in the same command. Target: >= 5x.
2. Host load: two processes, each an agent with 8 NICs probing 8 peer NICs of the other every
   10 ms (≈ 38 k packets/s in and out per host, acks included); CPU of one host in % of one
   core. Target: < 25 %. Run twice in the same command: without primers, then with a primer
   before each pair, as the agent sends on NICs with software timestamps (``--primer auto``);
   the packet rate counts probes and acks, not primers.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import multiprocessing as mp
import os
import resource
import socket
import struct
import sys
import threading
import time

import numpy as np
from fleetlens.probe import protocol as wire
from fleetlens.probe.fastpath import Engine
from fleetlens.probe.nics import SO_TIMESTAMPING, LocalNic, probe_socket

KEY = bytes(range(16))
DPORT = 9470


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def engine_host(
    ips: list[str], first_port: int, nports: int, primer: bool = False
) -> tuple[Engine, list[socket.socket]]:
    eng = Engine(KEY, int.from_bytes(os.urandom(7), "big"))
    socks = []
    for i, ip in enumerate(ips):
        nic = LocalNic("lo", ip, True)
        mine = [probe_socket(nic, DPORT, 0)] + [
            probe_socket(nic, first_port + i * 100 + k, 0) for k in range(nports)
        ]
        socks += mine
        eng.add_nic(mine[0].fileno(), [s.fileno() for s in mine[1:]], False, primer)
    return eng, socks


def aim(eng: Engine, nic_of_entry: list[int], dst_ips: list[str], nports: int) -> None:
    n = len(dst_ips)
    eng.set_plan(
        DPORT,
        np.array(nic_of_entry, np.int32),
        np.array([int(ipaddress.IPv4Address(ip)) for ip in dst_ips], np.uint32),
        np.full(n, nports, np.int32),
        (np.arange(n) * nports).astype(np.int32),
    )


def packets(c: dict[str, int]) -> int:
    return c["packets_sent"] + c["probes_received"] + c["acks_sent"] + c["acks_received"]


# ---- 1. throughput: fast path -------------------------------------------------------------
def fast_throughput(seconds: float) -> float:
    a, sa = engine_host(["127.0.2.1"], 46000, 8)
    b, sb = engine_host(["127.0.2.2"], 47000, 8)
    aim(a, [0] * 32, ["127.0.2.2"] * 32, 8)
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            b.serve_until(time.monotonic_ns() + 20_000_000)

    t = threading.Thread(target=answer)
    t.start()
    c0, end, r = cpu_s(), time.monotonic() + seconds, 0
    while time.monotonic() < end:
        a.run_round(r, time.monotonic_ns() + 200_000)  # 32 pairs, then 0.2 ms of arrivals
        r += 1
    a.serve_until(time.monotonic_ns() + 50_000_000)
    stop.set()
    t.join()
    used = cpu_s() - c0
    n = packets(a.counters()) + packets(b.counters())
    for s in sa + sb:
        s.close()
    return n / used


# ---- 1. throughput: pure Python -----------------------------------------------------------
SOF = 2 | 8 | 16 | 128 | 2048  # TX/RX software, software, OPT_ID, OPT_TSONLY


def _py_socket(ip: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, SOF)
    s.bind((ip, port))
    s.setblocking(False)
    return s


def _stamp(anc: list[tuple[int, int, bytes]]) -> int:
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING:
            sec, nsec = struct.unpack_from("qq", data)
            return sec * 1_000_000_000 + nsec
    return 0


def python_throughput(seconds: float) -> float:
    """The same protocol, one sendmsg/recvmsg per packet, parsing and MAC in Python."""
    tx = _py_socket("127.0.2.3", 48000)
    rx = _py_socket("127.0.2.4", DPORT)
    session, pair, handled = 7, 0, 0
    pending: dict[int, list[int]] = {}
    c0, end = cpu_s(), time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(32):
            for kind in (wire.KIND_PROBE0, wire.KIND_PROBE1):
                tx.sendmsg(
                    [wire.encode(wire.Packet(kind, session, pair, time.time_ns()), KEY)],
                    [],
                    0,
                    ("127.0.2.4", DPORT),
                )
                handled += 1
            pending[pair] = []
            pair += 1
        handled += _py_answer(rx) + _py_collect(tx, pending)
    used = cpu_s() - c0
    tx.close()
    rx.close()
    return handled / used


def _py_answer(rx: socket.socket) -> int:
    n, first = 0, {}
    while True:
        try:
            data, anc, _, src = rx.recvmsg(512, 256)
        except BlockingIOError:
            return n
        n += 1
        try:
            p = wire.decode(data, KEY)
        except wire.WireError:
            continue
        if p.kind == wire.KIND_PROBE0:
            first[p.pair] = _stamp(anc)
            continue
        rec = wire.Record(p.pair, 3, first.pop(p.pair, 0), _stamp(anc), 0, 0)
        rx.sendmsg(
            [wire.encode(wire.Packet(wire.KIND_ACK, p.session, p.pair, 0, (rec,)), KEY)], [], 0, src
        )
        n += 1


def _py_collect(tx: socket.socket, pending: dict[int, list[int]]) -> int:
    n = 0
    while True:  # TX timestamps from the error queue
        try:
            _, anc, _, _ = tx.recvmsg(512, 256, socket.MSG_ERRQUEUE)
        except BlockingIOError:
            break
        _stamp(anc)
    while True:
        try:
            data, _, _, _ = tx.recvmsg(512, 256)
        except BlockingIOError:
            return n
        n += 1
        with contextlib.suppress(wire.WireError):
            pending.pop(wire.decode(data, KEY).pair, None)


# ---- 2. host load -------------------------------------------------------------------------
def load_host(me: int, seconds: float, primer: bool, out: mp.Queue) -> None:  # type: ignore[type-arg]
    mine = [f"127.0.{3 + me}.{i + 1}" for i in range(8)]
    peers = [f"127.0.{4 - me}.{i + 1}" for i in range(8)]
    eng, socks = engine_host(mine, 50000 + me * 1000, 8, primer)
    aim(eng, [n for n in range(8) for _ in range(8)], [p for _ in range(8) for p in peers], 8)
    time.sleep(0.5)  # both hosts up before the clock starts
    c0, t0 = cpu_s(), time.monotonic()
    deadline, r = time.monotonic_ns() + 10_000_000, 0
    while time.monotonic() - t0 < seconds:
        eng.run_round(r, deadline)
        r += 1
        deadline += 10_000_000
        if r % 10 == 0:
            eng.take_samples()  # what the agent does: keep the sample buffers small
    used, wall = cpu_s() - c0, time.monotonic() - t0
    out.put((me, packets(eng.counters()) / wall, 100 * used / wall, eng.counters()["late_rounds"]))
    for s in socks:
        s.close()


def host_load(seconds: float, primer: bool) -> list[tuple[int, float, float, int]]:
    q: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    procs = [mp.Process(target=load_host, args=(i, seconds, primer, q)) for i in (0, 1)]
    for p in procs:
        p.start()
    res = sorted(q.get(timeout=seconds + 60) for _ in procs)
    for p in procs:
        p.join()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=3.0, help="per throughput run")
    ap.add_argument("--load-seconds", type=float, default=10.0)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (SO_BINDTODEVICE)", file=sys.stderr)
        return 2
    fast = fast_throughput(a.seconds)
    slow = python_throughput(a.seconds)
    print(f"fast path (Cython):  {fast:12,.0f} timestamped packets per CPU-second")
    print(f"pure Python:         {slow:12,.0f} timestamped packets per CPU-second")
    print(f"ratio:               {fast / slow:12.1f}x   (target >= 5x)")
    cpu_of = {}
    for primer in (False, True):
        for me, pps, cpu, late in host_load(a.load_seconds, primer):
            cpu_of.setdefault(primer, []).append(cpu)
            print(f"host {me}: 8 NICs x 8 peers at 10 ms, {'primers' if primer else 'no primers'}: "
                  f"{pps:,.0f} packets/s in+out, {cpu:.1f}% of one core (target < 25%), "
                  f"{late} late rounds")  # fmt: skip
    ratio = np.mean(cpu_of[True]) / np.mean(cpu_of[False])
    print(f"primers cost: {ratio:.2f}x the CPU of the same load without them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
