"""Path discovery: Paris traceroute of every flow (fixed 5-tuple, rising TTL).

ECMP hashes the 5-tuple, so a traceroute with exactly the flow's addresses and ports follows
the flow. Round *k* sends TTL *k* for every flow still unfinished; each router answers
"time exceeded" from the interface the probe came in on, and the inventory's interface map
turns that address into the link it arrived by. A flow is done when the answer comes from its
destination's leaf (known from the same map), so no traceroute packet ever reaches a peer's
probe port. Packets are built and parsed with scapy and sent through a raw socket, so the
kernel's source-address routing picks the right NIC.
"""

from __future__ import annotations

import logging
import math
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetlens.ids import is_nic_id, link_id, split_link_id

log = logging.getLogger("fleetlens.agent.paths")
ICMP_TIME_EXCEEDED = 11
_PAYLOAD = b"fleetlens-path"
# Switches police the ICMP their CPU sends: ask in small bursts.
BURST, BURST_GAP_S = 32, 0.01
RETRY_S = 0.5  # unanswered traceroutes are first asked again this soon, then ever less often
RCVBUF_BYTES = 1 << 20  # the kernel caps it at net.core.rmem_max: draining per burst matters more


@dataclass(frozen=True)
class Trace:
    flow: int
    src_ip: str
    ifname: str
    dst_ip: str
    dst_nic: str
    sport: int


class PathSchedule:
    """Which flows to trace next, and when.

    Every flow on a refresh or when woken (a route change, a rebuilt data path); in between
    only the flows whose traceroute went unanswered (a busy switch CPU), first after
    ``RETRY_S``, then twice as long each time they stay unanswered (a black hole), up to the
    refresh. Flows are known by identity, not id: ids change when the data path is rebuilt.
    A pass calls :meth:`todo`, :meth:`learned`, :meth:`wait_s` and :meth:`woken`, in that order.
    """

    def __init__(self, refresh_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.refresh_s, self.clock = refresh_s, clock
        self.known: set[tuple[str, str, int]] = set()
        self.retry_s = RETRY_S
        self.everything, self.last_full = True, -math.inf
        self.full = self.missing = False  # this pass traced every flow; some still lack a path

    def todo(self, traces: list[Trace]) -> list[Trace]:
        self.full = self.everything or self.clock() - self.last_full >= self.refresh_s
        if self.full:
            self.last_full = self.clock()
            return traces
        return [t for t in traces if _identity(t) not in self.known]

    def learned(self, todo: list[Trace], found: dict[int, list[str]]) -> None:
        answered = {_identity(t) for t in todo if t.flow in found}
        self.known = answered if self.full else self.known | answered  # full: asked anew

    def wait_s(self, traces: list[Trace]) -> float:
        self.missing = any(_identity(t) not in self.known for t in traces)
        return min(self.retry_s, self.refresh_s) if self.missing else self.refresh_s

    def woken(self, woke: bool) -> None:
        self.everything = woke or not self.missing
        self.retry_s = RETRY_S if self.everything else 2 * self.retry_s


class _RawSenders:
    """One raw socket per NIC for a round, bound to its device and address (the route
    lookup uses the socket's source, not the header's). A socket per packet cost four
    system calls, each giving up the GIL that a busy probe loop is slow to hand back."""

    def __init__(self) -> None:
        self.socks: dict[tuple[str, str], socket.socket] = {}

    def __enter__(self) -> _RawSenders:
        return self

    def __exit__(self, *_: object) -> None:
        for s in self.socks.values():
            s.close()

    def send(self, t: Trace, packet: bytes) -> None:
        try:
            sock = self.socks.get((t.ifname, t.src_ip))
            if sock is None:
                sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
                self.socks[(t.ifname, t.src_ip)] = sock
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, t.ifname.encode())
                sock.bind((t.src_ip, 0))
            sock.sendto(packet, (t.dst_ip, 0))
        except OSError as e:  # a NIC that is down or gone: no path this round
            log.debug("traceroute %s->%s: %s", t.src_ip, t.dst_ip, e)


def _identity(t: Trace) -> tuple[str, str, int]:
    return t.src_ip, t.dst_nic, t.sport


