"""Acks cannot fake loss: the v2 receive bitmap, on loopback with the real fast path.

Two engines talk through a UDP relay that drops a share of the probes (forward loss) and of
the acks (reverse loss), seeded. The sender's ``received`` must read the forward loss alone,
and the acks that never came back must be counted as lost acks, not lost probes.
"""

from __future__ import annotations

import random
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from engine_helpers import DPORT, KEY, Host, aim, make_host, needs_root, run_rounds
from fleetlens.probe import protocol as wire
from fleetlens.probe.fastpath import FLAG_ACK_LOST, FLAG_ACKED, FLAG_HEARD0, FLAG_HEARD1
from fleetlens.probe.windows import summarize_samples

pytestmark = needs_root
RELAY_IP = "127.0.0.15"


@contextmanager
def relay(
    sender: Host, receiver: Host, fwd_loss: float, rev_loss: float, seed: int
) -> Iterator[dict[str, int]]:
    """Probes to RELAY_IP:DPORT go on to the receiver from one relay socket per sender port
    (so its acks come back to that socket), and its acks back to the sender port; each
    direction drops packets at its rate. Yields counts of what it dropped."""
    rng = random.Random(seed)
    front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    front.bind((RELAY_IP, DPORT))
    backs: dict[int, socket.socket] = {}
    for port in sender.ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((RELAY_IP, port))
        backs[port] = s
    by_fd = {s.fileno(): port for port, s in backs.items()}
    counts = {"probes_dropped": 0, "acks_dropped": 0, "acks": 0}
    stop = threading.Event()

    def run() -> None:
        socks = [front, *backs.values()]
        while not stop.is_set():
            ready, _, _ = select.select(socks, [], [], 0.01)
            for s in ready:
                data, src = s.recvfrom(512)
                if s is front:  # a probe (or primer) from the sender's port src[1]
                    if rng.random() < fwd_loss:
                        counts["probes_dropped"] += 1
                    else:
                        backs[src[1]].sendto(data, (receiver.ip, DPORT))
                else:
                    counts["acks"] += 1
                    if rng.random() < rev_loss:
                        counts["acks_dropped"] += 1
                    else:
                        front.sendto(data, (sender.ip, by_fd[s.fileno()]))

    t = threading.Thread(target=run)
    t.start()
    try:
        yield counts
    finally:
        stop.set()
        t.join()
        for s in (front, *backs.values()):
            s.close()


@pytest.mark.parametrize(("fwd", "rev"), [(0.0, 0.3), (0.1, 0.3)])
def test_reverse_path_loss_does_not_read_as_forward_loss(fwd: float, rev: float) -> None:
    a, b = make_host("127.0.0.13", 46000, 2), make_host("127.0.0.14", 46100, 2)
    try:
        aim(a, RELAY_IP, 2)
        with relay(a, b, fwd, rev, seed=28) as counts:
            run_rounds([a, b], 300, period_ns=5_000_000)
        s = a.engine.take_samples()
        c = a.engine.counters()
    finally:
        a.close()
        b.close()
    assert s["flow"].size == 300
    one = np.zeros(s["flow"].size, np.int64)  # every sample in one row (identity clocks)
    summary = summarize_samples({**s, "tx0_fleet": s["tx0"], "tx1_fleet": s["tx1"]}, one, 1, 1_000)
    sent, received = int(summary.sent[0]), int(summary.received[0])
    assert sent == 600
    # the probes the relay dropped are exactly the loss the sender reads, give or take the
    # pairs whose every covering ack was lost (0.3^64: none) or the last one's
    assert 0 <= (sent - received) - counts["probes_dropped"] <= 2
    measured = (sent - received) / sent
    assert abs(measured - fwd) < 0.04, (measured, counts)
    # each lost ack of a pair the receiver saw is counted as a lost ack, not a lost probe
    lost_acks = int(np.count_nonzero(s["flags"] & FLAG_ACK_LOST))
    assert c["acks_lost"] == lost_acks
    assert abs(lost_acks - counts["acks_dropped"]) <= 2, (lost_acks, counts)
    assert abs(lost_acks / counts["acks"] - rev) < 0.07
    # pairs answered by the bitmap alone have arrival flags, never made-up stamps
    heard = (s["flags"] & (FLAG_HEARD0 | FLAG_HEARD1)) > 0
    assert c["pairs_heard"] == int(np.count_nonzero(heard)) > 0
    assert np.all(s["flags"][heard] & FLAG_ACKED)


