"""The fast path on loopback: wire compatibility, timestamps, clocks, loss accounting."""

from __future__ import annotations

import socket
import time

import numpy as np
from engine_helpers import DPORT, KEY, Host, aim, make_host, needs_root, run_rounds
from fleetlens.probe import protocol as wire
from fleetlens.probe.fastpath import (
    FLAG_ACKED,
    FLAG_RX0,
    FLAG_RX1,
    FLAG_SENT0,
    FLAG_SENT1,
    FLAG_TX0,
    FLAG_TX1,
)

pytestmark = needs_root
ALL = FLAG_SENT0 | FLAG_SENT1 | FLAG_TX0 | FLAG_TX1 | FLAG_RX0 | FLAG_RX1 | FLAG_ACKED


def test_pairs_complete_with_kernel_timestamps_both_ways(pair_of_hosts: tuple[Host, Host]) -> None:
    a, b = pair_of_hosts
    aim(a, b, 4)
    aim(b, a, 4)
    run_rounds([a, b], 50)
    for h in (a, b):
        s = h.engine.take_samples()
        assert s["flow"].size == 50
        assert np.all(s["flags"] == ALL), np.unique(s["flags"])
        assert set(s["flow"].tolist()) == {0, 1, 2, 3}  # rotated over all four source ports
        owd = s["rx0"] - s["tx0"]
        assert np.all(owd > 0) and np.median(owd) < 1_000_000  # loopback: well under 1 ms
        assert np.all(s["tx1"] >= s["tx0"])
        c = h.engine.counters()
        assert c["pairs_sent"] == 50 and c["packets_sent"] == 100 and c["tx_timestamps"] == 100
        assert c["acks_sent"] == 50 and c["acks_received"] == 50 and c["pairs_expired"] == 0


def test_python_codec_and_fast_path_accept_each_others_packets(
    pair_of_hosts: tuple[Host, Host],
) -> None:
    _, b = pair_of_hosts
    b.engine.set_clock_model(0, 1000.0, 0.0)  # fleet = raw - 1 µs
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.9", 0))
        s.settimeout(2)
        for kind in (wire.KIND_PROBE0, wire.KIND_PROBE1):
            s.sendto(wire.encode(wire.Packet(kind, 77, 5, 123), KEY), (b.ip, DPORT))
        b.engine.serve_until(time.monotonic_ns() + 50_000_000)
        ack = wire.decode(s.recv(512), KEY)  # raises on a bad MAC or layout
    rec = ack.records[0]
    assert (ack.kind, ack.session, ack.pair) == (wire.KIND_ACK, 77, 5)
    assert rec.pair == 5 and rec.flags == wire.ACK_RX0 | wire.ACK_RX1
    assert 0 < rec.rx1 - rec.rx0 < 10_000_000
    assert rec.rx0 - rec.rx0_fleet == 1000 and rec.rx1 - rec.rx1_fleet == 1000
    assert ack.records[1] == wire.Record() == ack.records[2]  # no history yet on a new flow


def test_each_flow_keeps_its_own_ack_history(pair_of_hosts: tuple[Host, Host]) -> None:
    """Senders that differ only in their address, interleaved: each ack repeats that flow's own
    previous pairs. A history index blind to the address made such flows empty each other's
    entry at every ack, and their lost acks on a lossy reverse path read as lost probes."""
    _, b = pair_of_hosts
    senders = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(8)]
    try:
        for i, s in enumerate(senders):
            # one session and source port, eight hosts differing in the last octet's high bits
            s.bind((f"127.0.1.{1 + 16 * i}", 47844))
            s.settimeout(2)
        for pair in range(3):
            for i, s in enumerate(senders):
                for kind in (wire.KIND_PROBE0, wire.KIND_PROBE1):
                    pkt = wire.Packet(kind, 99, 10 * pair + i, 1)
                    s.sendto(wire.encode(pkt, KEY), (b.ip, DPORT))
            b.engine.serve_until(time.monotonic_ns() + 20_000_000)
        acks = [[wire.decode(s.recv(512), KEY) for _ in range(3)] for s in senders]
    finally:
        for s in senders:
            s.close()
    for i, flow in enumerate(acks):
        last = flow[-1]
        assert [r.pair for r in last.records] == [20 + i, 10 + i, i], f"sender {i}"


def test_fast_path_accepts_acks_made_by_the_python_codec() -> None:
    a = make_host("127.0.0.4", 43000, 1)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        peer.bind(("127.0.0.5", DPORT))
        peer.settimeout(2)
        aim(a, "127.0.0.5", 1)
        a.engine.run_round(0, time.monotonic_ns() + 5_000_000)
        probes = [(wire.decode(d, KEY), src) for d, src in (peer.recvfrom(512) for _ in range(2))]
        (p0, src), (p1, _) = probes
        assert (p0.kind, p1.kind, p0.pair) == (wire.KIND_PROBE0, wire.KIND_PROBE1, p1.pair)
        rec = wire.Record(p0.pair, 3, 1_000, 1_500, 900, 1_400)
        peer.sendto(
            wire.encode(wire.Packet(wire.KIND_ACK, p0.session, p0.pair, 0, (rec,)), KEY), src
        )
        a.engine.serve_until(time.monotonic_ns() + 50_000_000)
        s = a.engine.take_samples()
        assert s["flags"].tolist() == [ALL]
        assert (s["rx0"][0], s["rx1"][0], s["rx0_fleet"][0], s["rx1_fleet"][0]) == (
            1_000,
            1_500,
            900,
            1_400,
        )
    finally:
        peer.close()
        a.close()


