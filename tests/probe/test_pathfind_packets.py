"""The traceroute packets path discovery sends, and the answers it accepts (the lab tests
check the whole round trip against the kernel's own paths)."""

from __future__ import annotations

import socket
import struct

import pytest
from fleetlens.probe.pathfind import ICMP_TIME_EXCEEDED, Trace, parse_time_exceeded, probe_packet

TRACE = Trace(7, "10.0.0.1", "eth0", "10.0.4.9", "h05/eth0", 40007)
DPORT = 9470


def _ones_sum(data: bytes) -> int:
    data += b"\0" * (len(data) % 2)
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def _answer(quoted: bytes, icmp_type: int = ICMP_TIME_EXCEEDED, router: str = "10.0.0.0") -> bytes:
    outer = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + 8 + len(quoted), 1, 0, 64, socket.IPPROTO_ICMP, 0,
        socket.inet_aton(router), socket.inet_aton(TRACE.src_ip),
    )  # fmt: skip
    return outer + struct.pack("!BBHI", icmp_type, 0, 0, 0) + quoted


def test_the_probe_carries_the_flows_5_tuple_and_the_ttl_in_ttl_and_id() -> None:
    pkt = probe_packet(TRACE, DPORT, ttl=3)
    ver_ihl, _, _, ip_id, frag, ttl, proto, _, src, dst = struct.unpack_from("!BBHHHBBH4s4s", pkt)
    assert (ver_ihl, ip_id, frag, ttl, proto) == (0x45, 3, 0, 3, socket.IPPROTO_UDP)
    assert (socket.inet_ntoa(src), socket.inet_ntoa(dst)) == (TRACE.src_ip, TRACE.dst_ip)
    sport, dport, length, _ = struct.unpack_from("!HHHH", pkt, 20)
    assert (sport, dport, length) == (TRACE.sport, DPORT, len(pkt) - 20)
    pseudo = src + dst + struct.pack("!BBH", 0, socket.IPPROTO_UDP, length)
    assert _ones_sum(pseudo + pkt[20:]) == 0xFFFF  # a valid UDP checksum


def test_an_answer_gives_the_router_and_the_quoted_flow() -> None:
    quoted = probe_packet(TRACE, DPORT, ttl=2)[:28]  # routers quote the IP header + 8 bytes
    got = parse_time_exceeded(_answer(quoted, router="10.0.8.3"))
    assert got == ("10.0.8.3", TRACE.src_ip, TRACE.dst_ip, 2, TRACE.sport)


@pytest.mark.parametrize(
    "packet",
    [
        b"",
        b"\x45" * 19,
        _answer(probe_packet(TRACE, DPORT, ttl=2)[:28], icmp_type=3),  # unreachable, not TTL
        _answer(probe_packet(TRACE, DPORT, ttl=2)[:21]),  # truncated quote
        _answer(
            probe_packet(TRACE, DPORT, ttl=2)[:9]
            + bytes([6])
            + probe_packet(TRACE, DPORT, 2)[10:28]
        ),
        b"\x60" + bytes(60),  # not IPv4
    ],
    ids=["empty", "short", "unreachable", "truncated", "tcp", "ipv6"],
)
def test_anything_else_is_ignored(packet: bytes) -> None:
    assert parse_time_exceeded(packet) is None
