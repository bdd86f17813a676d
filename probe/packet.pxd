# cython: language_level=3
"""Probe wire format, C level: fixed layouts, network byte order, SipHash-2-4 MAC.

Kept in a .pxd of inline functions so the fast path compiles them in with no call overhead.
``fleetlens.probe.protocol`` is the same format in plain Python (for tests, fuzzing and the
pure-Python baseline); the tests check that each side accepts exactly what the other writes.

Layout (offsets in bytes, integers big-endian):

    0  magic  u16 = 0x464C ("FL")     2  version u8 = 2     3  kind u8 (1, 2 probe; 3 ack;
                                                                             4 primer)
    4  flags  u8 (zero)                                     5  reserved (3 bytes, zero)
    8  session u64 (the sending agent's random session id)
    16 pair u32 (pair id, unique per session)
    20 seq u32 (probe: the pair's number in its *stream*, the sending NIC's pairs to one
       destination NIC, +1 per pair; ack: echoes the acked probe's)
    24 t u64 (probe: sender raw send time; ack: zero)
    probe, primer: 32 mac u64                                                -> 40 bytes
    ack:   32 three receive records of 40 bytes
           record: pair u32, flags u8 (bit0 rx0, bit1 rx1; 0 = empty), 3 zero bytes,
                   rx0 raw u64, rx1 raw u64, rx0 fleet i64, rx1 fleet i64
           record 0 answers the pair in the header; records 1-2 repeat the previous two
           answered pairs of the same stream (their stamps survive one lost ack);
           152 receive bitmap: top u32, 4 zero bytes, seen0 u64, seen1 u64: bit i of seen0
           (seen1) says probe 0 (1) of the stream's pair ``seq = top - i`` arrived, for
           every pair the receiver has answered among the last 64 of the stream;
           176 mac u64                                                      -> 184 bytes

Why a bitmap: the sender counts a probe lost only when no ack covering it says it arrived.
With only the two repeated records, three acks lost in a row on the reverse path turned a
probe that arrived into a lost one, and a lossy link read as loss on every link that carried
the flows it answered (issue 28: 0.05-0.15 % "loss" on a clean spine->leaf link). A stream
sends a pair every round (10 ms), so 64 pairs cover 640 ms of acks: a probe is misread as
lost only if all of them are lost, 0.3^64 at 30 % reverse loss. A clear bit is no evidence
either way (the receiver may not have answered yet, or lost its history of the stream): the
sender uses set bits only, and a pair nothing covers is lost at the ack timeout, as before.
An ack whose pair was answered by a later ack instead (a record or the bitmap) is counted as
a lost ack: evidence for the reverse path, never for the forward one.

Version 1 packets (no stream number, 160-byte acks without a bitmap) are rejected and
counted (``bad_version``), not accepted: a v1 peer's acks would put its reverse-path loss
back into the forward loss, which is the bug v2 fixes, and a fleet shares one key, so its
agents are upgraded together; the counter shows a mixed fleet instead of a quiet error.

A primer is sent just before a pair, in the same ``sendmmsg`` and on the same 5-tuple, and
the responder drops it (counted): it takes the cost of the first datagram through a cold
send and receive path, which with software timestamps would otherwise fall on probe 0 alone
and leave almost no pair pure (see ``fastpath.pyx``).

The MAC is SipHash-2-4 (a keyed PRF built for short messages) of every byte before it, keyed
with the 128-bit fleet key; a 64-bit tag makes a forgery a 2^-64 guess per packet.
"""

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef enum:
    MAGIC = 0x464C
    VERSION = 2
    KIND_PROBE0 = 1
    KIND_PROBE1 = 2
    KIND_ACK = 3
    KIND_PRIMER = 4
    PROBE_LEN = 40
    ACK_LEN = 184
    BITMAP_OFF = 152
    BITMAP_PAIRS = 64
    ACK_RECORDS = 3
    RECORD_LEN = 40
    ACK_RX0 = 1
    ACK_RX1 = 2


cdef inline uint64_t rotl(uint64_t x, int b) noexcept nogil:
    return (x << b) | (x >> (64 - b))


