"""Reading traceroute answers: what a busy agent's path thread must not lose.

The answers go through a datagram socket pair standing in for the raw ICMP socket, so the
real select/recv/parse code runs on real "time exceeded" packets built with scapy."""

from __future__ import annotations

import socket
import time

from fleetlens.probe.pathfind import ICMP_TIME_EXCEEDED, PathFinder
from scapy.layers.inet import ICMP, IP, UDP

SRC, DST, SPORT, DPORT = "10.0.0.1", "10.0.4.1", 40000, 9470


def _answer(router: str, sport: int, ttl: int) -> bytes:
    quoted = IP(src=SRC, dst=DST, ttl=1, id=ttl) / UDP(sport=sport, dport=DPORT) / b"fleetlens"
    return bytes(IP(src=router, dst=SRC) / ICMP(type=ICMP_TIME_EXCEEDED, code=0) / quoted)


def test_answers_queued_before_a_late_wakeup_are_still_read() -> None:
    """The thread gets the GIL back only after its deadline: what already came is kept."""
    rx, tx = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with rx, tx:
        ident = {(SRC, DST, SPORT + i): i for i in range(3)}
        for i in range(3):
            tx.send(_answer("172.16.0.3", SPORT + i, ttl=2))
        answers: dict[int, str] = {}
        PathFinder._collect(rx, ident, 2, answers, deadline=time.monotonic() - 1.0)
    assert answers == {0: "172.16.0.3", 1: "172.16.0.3", 2: "172.16.0.3"}


def test_answers_to_another_round_or_flow_are_not_taken() -> None:
    rx, tx = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with rx, tx:
        ident = {(SRC, DST, SPORT): 0, (SRC, DST, SPORT + 1): 1}
        tx.send(_answer("10.0.0.0", SPORT, ttl=1))  # a late answer to the round before
        tx.send(_answer("172.16.0.3", SPORT + 7, ttl=2))  # a flow this round did not trace
        tx.send(_answer("172.16.0.5", SPORT + 1, ttl=2))
        answers: dict[int, str] = {}
        PathFinder._collect(rx, ident, 2, answers, deadline=time.monotonic() + 0.05)
    assert answers == {1: "172.16.0.5"}


def test_stray_icmp_past_the_deadline_cannot_hold_the_reader() -> None:
    rx, tx = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    with rx, tx:
        ident = {(SRC, DST, SPORT): 0}
        for _ in range(50):  # answers to nobody's traceroute, all queued
            tx.send(_answer("172.16.0.3", SPORT + 9, ttl=2))
        answers: dict[int, str] = {}
        PathFinder._collect(rx, ident, 2, answers, deadline=time.monotonic() - 1.0)
        left = 0
        rx.setblocking(False)
        while True:
            try:
                rx.recv(2048)
            except BlockingIOError:
                break
            left += 1
    assert answers == {}
    assert left == 50 - 4  # the late reads stop after 4 per traced flow