def test_a_primer_leads_each_pair_on_its_five_tuple() -> None:
    """What a primed NIC puts on the wire: primer, probe 0, probe 1 of one pair, from one
    source port, the primer valid for the Python codec too."""
    a = make_host("127.0.0.4", 43100, 2, primer=True)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        peer.bind(("127.0.0.5", DPORT))
        peer.settimeout(2)
        aim(a, "127.0.0.5", 2)
        deadline = time.monotonic_ns()
        for r in range(2):
            deadline += 5_000_000
            a.engine.run_round(r, deadline)
        got = [peer.recvfrom(512) for _ in range(6)]
    finally:
        peer.close()
        a.close()
    for r in range(2):
        (p, src), *rest = [(wire.decode(d, KEY), s) for d, s in got[3 * r : 3 * r + 3]]
        kinds = [p.kind] + [q.kind for q, _ in rest]
        assert kinds == [wire.KIND_PRIMER, wire.KIND_PROBE0, wire.KIND_PROBE1]
        assert {q.pair for q, _ in rest} == {p.pair} and {s for _, s in rest} == {src}
        assert src[1] == a.ports[r]  # the round's source port: the pair's ECMP path
    c = a.engine.counters()
    assert (c["primers_sent"], c["packets_sent"], c["pairs_sent"]) == (2, 4, 2)


def test_primed_pairs_complete_and_the_responder_drops_the_primers() -> None:
    a = make_host("127.0.0.11", 43200, 3, primer=True)
    b = make_host("127.0.0.12", 43300, 3)
    try:
        aim(a, b, 3)
        aim(b, a, 3)
        run_rounds([a, b], 40)
        s = a.engine.take_samples()
        assert s["flow"].size == 40 and np.all(s["flags"] == ALL), np.unique(s["flags"])
        assert b.engine.take_samples()["flow"].size == 40  # the unprimed side is unaffected
        ca, cb = a.engine.counters(), b.engine.counters()
        # the primers' own TX stamps are neither used nor counted as unmatched (these
        # responder sockets stamp their acks: one unmatched stamp per ack, on both sides)
        assert (ca["primers_sent"], ca["packets_sent"], ca["tx_timestamps"]) == (40, 80, 80)
        assert ca["tx_timestamps_unmatched"] == ca["acks_sent"] == 40
        assert cb["tx_timestamps_unmatched"] == cb["acks_sent"] and cb["primers_sent"] == 0
        assert (cb["primers_received"], cb["probes_received"]) == (40, 80)
        assert ca["primers_received"] == 0 and cb["acks_sent"] == 40
        assert sum(cb[k] for k in ("bad_length", "bad_header", "bad_mac")) == 0
    finally:
        a.close()
        b.close()


def test_injected_clock_error_shows_in_raw_owd_and_the_model_removes_it() -> None:
    off_ns, drift_ppb = 5_000_000.0, 50_000.0  # +5 ms and +50 ppm on host b
    for model in ("identity", "truth"):
        a, b = make_host("127.0.0.2", 41000, 2), make_host("127.0.0.3", 42000, 2)
        try:
            t0 = time.time_ns()
            b.engine.set_injection(off_ns, drift_ppb, t0)
            if model == "truth":
                # raw - fleet = offset + drift·(raw - t0): the exact inverse of the injection
                b.engine.set_clock_model(
                    int(t0 + off_ns), off_ns, drift_ppb * (1 - drift_ppb * 1e-9)
                )
            aim(a, b, 2)
            run_rounds([a, b], 60)
            s = a.engine.take_samples()
        finally:
            a.close()
            b.close()
        raw = np.median(s["rx0"] - s["tx0"])
        fleet = np.median(s["rx0_fleet"] - s["tx0"])  # a's model is the identity
        elapsed_drift = drift_ppb * 1e-9 * (s["tx0"] - t0)
        assert abs(raw - off_ns - np.median(elapsed_drift)) < 100_000
        if model == "identity":
            assert abs(fleet - raw) < 1_000
        else:
            assert 0 < fleet < 100_000  # back to a true loopback delay


def test_lost_acks_are_repaired_by_the_next_ack_on_the_flow(
    pair_of_hosts: tuple[Host, Host],
) -> None:
    """Every other ack is dropped on its way back: the history records still deliver all."""
    a, _ = pair_of_hosts
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        peer.bind(("127.0.0.6", DPORT))
        peer.setblocking(False)
        aim(a, "127.0.0.6", 1)
        history: list[wire.Record] = []
        deadline = time.monotonic_ns()
        for r in range(20):
            deadline += 10_000_000
            a.engine.run_round(r, deadline)
            got = []
            while True:
                try:
                    data, src = peer.recvfrom(512)
                except BlockingIOError:
                    break
                got.append(wire.decode(data, KEY))
            pair = got[0].pair
            rec = wire.Record(pair, 3, 10, 20, 10, 20)
            ack = wire.Packet(wire.KIND_ACK, got[0].session, pair, 0, (rec, *history[:2]))
            history.insert(0, rec)
            if r % 2 == 0 or r == 19:  # odd acks "lost", except the last
                peer.sendto(wire.encode(ack, KEY), src)
        a.engine.serve_until(time.monotonic_ns() + 400_000_000)
        s = a.engine.take_samples()
        c = a.engine.counters()
    finally:
        peer.close()
    assert s["flow"].size == 20 and np.all(s["flags"] & FLAG_ACKED)
    assert c["acks_recovered"] == 9 and c["pairs_expired"] == 0