def _probes(peer: socket.socket) -> list[tuple[wire.Packet, tuple[str, int]]]:
    got = []
    while True:
        try:
            data, src = peer.recvfrom(512)
        except BlockingIOError:
            return got
        got.append((wire.decode(data, KEY), src))


def test_a_bitmap_answers_only_what_it_says_arrived() -> None:
    """A Python peer acks every fifth pair only, with an empty record history: its bitmap says
    every earlier pair of the stream arrived except those with seq % 7 == 3 (probe 1 only)
    and seq % 11 == 5 (neither). The first count probe 1 alone; the second expire lost."""
    a = make_host("127.0.0.16", 46200, 1)
    a.engine.set_timeouts(100_000_000, 2_000_000)
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        peer.bind(("127.0.0.17", DPORT))
        peer.setblocking(False)
        aim(a, "127.0.0.17", 1)
        deadline = time.monotonic_ns()
        seqs: list[int] = []
        for r in range(40):
            deadline += 5_000_000
            a.engine.run_round(r, deadline)
            got = [p for p, _ in _probes(peer) if p.kind == wire.KIND_PROBE0]
            seqs += [p.seq for p in got]
            if r % 5 != 4 or not got:
                continue
            p = got[-1]
            seen0 = seen1 = 0
            for i, seq in enumerate(reversed(seqs[-64:])):
                seen0 |= int(seq % 7 != 3 and seq % 11 != 5) << i
                seen1 |= int(seq % 11 != 5) << i
            ack = wire.Packet(
                wire.KIND_ACK, p.session, p.pair, 0, (wire.Record(p.pair, 3, 10, 20, 10, 20),),
                p.seq, wire.Bitmap(p.seq, seen0, seen1),
            )  # fmt: skip
            peer.sendto(wire.encode(ack, KEY), ("127.0.0.16", 46200))
        for _ in range(4):  # the engine expires pairs between waits, as run_round does
            a.engine.serve_until(time.monotonic_ns() + 50_000_000)
        s = a.engine.take_samples()
        c = a.engine.counters()
    finally:
        peer.close()
        a.close()
    assert len(seqs) == 40 and seqs == list(range(seqs[0], seqs[0] + 40))  # one stream, +1
    by_pair = dict(zip(s["pair"].tolist(), s["flags"].tolist(), strict=True))
    assert len(by_pair) == 40
    pairs = sorted(by_pair)
    for i, pair in enumerate(pairs):
        seq, f = seqs[i], by_pair[pair]
        if i % 5 == 4:  # its own ack
            assert f & FLAG_ACKED and not f & FLAG_ACK_LOST
        elif seq % 11 == 5:  # the bitmap does not say it arrived: lost at the timeout
            assert not f & FLAG_ACKED, (i, seq, f)
        else:
            assert f & FLAG_ACK_LOST and f & FLAG_HEARD1
            assert bool(f & FLAG_HEARD0) == (seq % 7 != 3)
    assert c["acks_received"] == 8 and c["pairs_heard"] + 8 + c["pairs_expired"] == 40
    assert c["pairs_expired"] == sum(seq % 11 == 5 for i, seq in enumerate(seqs) if i % 5 != 4)


def test_version_1_packets_are_refused_and_counted() -> None:
    b = make_host("127.0.0.18", 46300, 1)
    v2 = wire.encode(wire.Packet(wire.KIND_PROBE0, 5, 1, 1), KEY)
    v1_body = v2[:2] + bytes([1]) + v2[3:-8]
    v1 = v1_body + wire.siphash24(KEY, v1_body).to_bytes(8, "big")
    with pytest.raises(wire.WireError, match="version"):
        wire.decode(v1, KEY)
    try:
        before = b.engine.counters()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.19", 0))
            s.sendto(v1, (b.ip, DPORT))
            s.sendto(v1[:-8] + bytes(120) + v1[-8:], (b.ip, DPORT))  # a v1 ack's length
            b.engine.serve_until(time.monotonic_ns() + 30_000_000)
        after = b.engine.counters()
    finally:
        b.close()
    assert after["bad_version"] - before["bad_version"] == 2
    assert after["probes_received"] == before["probes_received"]