class PathFinder:
    def __init__(
        self, interfaces: dict[str, str], dport: int, max_ttl: int = 8, timeout_s: float = 0.5
    ):
        self.interfaces = interfaces
        self.dport = dport
        self.max_ttl = max_ttl
        self.timeout_s = timeout_s
        # A NIC's leaf: the access link NIC->leaf arrives at the leaf's side of its /31.
        self.leaf_of = {
            a: b for a, b in (split_link_id(lk) for lk in interfaces.values()) if is_nic_id(a)
        }

    def discover(self, traces: list[Trace]) -> dict[int, list[str]]:
        """Flow id -> ordered directed links, for every flow whose path could be resolved."""
        if not self.interfaces:
            return {}
        hops: dict[int, list[str]] = {t.flow: [] for t in traces}
        pending = {t.flow: t for t in traces if t.dst_nic in self.leaf_of}
        with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as icmp:
            icmp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
            for ttl in range(1, self.max_ttl + 1):
                if not pending:
                    break
                answers = self._round(icmp, list(pending.values()), ttl)
                for flow, trace in list(pending.items()):
                    link = self.interfaces.get(answers.get(flow, ""))
                    if link is None:  # no answer, or an address not in the inventory
                        del pending[flow]
                        continue
                    hops[flow].append(link)
                    if split_link_id(link)[1] == self.leaf_of[trace.dst_nic]:
                        hops[flow].append(link_id(self.leaf_of[trace.dst_nic], trace.dst_nic))
                        del pending[flow]
        by_flow = {t.flow: t for t in traces}
        return {
            f: h for f, h in hops.items() if h and split_link_id(h[-1])[1] == by_flow[f].dst_nic
        }

    def _round(self, icmp: socket.socket, traces: list[Trace], ttl: int) -> dict[int, str]:
        """Send TTL ``ttl`` for every trace; flow id -> address that answered."""
        # Imported here: scapy takes seconds to import on a busy host, and the agent must
        # start probing (and its clock converge) without waiting for path discovery.
        from scapy.layers.inet import IP, UDP

        ident = {(t.src_ip, t.dst_ip, t.sport): t.flow for t in traces}
        answers: dict[int, str] = {}
        with _RawSenders() as raw:
            for i, t in enumerate(traces):
                if i and i % BURST == 0:
                    # Read the answers between bursts rather than sleep: a whole round's
                    # replies queued at once overflowed the socket buffer on a busy host.
                    self._collect(icmp, ident, ttl, answers, time.monotonic() + BURST_GAP_S)
                pkt = (
                    IP(src=t.src_ip, dst=t.dst_ip, ttl=ttl, id=ttl)
                    / UDP(sport=t.sport, dport=self.dport)
                    / _PAYLOAD
                )
                raw.send(t, bytes(pkt))
        self._collect(icmp, ident, ttl, answers, time.monotonic() + self.timeout_s)
        return answers

    @staticmethod
    def _collect(
        icmp: socket.socket,
        ident: dict[tuple[str, str, int], int],
        ttl: int,
        answers: dict[int, str],
        deadline: float,
    ) -> None:
        """Read "time exceeded" answers into ``answers`` until all came or ``deadline``.

        Answers already queued are read even after the deadline: on a busy host this thread
        can wait longer than a whole round for the GIL (the probe loop holds it), and its
        answers then sit in the socket; dropping them lost most paths on every pass."""
        from scapy.layers.inet import ICMP, IP, UDPerror

        late = 0  # reads past the deadline, bounded so that stray ICMP cannot hold us
        while len(answers) < len(ident) and late < 4 * len(ident):
            left = max(0.0, deadline - time.monotonic())
            late += left == 0.0
            if not select.select([icmp], [], [], left)[0]:
                return
            reply = IP(icmp.recv(2048))
            if ICMP not in reply or reply[ICMP].type != ICMP_TIME_EXCEEDED or UDPerror not in reply:
                continue
            quoted = reply[ICMP].payload
            key = (quoted.src, quoted.dst, reply[UDPerror].sport)
            if key in ident and quoted.id == ttl:
                answers[ident[key]] = reply.src
