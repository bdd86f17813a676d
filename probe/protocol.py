"""The probe wire format in plain Python: the same bytes ``packet.pxd`` reads and writes.

Used by the tests (forged, truncated and replayed packets; cross-checks against the fast
path) and by the pure-Python baseline in ``bench/``. See ``packet.pxd`` for the layout.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC, VERSION = 0x464C, 2
KIND_PROBE0, KIND_PROBE1, KIND_ACK, KIND_PRIMER = 1, 2, 3, 4
PROBE_LEN, ACK_LEN, ACK_RECORDS, BITMAP_PAIRS = 40, 184, 3, 64
ACK_RX0, ACK_RX1 = 1, 2
_KINDS = (KIND_PROBE0, KIND_PROBE1, KIND_ACK, KIND_PRIMER)
_HEADER = struct.Struct("!HBBB3xQIIQ")  # magic version kind flags | session pair seq | t
_RECORD = struct.Struct("!IB3xQQqq")  # pair, flags, rx0, rx1, rx0 fleet, rx1 fleet
_BITMAP = struct.Struct("!I4xQQ")  # top, seen0, seen1
_MASK = (1 << 64) - 1


class WireError(ValueError):
    pass


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK


def _round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    v0 = (v0 + v1) & _MASK
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _MASK
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _MASK
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _MASK
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash24(key: bytes, msg: bytes) -> int:
    """SipHash-2-4 of ``msg`` under a 16-byte key (Aumasson & Bernstein, 2012)."""
    k0, k1 = struct.unpack("<QQ", key)
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261,
         k1 ^ 0x7465646279746573]  # fmt: skip
    tail = len(msg) % 8
    for (w,) in struct.iter_unpack("<Q", msg[: len(msg) - tail]):
        v[3] ^= w
        v = list(_round(*_round(*v)))
        v[0] ^= w
    b = (len(msg) & 0xFF) << 56 | int.from_bytes(msg[len(msg) - tail :], "little")
    v[3] ^= b
    v = list(_round(*_round(*v)))
    v[0] ^= b
    v[2] ^= 0xFF
    for _ in range(4):
        v = list(_round(*v))
    return v[0] ^ v[1] ^ v[2] ^ v[3]


@dataclass(frozen=True)
class Record:
    """What the receiver saw of one pair (an ack carries three: this pair and the stream's two
    answered before it)."""

    pair: int = 0
    flags: int = 0  # ACK_RX0 | ACK_RX1; 0: empty
    rx0: int = 0
    rx1: int = 0
    rx0_fleet: int = 0
    rx1_fleet: int = 0


@dataclass(frozen=True)
class Bitmap:
    """An ack's receive bitmap: bit i of ``seen0`` (``seen1``) says probe 0 (1) of the stream's
    pair ``seq = top - i`` arrived; a clear bit says nothing."""

    top: int = 0
    seen0: int = 0
    seen1: int = 0

    def arrived(self, seq: int) -> tuple[bool, bool]:
        i = (self.top - seq) % (1 << 32)
        if i >= BITMAP_PAIRS:
            return False, False
        return bool(self.seen0 >> i & 1), bool(self.seen1 >> i & 1)


@dataclass(frozen=True)
class Packet:
    kind: int
    session: int
    pair: int
    t: int = 0  # probe: sender raw send time
    records: tuple[Record, ...] = ()  # ack only
    seq: int = 0  # the pair's number in its stream (an ack echoes its probe's)
    bitmap: Bitmap = Bitmap()  # ack only


def encode(p: Packet, key: bytes) -> bytes:
    body = _HEADER.pack(MAGIC, VERSION, p.kind, 0, p.session, p.pair, p.seq, p.t)
    if p.kind == KIND_ACK:
        recs = (list(p.records) + [Record()] * ACK_RECORDS)[:ACK_RECORDS]
        body += b"".join(
            _RECORD.pack(r.pair, r.flags, r.rx0, r.rx1, r.rx0_fleet, r.rx1_fleet) for r in recs
        )
        body += _BITMAP.pack(p.bitmap.top, p.bitmap.seen0, p.bitmap.seen1)
    return body + struct.pack("!Q", siphash24(key, body))


def decode(data: bytes, key: bytes) -> Packet:
    """Parse and authenticate; raises WireError saying what is wrong. Another version of the
    format (v1: no stream seq, no bitmap) is refused as such, whatever its length."""
    if len(data) >= 3 and data[:2] == MAGIC.to_bytes(2, "big") and data[2] != VERSION:
        raise WireError(f"version {data[2]}")
    if len(data) not in (PROBE_LEN, ACK_LEN):
        raise WireError(f"length {len(data)}")
    magic, _version, kind, _flags, session, pair, seq, t = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WireError("magic")
    if (len(data) == ACK_LEN) != (kind == KIND_ACK) or kind not in _KINDS:
        raise WireError("kind")
    if struct.unpack_from("!Q", data, len(data) - 8)[0] != siphash24(key, data[:-8]):
        raise WireError("mac")
    if kind != KIND_ACK:
        return Packet(kind, session, pair, t, seq=seq)
    recs = tuple(
        Record(*_RECORD.unpack_from(data, _HEADER.size + i * _RECORD.size))
        for i in range(ACK_RECORDS)
    )
    bitmap = Bitmap(*_BITMAP.unpack_from(data, _HEADER.size + ACK_RECORDS * _RECORD.size))
    return Packet(kind, session, pair, t, recs, seq, bitmap)