cdef inline uint64_t load_le64(const uint8_t* p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v |= (<uint64_t>p[i]) << (8 * i)
    return v


cdef inline uint64_t siphash24(uint64_t k0, uint64_t k1, const uint8_t* m, size_t n) noexcept nogil:
    cdef uint64_t v0 = k0 ^ 0x736F6D6570736575ULL
    cdef uint64_t v1 = k1 ^ 0x646F72616E646F6DULL
    cdef uint64_t v2 = k0 ^ 0x6C7967656E657261ULL
    cdef uint64_t v3 = k1 ^ 0x7465646279746573ULL
    cdef uint64_t b = (<uint64_t>n) << 56
    cdef uint64_t w
    cdef size_t off = 0
    cdef int r, i
    while off + 8 <= n:
        w = load_le64(m + off)
        v3 ^= w
        for r in range(2):
            v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32)
            v2 += v3; v3 = rotl(v3, 16); v3 ^= v2
            v0 += v3; v3 = rotl(v3, 21); v3 ^= v0
            v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32)
        v0 ^= w
        off += 8
    for i in range(<int>(n - off)):
        b |= (<uint64_t>m[off + i]) << (8 * i)
    v3 ^= b
    for r in range(2):
        v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32)
        v2 += v3; v3 = rotl(v3, 16); v3 ^= v2
        v0 += v3; v3 = rotl(v3, 21); v3 ^= v0
        v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32)
    v0 ^= b
    v2 ^= 0xFF
    for r in range(4):
        v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32)
        v2 += v3; v3 = rotl(v3, 16); v3 ^= v2
        v0 += v3; v3 = rotl(v3, 21); v3 ^= v0
        v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32)
    return v0 ^ v1 ^ v2 ^ v3


cdef inline void put_u16(uint8_t* p, uint16_t v) noexcept nogil:
    p[0] = v >> 8
    p[1] = v & 0xFF


cdef inline void put_u32(uint8_t* p, uint32_t v) noexcept nogil:
    cdef int i
    for i in range(4):
        p[i] = (v >> (24 - 8 * i)) & 0xFF


cdef inline void put_u64(uint8_t* p, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(8):
        p[i] = (v >> (56 - 8 * i)) & 0xFF


cdef inline uint16_t get_u16(const uint8_t* p) noexcept nogil:
    return (<uint16_t>p[0] << 8) | p[1]


cdef inline uint32_t get_u32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t get_u64(const uint8_t* p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v = (v << 8) | p[i]
    return v


cdef inline void write_header(uint8_t* p, uint8_t kind, uint8_t flags, uint64_t session,
                              uint32_t pair, uint32_t seq, uint64_t t) noexcept nogil:
    cdef int i
    put_u16(p, MAGIC)
    p[2] = VERSION
    p[3] = kind
    p[4] = flags
    for i in range(5, 8):
        p[i] = 0
    put_u64(p + 8, session)
    put_u32(p + 16, pair)
    put_u32(p + 20, seq)
    put_u64(p + 24, t)


cdef inline void seal(uint8_t* p, size_t n, uint64_t k0, uint64_t k1) noexcept nogil:
    put_u64(p + n - 8, siphash24(k0, k1, p, n - 8))


cdef inline int check(const uint8_t* p, size_t n, uint64_t k0, uint64_t k1) noexcept nogil:
    """0 if valid; 1 bad length, 2 bad magic/kind, 3 bad MAC, 4 another version."""
    if n >= 3 and get_u16(p) == MAGIC and p[2] != VERSION:
        return 4
    if n != PROBE_LEN and n != ACK_LEN:
        return 1
    if get_u16(p) != MAGIC:
        return 2
    if n == PROBE_LEN and p[3] != KIND_PROBE0 and p[3] != KIND_PROBE1 and p[3] != KIND_PRIMER:
        return 2
    if n == ACK_LEN and p[3] != KIND_ACK:
        return 2
    if get_u64(p + n - 8) != siphash24(k0, k1, p, n - 8):
        return 3
    return 0
