# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The agent's data path: coded probe pairs, acks and kernel timestamps, with no per-packet Python.

One :class:`Engine` per agent owns every probe socket of the host (opened and configured by the
control plane, which hands over the file descriptors). Python calls :meth:`Engine.run_round`
once per 10 ms round; inside it, with the GIL released, the engine

- sends each planned peer its coded pair (two datagrams back to back, one ``sendmmsg``) from
  the socket of this round's source port, remembering each datagram's ``SOF_TIMESTAMPING_OPT_ID``
  key; on NICs set to prime, a primer datagram goes first in the same ``sendmmsg`` (below);
- until the round's absolute deadline, waits in ``epoll_pwait2`` and drains with ``recvmmsg``:
  the error queues (TX timestamps, matched to pairs by key), probes (receiver side: RX
  timestamps, pairing of the two datagrams, acks batched with ``sendmmsg``) and acks (sender
  side: matched to the outstanding pair, duplicates and replays dropped and counted);
- emits one sample per pair when it is complete (ack and both TX timestamps) or times out.

Primers: with software timestamps, the first datagram through an idle path pays for the cold
path and the second does not. On a 2-vCPU VM (two lab hosts, one pair every 10 ms) probe 0
took 4-22 µs one way against probe 1's 1.1-3.4 µs (p1-p99), so the receive gap almost never
matched the send gap: 0.2-3 % of pairs were pure. A primer to the same peer on the same
5-tuple, first in the pair's ``sendmmsg``, takes that cost: 96 % pure (same sender), 91-93 %
on a 4-host lab (52 % without). One primer per NIC and round, before its first pair only,
gave 59-76 %: the cold path is per destination, so every pair gets its own. The responder
drops primers (counted). Hardware timestamps are taken at the wire, after the cold path.

Samples accumulate in C buffers that Python takes as numpy arrays once per window.

Clocks: every timestamp read from the kernel (CLOCK_REALTIME software stamps, or the NIC's
raw hardware stamps) goes through the injected distortion (tests: ``raw = real + offset +
drift·(real - t0)``) to give the host's raw clock, and through the host's clock model to give
fleet time for the receive stamps an ack carries.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memset
from libc.errno cimport errno

import numpy as np

from packet cimport (
    ACK_LEN, ACK_RECORDS, ACK_RX0, ACK_RX1, BITMAP_OFF, BITMAP_PAIRS, KIND_ACK, KIND_PRIMER,
    KIND_PROBE0, KIND_PROBE1, PROBE_LEN, RECORD_LEN, check, get_u32, get_u64, put_u32, put_u64,
    seal, write_header,
)


cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int, timespec*)
    int CLOCK_MONOTONIC
    int CLOCK_REALTIME

cdef extern from "<sys/uio.h>" nogil:
    cdef struct iovec:
        void* iov_base
        size_t iov_len

cdef extern from "<netinet/in.h>" nogil:
    cdef struct in_addr:
        uint32_t s_addr
    cdef struct sockaddr_in:
        unsigned short sin_family
        uint16_t sin_port
        in_addr sin_addr
    uint16_t htons(uint16_t)
    uint16_t ntohs(uint16_t)
    uint32_t htonl(uint32_t)
    uint32_t ntohl(uint32_t)
    int AF_INET

cdef extern from "<sys/socket.h>" nogil:
    ctypedef unsigned int socklen_t
    cdef struct msghdr:
        void* msg_name
        socklen_t msg_namelen
        iovec* msg_iov
        size_t msg_iovlen
        void* msg_control
        size_t msg_controllen
        int msg_flags
    cdef struct mmsghdr:
        msghdr msg_hdr
        unsigned int msg_len
    cdef struct cmsghdr:
        size_t cmsg_len
        int cmsg_level
        int cmsg_type
    int sendmmsg(int, mmsghdr*, unsigned int, int)
    int recvmmsg(int, mmsghdr*, unsigned int, int, timespec*)
    cmsghdr* CMSG_FIRSTHDR(msghdr*)
    cmsghdr* CMSG_NXTHDR(msghdr*, cmsghdr*)
    unsigned char* CMSG_DATA(cmsghdr*)
    int SOL_SOCKET
    int SO_TIMESTAMPING
    int MSG_ERRQUEUE
    int MSG_DONTWAIT

cdef extern from "<linux/errqueue.h>" nogil:
    cdef struct sock_extended_err:
        uint32_t ee_errno
        uint8_t ee_origin
        uint8_t ee_type
        uint8_t ee_code
        uint8_t ee_pad
        uint32_t ee_info
        uint32_t ee_data
    cdef struct scm_timestamping:
        timespec ts[3]
    int SO_EE_ORIGIN_TIMESTAMPING
    int SCM_TSTAMP_SND

cdef extern from "<sys/epoll.h>" nogil:
    ctypedef union epoll_data_t:
        uint64_t u64
    cdef struct epoll_event:
        uint32_t events
        epoll_data_t data
    int epoll_create1(int)
    int epoll_ctl(int, int, int, epoll_event*)
    int epoll_pwait2(int, epoll_event*, int, const timespec*, const void*)
    int EPOLL_CTL_ADD
    int EPOLLIN
    int EPOLLERR

cdef extern from "<unistd.h>" nogil:
    int close(int)

cdef extern from "<netinet/in.h>" nogil:
    int IPPROTO_IP
    int IP_RECVERR


cdef enum:
    BATCH = 64
    CTRL = 256
    NSLOTS = 65536          # outstanding pairs: > peers x rounds in one ack timeout
    TSRING = 2048           # TX-timestamp keys remembered per socket
    RXTAB = 16384           # receiver-side pairing table
    HIST = 8192             # receiver-side per-stream history of answered pairs (4-way sets)
    SEQRING = 256           # sender: pair number of each of a stream's last SEQRING pairs
    WAITQ = 16384
    MAX_EVENTS = 256

# sample flags (one per pair)
cdef enum:
    F_SENT0 = 1
    F_SENT1 = 2
    F_TX0 = 4
    F_TX1 = 8
    F_RX0 = 16
    F_RX1 = 32
    F_ACKED = 64            # the receiver's answer is known (its ack, or a later one)
    F_ACK_LOST = 128        # ... from a later ack only: the pair's own ack was lost (or late)
    F_HEARD0 = 256          # the receiver saw probe 0 (a later ack's bitmap; no stamps)
    F_HEARD1 = 512

cdef enum:
    TS_PRIMER = 2  # Sock.ts_which of a primer's key (0, 1: the pair's probes)

COUNTER_NAMES = (
    "pairs_sent", "packets_sent", "send_errors", "probes_received", "acks_sent", "acks_received",
    "bad_length", "bad_header", "bad_mac", "replayed_probes", "stale_acks", "tx_timestamps",
    "tx_timestamps_unmatched", "rx_without_timestamp", "pairs_expired", "late_rounds",
    "acks_recovered", "late_probes", "primers_sent", "primers_received", "bad_version",
    "acks_lost", "pairs_heard",
)
cdef enum:
    C_PAIRS_SENT, C_PACKETS_SENT, C_SEND_ERRORS, C_PROBES_RX, C_ACKS_SENT, C_ACKS_RX,
    C_BAD_LEN, C_BAD_HDR, C_BAD_MAC, C_REPLAY, C_STALE_ACK, C_TX_TS, C_TX_TS_UNMATCHED,
    C_RX_NO_TS, C_EXPIRED, C_LATE, C_RECOVERED, C_LATE_PROBE, C_PRIMERS_SENT, C_PRIMERS_RX,
    C_BAD_VERSION, C_ACKS_LOST, C_HEARD, N_COUNTERS


cdef struct Slot:
    uint32_t pair
    uint32_t flow
    uint32_t seq             # the pair's number in its stream
    int32_t entry            # the plan entry (stream) that sent it
    int64_t tx[2]
    int64_t rx[2]
    int64_t rxf[2]
    int64_t sent_mono
    uint8_t busy
    uint16_t flags


cdef struct Sock:
    int fd
    int responder
    int hw
    int primer              # sender socket: a primer before each pair
    uint32_t tskey_next
    uint32_t* ts_pair
    uint8_t* ts_which


cdef struct RxEntry:
    uint32_t ip
    uint16_t port
    uint64_t session
    uint32_t pair
    uint32_t seq
    int64_t rx[2]
    int64_t rxf[2]
    int64_t first_mono
    int sock
    uint64_t generation
    uint8_t got
    uint8_t state        # 0 empty, 1 waiting for the second probe, 2 acked


cdef struct Hist:
    uint32_t ip
    int sock             # the responder socket: the destination NIC of the stream
    uint64_t session
    uint64_t used        # ack count at the last use: the set's least recent entry is evicted
    uint8_t rec[2][RECORD_LEN]   # the stream's last two answered pairs, as sent
    uint32_t top         # the highest answered seq; bit i of seen0/1: seq top - i arrived
    uint64_t seen[2]


cdef struct Waiting:
    uint32_t index
    uint64_t generation   # which occupant of the slot: pair ids repeat across senders
    int64_t due


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    """splitmix64's finalizer: every input bit moves every output bit, so a table index taken
    from the low bits still depends on the sender's address (a plain XOR of shifted fields
    left the IP out of the low bits, and two hosts' port ranges then shared history slots)."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL
    return x ^ (x >> 31)


cdef inline uint64_t flow_key(uint64_t session, uint32_t ip, uint16_t port) noexcept nogil:
    return mix64(session ^ mix64((<uint64_t>ip << 16) | port))


cdef inline void _mark_seen(Hist* hi, uint32_t seq, uint8_t got) noexcept nogil:
    """Record the stream's answered pair ``seq`` (``got``: bit0 probe 0, bit1 probe 1) in its
    64-pair receive bitmap; a pair 64 or more behind the top no longer fits and is left out."""
    cdef int32_t d = <int32_t>(seq - hi.top)
    cdef int k
    if hi.seen[0] == 0 and hi.seen[1] == 0:
        d = 0  # nothing recorded yet: this pair sets the top
        hi.top = seq
    if d > 0:
        for k in range(2):
            hi.seen[k] = hi.seen[k] << d if d < BITMAP_PAIRS else 0
        hi.top = seq
        d = 0
    if -d >= BITMAP_PAIRS:
        return
    for k in range(2):
        if got & (1 << k):
            hi.seen[k] |= (<uint64_t>1) << (-d)


cdef inline int64_t mono_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1000000000 + ts.tv_nsec


cdef inline int64_t real_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return ts.tv_sec * 1000000000 + ts.tv_nsec


cdef class Engine:
    cdef uint64_t k0, k1, session
    cdef Sock* socks
    cdef int nsocks, cap_socks, epfd
    cdef int* nic_base        # first sender socket of each NIC
    cdef int* nic_nports
    cdef int* nic_responder
    cdef int nnics
    # plan
    cdef int nentries
    cdef int* e_nic
    cdef uint32_t* e_ip
    cdef int* e_off
    cdef int* e_nports
    cdef int* e_flow
    cdef uint32_t* e_seq      # next seq of each stream
    cdef uint32_t* e_ring     # SEQRING per stream: seq % SEQRING -> pair number
    cdef uint16_t dport
    # pairs
    cdef Slot* slots
    cdef uint32_t next_pair, oldest_pair
    cdef int64_t timeout_ns, pair_wait_ns
    # receiver
    cdef RxEntry* rxtab
    cdef Hist* hist
    cdef uint64_t hist_clock
    cdef Waiting* waitq
    cdef uint32_t wq_head, wq_tail
    cdef uint64_t generations
    # clocks
    cdef double inj_offset, inj_drift
    cdef int64_t inj_t0
    cdef double clk_offset, clk_drift
    cdef int64_t clk_t0
    # samples
    cdef uint32_t* s_flow
    cdef uint32_t* s_pair
    cdef int64_t* s_ts        # 6 per sample: tx0 tx1 rx0 rx1 rx0f rx1f
    cdef uint16_t* s_flags
    cdef size_t nsamples, cap_samples
    cdef uint64_t cnt[N_COUNTERS]
    # I/O buffers
    cdef uint8_t* bufs
    cdef uint8_t* ctrl
    cdef sockaddr_in* addrs
    cdef iovec* iovs
    cdef mmsghdr* msgs
    cdef uint8_t* ackbuf
    cdef sockaddr_in* ackaddr
    cdef iovec* ackiov
    cdef mmsghdr* ackmsg
    cdef int nacks, ack_sock

    def __cinit__(self, bytes key, uint64_t session, int max_sockets=4096):
        if len(key) != 16:
            raise ValueError("the fleet key must be 16 bytes")
        cdef const uint8_t* k = key
        self.k0 = (<uint64_t*>k)[0]
        self.k1 = (<uint64_t*>(k + 8))[0]
        self.session = session
        self.cap_socks = max_sockets
        self.socks = <Sock*>calloc(max_sockets, sizeof(Sock))
        self.slots = <Slot*>calloc(NSLOTS, sizeof(Slot))
        self.rxtab = <RxEntry*>calloc(RXTAB, sizeof(RxEntry))
        self.hist = <Hist*>calloc(HIST, sizeof(Hist))
        self.waitq = <Waiting*>calloc(WAITQ, sizeof(Waiting))
        self.bufs = <uint8_t*>malloc(BATCH * ACK_LEN * 2)  # rx: room to see oversize datagrams
        self.ctrl = <uint8_t*>malloc(BATCH * CTRL)
        self.addrs = <sockaddr_in*>calloc(BATCH, sizeof(sockaddr_in))
        self.iovs = <iovec*>calloc(BATCH, sizeof(iovec))
        self.msgs = <mmsghdr*>calloc(BATCH, sizeof(mmsghdr))
        self.ackbuf = <uint8_t*>malloc(BATCH * ACK_LEN)
        self.ackaddr = <sockaddr_in*>calloc(BATCH, sizeof(sockaddr_in))
        self.ackiov = <iovec*>calloc(BATCH, sizeof(iovec))
        self.ackmsg = <mmsghdr*>calloc(BATCH, sizeof(mmsghdr))
        self.cap_samples = 1 << 16
        self.s_flow = <uint32_t*>malloc(self.cap_samples * sizeof(uint32_t))
        self.s_pair = <uint32_t*>malloc(self.cap_samples * sizeof(uint32_t))
        self.s_ts = <int64_t*>malloc(self.cap_samples * 6 * sizeof(int64_t))
        self.s_flags = <uint16_t*>malloc(self.cap_samples * sizeof(uint16_t))
        self.epfd = epoll_create1(0)
        if (not self.socks or not self.slots or not self.rxtab or not self.hist or not self.waitq
                or not self.bufs
                or not self.s_ts or self.epfd < 0):
            raise MemoryError("probe engine buffers")
        self.timeout_ns = 500_000_000
        self.pair_wait_ns = 20_000_000
        self.ack_sock = -1
        self.dport = 9470

    def __dealloc__(self):
        cdef int i
        for i in range(self.nsocks):
            free(self.socks[i].ts_pair)
            free(self.socks[i].ts_which)
        free(self.socks); free(self.slots); free(self.rxtab); free(self.hist); free(self.waitq)
        free(self.bufs); free(self.ctrl); free(self.addrs); free(self.iovs); free(self.msgs)
        free(self.ackbuf); free(self.ackaddr); free(self.ackiov); free(self.ackmsg)
        free(self.s_flow); free(self.s_pair); free(self.s_ts); free(self.s_flags)
        free(self.nic_base); free(self.nic_nports); free(self.nic_responder)
        self._free_plan()
        if self.epfd >= 0:
            close(self.epfd)

    # ---- set-up (control plane) ---------------------------------------------------------
    def add_nic(
        self, int responder_fd, list sender_fds, bint hardware=False, bint primer=False
    ) -> int:
        """Register one NIC's sockets (already bound and configured); returns its index.
        ``primer``: send a primer datagram before each pair (for software timestamps)."""
        cdef int nic = self.nnics
        if self.nsocks + 1 + len(sender_fds) > self.cap_socks:
            raise ValueError("too many sockets for this engine")
        self.nic_base = <int*>realloc(self.nic_base, (nic + 1) * sizeof(int))
        self.nic_nports = <int*>realloc(self.nic_nports, (nic + 1) * sizeof(int))
        self.nic_responder = <int*>realloc(self.nic_responder, (nic + 1) * sizeof(int))
        self.nic_responder[nic] = self._add_sock(responder_fd, 1, hardware, False)
        self.nic_base[nic] = self.nsocks
        self.nic_nports[nic] = len(sender_fds)
        for fd in sender_fds:
            self._add_sock(fd, 0, hardware, primer)
        self.nnics += 1
        return nic

    cdef int _add_sock(self, int fd, int responder, bint hw, bint primer) except -1:
        cdef int i = self.nsocks
        cdef epoll_event ev
        self.socks[i].fd = fd
        self.socks[i].responder = responder
        self.socks[i].hw = hw
        self.socks[i].primer = primer
        self.socks[i].tskey_next = 0
        self.socks[i].ts_pair = <uint32_t*>calloc(TSRING, sizeof(uint32_t))
        self.socks[i].ts_which = <uint8_t*>calloc(TSRING, 1)
        ev.events = EPOLLIN | EPOLLERR
        ev.data.u64 = i
        if epoll_ctl(self.epfd, EPOLL_CTL_ADD, fd, &ev) != 0:
            raise OSError(errno, "epoll_ctl")
        self.nsocks += 1
        return i

    def set_plan(self, int dport, int[:] nic, uint32_t[:] ip_host_order, int[:] nports, int[:] flow_base):
        """The round's sends: entry e goes to ``ip`` from NIC ``nic``, rotating over ``nports``
        source ports (a prefix of that NIC's sender sockets); flow id = flow_base + port index."""
        cdef int n = nic.shape[0], e
        for e in range(n):
            if not 0 <= nic[e] < self.nnics or not 1 <= nports[e] <= self.nic_nports[nic[e]]:
                raise ValueError(f"plan entry {e}: bad NIC or port count")
        self._free_plan()
        self.nentries = n
        self.dport = dport
        self.e_nic = <int*>malloc(max(n, 1) * sizeof(int))
        self.e_ip = <uint32_t*>malloc(max(n, 1) * sizeof(uint32_t))
        self.e_off = <int*>malloc(max(n, 1) * sizeof(int))
        self.e_nports = <int*>malloc(max(n, 1) * sizeof(int))
        self.e_flow = <int*>malloc(max(n, 1) * sizeof(int))
        self.e_seq = <uint32_t*>malloc(max(n, 1) * sizeof(uint32_t))
        self.e_ring = <uint32_t*>calloc(max(n, 1) * SEQRING, sizeof(uint32_t))
        if self.e_seq == NULL or self.e_ring == NULL:
            raise MemoryError("probe plan")
        for e in range(n):
            # New streams start at the pair counter: every seq a stream gets is then above any
            # seq an earlier plan used, and no ack for an old stream's pair can mark a new one.
            self.e_seq[e] = self.next_pair
            self.e_nic[e] = nic[e]
            self.e_ip[e] = ip_host_order[e]
            self.e_off[e] = e  # peers of one NIC start on different ports: spread the sockets
            self.e_nports[e] = nports[e]
            self.e_flow[e] = flow_base[e]

    cdef void _free_plan(self):
        free(self.e_nic); free(self.e_ip); free(self.e_off); free(self.e_nports); free(self.e_flow)
        free(self.e_seq); free(self.e_ring)
        self.e_nic = NULL; self.e_ip = NULL; self.e_off = NULL; self.e_nports = NULL
        self.e_flow = NULL; self.e_seq = NULL; self.e_ring = NULL
        self.nentries = 0

    def set_clock_model(self, int64_t t0_ns, double offset_ns, double drift_ppb):
        self.clk_t0, self.clk_offset, self.clk_drift = t0_ns, offset_ns, drift_ppb

    def set_injection(self, double offset_ns, double drift_ppb, int64_t t0_ns):
        """Distort every timestamp read: ``raw = real + offset + drift·(real - t0)`` (tests)."""
        self.inj_offset, self.inj_drift, self.inj_t0 = offset_ns, drift_ppb, t0_ns

    def set_timeouts(self, int64_t ack_timeout_ns, int64_t pair_wait_ns):
        self.timeout_ns, self.pair_wait_ns = ack_timeout_ns, pair_wait_ns

    def raw_now(self) -> int:
        """The host's raw clock now (the injected distortion applied)."""
        return self._raw(real_ns())

    def counters(self) -> dict:
        return {name: self.cnt[i] for i, name in enumerate(COUNTER_NAMES)}

    # ---- clocks -------------------------------------------------------------------------
    cdef inline int64_t _raw(self, int64_t real) noexcept nogil:
        return real + <int64_t>(self.inj_offset + self.inj_drift * 1e-9 * <double>(real - self.inj_t0))

    cdef inline int64_t _fleet(self, int64_t raw) noexcept nogil:
        return raw - <int64_t>(self.clk_offset + self.clk_drift * 1e-9 * <double>(raw - self.clk_t0))

    cdef inline int64_t _stamp(self, cmsghdr* c, int hw) noexcept nogil:
        cdef scm_timestamping* t = <scm_timestamping*>CMSG_DATA(c)
        cdef int k = 2 if hw else 0
        if t.ts[k].tv_sec == 0 and t.ts[k].tv_nsec == 0:
            return 0
        return self._raw(t.ts[k].tv_sec * 1000000000 + t.ts[k].tv_nsec)

    # ---- the round ----------------------------------------------------------------------
    def run_round(self, int64_t round_no, int64_t deadline_mono_ns) -> bool:
        """Send this round's pairs, then process arrivals until the deadline. True if late."""
        cdef bint late
        with nogil:
            late = mono_ns() > deadline_mono_ns
            if late:
                self.cnt[C_LATE] += 1
            self._send_round(round_no)
            self._serve_until(deadline_mono_ns)
        return late

    def serve_until(self, int64_t deadline_mono_ns) -> None:
        """Answer probes and collect acks without sending (draining at shutdown)."""
        with nogil:
            self._serve_until(deadline_mono_ns)

    cdef void _send_round(self, int64_t round_no) noexcept nogil:
        cdef int e, pidx, s, i, sent, lead, n
        cdef uint32_t pair, seq
        cdef Slot* slot
        cdef uint8_t* p
        cdef int64_t now = mono_ns()
        cdef Sock* sk
        for e in range(self.nentries):
            pidx = <int>((round_no + self.e_off[e]) % self.e_nports[e])
            s = self.nic_base[self.e_nic[e]] + pidx
            sk = &self.socks[s]
            pair = self.next_pair
            slot = &self.slots[pair % NSLOTS]
            if slot.busy:
                self._emit(slot)  # its ack is long overdue: report it lost
            self.next_pair += 1
            memset(slot, 0, sizeof(Slot))
            slot.pair = pair
            slot.flow = self.e_flow[e] + pidx
            seq = self.e_seq[e]
            self.e_seq[e] += 1
            self.e_ring[e * SEQRING + seq % SEQRING] = pair
            slot.seq = seq
            slot.entry = e
            slot.sent_mono = now
            slot.busy = 1
            lead = 1 if sk.primer else 0  # msgs[0] is the primer when there is one
            n = lead + 2
            for i in range(n):
                p = self.bufs + i * PROBE_LEN
                write_header(p, KIND_PRIMER if i < lead else KIND_PROBE0 + i - lead, 0,
                             self.session, pair, seq, <uint64_t>self._raw(real_ns()))
                seal(p, PROBE_LEN, self.k0, self.k1)
                self.iovs[i].iov_base = p
                self.iovs[i].iov_len = PROBE_LEN
                self.addrs[i].sin_family = AF_INET
                self.addrs[i].sin_port = htons(self.dport)
                self.addrs[i].sin_addr.s_addr = htonl(self.e_ip[e])
                memset(&self.msgs[i], 0, sizeof(mmsghdr))
                self.msgs[i].msg_hdr.msg_name = &self.addrs[i]
                self.msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_in)
                self.msgs[i].msg_hdr.msg_iov = &self.iovs[i]
                self.msgs[i].msg_hdr.msg_iovlen = 1
            sent = sendmmsg(sk.fd, self.msgs, n, MSG_DONTWAIT)
            if sent < 0:
                sent = 0
            for i in range(sent):  # every datagram sent takes a timestamp key, the primer too
                sk.ts_pair[sk.tskey_next % TSRING] = pair
                sk.ts_which[sk.tskey_next % TSRING] = TS_PRIMER if i < lead else i - lead
                sk.tskey_next += 1
                if i >= lead:
                    slot.flags |= F_SENT0 << (i - lead)
            self.cnt[C_PRIMERS_SENT] += min(sent, lead)
            sent = max(sent - lead, 0)
            self.cnt[C_PAIRS_SENT] += 1
            self.cnt[C_PACKETS_SENT] += sent
            self.cnt[C_SEND_ERRORS] += 2 - sent

    cdef void _serve_until(self, int64_t deadline) noexcept nogil:
        cdef epoll_event events[MAX_EVENTS]
        cdef timespec ts
        cdef int64_t now, left
        cdef int n, i
        while True:
            now = mono_ns()
            self._expire(now)
            left = max(deadline - now, 0)
            if self.wq_head != self.wq_tail and self.waitq[self.wq_head % WAITQ].due - now < left:
                left = max(self.waitq[self.wq_head % WAITQ].due - now, 0)
            ts.tv_sec = left // 1000000000
            ts.tv_nsec = left % 1000000000
            n = epoll_pwait2(self.epfd, events, MAX_EVENTS, &ts, NULL)
            for i in range(n):
                if events[i].events & EPOLLERR:
                    self._drain_errqueue(<int>events[i].data.u64)
                if events[i].events & EPOLLIN:
                    self._drain(<int>events[i].data.u64)
            # Only now answer pairs still missing their second probe: had we been descheduled,
            # that probe may have been sitting in a socket we just drained.
            self._flush_waiting(mono_ns())
            self._flush_acks()
            if mono_ns() >= deadline:
                return

    # ---- TX timestamps ------------------------------------------------------------------
    cdef void _drain_errqueue(self, int s) noexcept nogil:
        cdef Sock* sk = &self.socks[s]
        cdef int n, i
        cdef cmsghdr* c
        cdef int64_t stamp
        cdef sock_extended_err* ee
        cdef uint32_t key
        cdef Slot* slot
        while True:
            self._prepare_rx(BATCH)
            n = recvmmsg(sk.fd, self.msgs, BATCH, MSG_ERRQUEUE | MSG_DONTWAIT, NULL)
            if n <= 0:
                return
            for i in range(n):
                stamp = 0
                ee = NULL
                c = CMSG_FIRSTHDR(&self.msgs[i].msg_hdr)
                while c != NULL:
                    if c.cmsg_level == SOL_SOCKET and c.cmsg_type == SO_TIMESTAMPING:
                        stamp = self._stamp(c, sk.hw)
                    elif c.cmsg_level == IPPROTO_IP and c.cmsg_type == IP_RECVERR:
                        ee = <sock_extended_err*>CMSG_DATA(c)
                    c = CMSG_NXTHDR(&self.msgs[i].msg_hdr, c)
                if ee == NULL or ee.ee_origin != SO_EE_ORIGIN_TIMESTAMPING or stamp == 0:
                    continue
                if ee.ee_info != SCM_TSTAMP_SND:
                    continue
                key = ee.ee_data
                slot = &self.slots[sk.ts_pair[key % TSRING] % NSLOTS]
                if key >= sk.tskey_next or sk.tskey_next - key > TSRING:
                    self.cnt[C_TX_TS_UNMATCHED] += 1
                    continue
                if sk.ts_which[key % TSRING] == TS_PRIMER:
                    continue  # a primer's own stamp: not needed
                if not slot.busy or slot.pair != sk.ts_pair[key % TSRING]:
                    self.cnt[C_TX_TS_UNMATCHED] += 1
                    continue
                self.cnt[C_TX_TS] += 1
                slot.tx[sk.ts_which[key % TSRING]] = stamp
                slot.flags |= F_TX0 << sk.ts_which[key % TSRING]
                self._maybe_complete(slot)

    # ---- arrivals -----------------------------------------------------------------------
    cdef void _prepare_rx(self, int n) noexcept nogil:
        cdef int i
        for i in range(n):
            self.iovs[i].iov_base = self.bufs + i * ACK_LEN * 2
            self.iovs[i].iov_len = ACK_LEN * 2
            memset(&self.msgs[i], 0, sizeof(mmsghdr))
            self.msgs[i].msg_hdr.msg_name = &self.addrs[i]
            self.msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_in)
            self.msgs[i].msg_hdr.msg_iov = &self.iovs[i]
            self.msgs[i].msg_hdr.msg_iovlen = 1
            self.msgs[i].msg_hdr.msg_control = self.ctrl + i * CTRL
            self.msgs[i].msg_hdr.msg_controllen = CTRL

    cdef void _drain(self, int s) noexcept nogil:
        cdef Sock* sk = &self.socks[s]
        cdef int n, i, bad
        cdef uint8_t* p
        cdef size_t length
        cdef cmsghdr* c
        cdef int64_t stamp
        while True:
            self._prepare_rx(BATCH)
            n = recvmmsg(sk.fd, self.msgs, BATCH, MSG_DONTWAIT, NULL)
            if n <= 0:
                return
            for i in range(n):
                p = self.bufs + i * ACK_LEN * 2
                length = self.msgs[i].msg_len
                if self.msgs[i].msg_hdr.msg_flags & 0x20:  # MSG_TRUNC: larger than any of ours
                    length = 0
                bad = check(p, length, self.k0, self.k1)
                if bad:
                    self.cnt[C_BAD_VERSION if bad == 4 else C_BAD_LEN + bad - 1] += 1
                    continue
                stamp = 0
                c = CMSG_FIRSTHDR(&self.msgs[i].msg_hdr)
                while c != NULL:
                    if c.cmsg_level == SOL_SOCKET and c.cmsg_type == SO_TIMESTAMPING:
                        stamp = self._stamp(c, sk.hw)
                    c = CMSG_NXTHDR(&self.msgs[i].msg_hdr, c)
                if p[3] == KIND_ACK:
                    self._on_ack(p)
                elif p[3] == KIND_PRIMER:  # it has done its job by arriving
                    if sk.responder:
                        self.cnt[C_PRIMERS_RX] += 1
                elif sk.responder:
                    if stamp == 0:
                        self.cnt[C_RX_NO_TS] += 1
                        stamp = self._raw(real_ns())
                    self._on_probe(s, p, stamp, &self.addrs[i])

    cdef void _on_ack(self, const uint8_t* p) noexcept nogil:
        cdef int k
        cdef const uint8_t* rec
        cdef uint32_t pair
        cdef Slot* slot
        if get_u64(p + 8) != self.session:
            self.cnt[C_STALE_ACK] += 1  # a replay of another session's ack
            return
        for k in range(ACK_RECORDS):
            rec = p + 32 + k * RECORD_LEN
            pair = get_u32(rec)
            slot = &self.slots[pair % NSLOTS]
            if not (rec[4] and slot.busy and slot.pair == pair and not slot.flags & F_ACKED):
                if k == 0:
                    self.cnt[C_STALE_ACK] += 1  # a replay, a duplicate, or for an expired pair
                continue
            self.cnt[C_ACKS_RX if k == 0 else C_RECOVERED] += 1
            slot.flags |= F_ACKED if k == 0 else F_ACKED | F_ACK_LOST
            if rec[4] & ACK_RX0:
                slot.rx[0] = <int64_t>get_u64(rec + 8)
                slot.rxf[0] = <int64_t>get_u64(rec + 24)
                slot.flags |= F_RX0
            if rec[4] & ACK_RX1:
                slot.rx[1] = <int64_t>get_u64(rec + 16)
                slot.rxf[1] = <int64_t>get_u64(rec + 32)
                slot.flags |= F_RX1
            self._maybe_complete(slot)
        self._on_bitmap(p)

    cdef void _on_bitmap(self, const uint8_t* p) noexcept nogil:
        """Answer the stream's pairs whose own acks (and records) were lost: a set bit says
        the receiver saw that probe. The stream is the acked pair's, whose slot still names
        it after the pair completed (slots are reused only NSLOTS pairs later)."""
        cdef uint32_t hpair = get_u32(p + 16)
        cdef Slot* hs = &self.slots[hpair % NSLOTS]
        cdef uint32_t top = get_u32(p + BITMAP_OFF)
        cdef uint64_t seen0 = get_u64(p + BITMAP_OFF + 8)
        cdef uint64_t seen1 = get_u64(p + BITMAP_OFF + 16)
        cdef uint64_t bit
        cdef uint32_t seq, pair
        cdef int32_t e = hs.entry
        cdef int i
        cdef Slot* slot
        if hs.sent_mono == 0 or hs.pair != hpair or not 0 <= e < self.nentries:
            return
        for i in range(BITMAP_PAIRS):
            bit = (<uint64_t>1) << i
            if not (seen0 | seen1) & bit:
                continue
            seq = top - <uint32_t>i
            pair = self.e_ring[e * SEQRING + seq % SEQRING]
            slot = &self.slots[pair % NSLOTS]
            if not (slot.busy and slot.pair == pair and slot.seq == seq and slot.entry == e) \
                    or slot.flags & F_ACKED:
                continue
            self.cnt[C_HEARD] += 1
            slot.flags |= F_ACKED | F_ACK_LOST
            if seen0 & bit:
                slot.flags |= F_HEARD0
            if seen1 & bit:
                slot.flags |= F_HEARD1
            self._maybe_complete(slot)

    cdef void _on_probe(self, int s, const uint8_t* p, int64_t stamp, sockaddr_in* src) noexcept nogil:
        cdef uint64_t session = get_u64(p + 8)
        cdef uint32_t pair = get_u32(p + 16)
        cdef uint32_t seq = get_u32(p + 20)
        cdef uint32_t ip = src.sin_addr.s_addr
        cdef uint16_t port = src.sin_port
        cdef int which = p[3] - KIND_PROBE0
        cdef uint64_t h = mix64(flow_key(session, ip, port) ^ pair)
        cdef uint32_t idx = self._rx_slot(h, ip, port, session, pair)
        cdef RxEntry* r = &self.rxtab[idx]
        cdef bint same = r.state != 0 and r.session == session and r.pair == pair \
            and r.ip == ip and r.port == port
        self.cnt[C_PROBES_RX] += 1
        if same and r.got & (1 << which):
            self.cnt[C_REPLAY] += 1
            return
        if same and r.state == 2:
            self.cnt[C_LATE_PROBE] += 1  # its pair was answered without it: counted lost
            return
        if not same:
            if r.state == 1:
                self._queue_ack(r)  # evicted while waiting: answer what it has
            memset(r, 0, sizeof(RxEntry))
            r.ip, r.port, r.session, r.pair, r.sock, r.seq = ip, port, session, pair, s, seq
            r.first_mono = mono_ns()
            r.state = 1
            self.generations += 1
            r.generation = self.generations
            if self.wq_tail - self.wq_head < WAITQ:
                self.waitq[self.wq_tail % WAITQ].index = idx
                self.waitq[self.wq_tail % WAITQ].generation = r.generation
                self.waitq[self.wq_tail % WAITQ].due = r.first_mono + self.pair_wait_ns
                self.wq_tail += 1
        r.rx[which] = stamp
        r.rxf[which] = self._fleet(stamp)
        r.got |= 1 << which
        if r.got == 3:
            self._queue_ack(r)

    cdef uint32_t _rx_slot(self, uint64_t h, uint32_t ip, uint16_t port, uint64_t session,
                           uint32_t pair) noexcept nogil:
        """4-way set: the pair's own entry, else a free or answered one, else the oldest.

        Evicting an entry still waiting for its second probe would answer that pair twice
        (half each), so waiting entries are the last resort."""
        cdef uint32_t base = <uint32_t>(h % (RXTAB // 4)) * 4
        cdef uint32_t i, pick = base
        cdef RxEntry* r
        for i in range(base, base + 4):
            r = &self.rxtab[i]
            if r.state != 0 and r.session == session and r.pair == pair and r.ip == ip \
                    and r.port == port:
                return i
        for i in range(base, base + 4):
            if self.rxtab[i].state != 1:
                return i
            if self.rxtab[i].first_mono < self.rxtab[pick].first_mono:
                pick = i
        return pick

    cdef void _flush_waiting(self, int64_t now) noexcept nogil:
        """Answer pairs whose second probe did not come in time (it was lost)."""
        cdef Waiting* w
        cdef RxEntry* r
        while self.wq_head != self.wq_tail:
            w = &self.waitq[self.wq_head % WAITQ]
            if w.due > now:
                return
            r = &self.rxtab[w.index]
            if r.state == 1 and r.generation == w.generation:
                self._queue_ack(r)
            self.wq_head += 1

    cdef void _queue_ack(self, RxEntry* r) noexcept nogil:
        cdef uint8_t* p
        cdef uint8_t* rec
        cdef uint8_t flags = 0
        cdef Hist* hi = self._history(r.session, r.ip, r.sock)
        if self.nacks and (self.ack_sock != r.sock or self.nacks == BATCH):
            self._flush_acks()
        self.ack_sock = r.sock
        p = self.ackbuf + self.nacks * ACK_LEN
        if r.got & 1:
            flags |= ACK_RX0
        if r.got & 2:
            flags |= ACK_RX1
        _mark_seen(hi, r.seq, r.got)
        write_header(p, KIND_ACK, 0, r.session, r.pair, r.seq, 0)
        rec = p + 32
        memset(rec, 0, ACK_RECORDS * RECORD_LEN)
        put_u32(rec, r.pair)
        rec[4] = flags
        put_u64(rec + 8, <uint64_t>r.rx[0])
        put_u64(rec + 16, <uint64_t>r.rx[1])
        put_u64(rec + 24, <uint64_t>r.rxf[0])
        put_u64(rec + 32, <uint64_t>r.rxf[1])
        memcpy(rec + RECORD_LEN, hi.rec[0], RECORD_LEN)
        memcpy(rec + 2 * RECORD_LEN, hi.rec[1], RECORD_LEN)
        memcpy(hi.rec[1], hi.rec[0], RECORD_LEN)
        memcpy(hi.rec[0], rec, RECORD_LEN)
        put_u32(p + BITMAP_OFF, hi.top)
        put_u32(p + BITMAP_OFF + 4, 0)
        put_u64(p + BITMAP_OFF + 8, hi.seen[0])
        put_u64(p + BITMAP_OFF + 16, hi.seen[1])
        seal(p, ACK_LEN, self.k0, self.k1)
        self.ackaddr[self.nacks].sin_family = AF_INET
        self.ackaddr[self.nacks].sin_port = r.port
        self.ackaddr[self.nacks].sin_addr.s_addr = r.ip
        self.ackiov[self.nacks].iov_base = p
        self.ackiov[self.nacks].iov_len = ACK_LEN
        memset(&self.ackmsg[self.nacks], 0, sizeof(mmsghdr))
        self.ackmsg[self.nacks].msg_hdr.msg_name = &self.ackaddr[self.nacks]
        self.ackmsg[self.nacks].msg_hdr.msg_namelen = sizeof(sockaddr_in)
        self.ackmsg[self.nacks].msg_hdr.msg_iov = &self.ackiov[self.nacks]
        self.ackmsg[self.nacks].msg_hdr.msg_iovlen = 1
        self.nacks += 1
        r.state = 2

    cdef Hist* _history(self, uint64_t session, uint32_t ip, int sock) noexcept nogil:
        """The stream's history entry (sender session and NIC address, our NIC's responder
        socket): its own in a 4-way set, else the set's least recently used, emptied (a new
        stream has no history to repeat). Two streams sharing one entry would empty it for
        each other at every ack, and no lost ack of theirs would be repaired."""
        cdef uint32_t base = <uint32_t>(
            mix64(flow_key(session, ip, 0) ^ <uint64_t>sock) % (HIST // 4)) * 4
        cdef uint32_t i, pick = base
        cdef Hist* hi
        self.hist_clock += 1
        for i in range(base, base + 4):
            hi = &self.hist[i]
            if hi.used and hi.session == session and hi.ip == ip and hi.sock == sock:
                hi.used = self.hist_clock
                return hi
            if hi.used < self.hist[pick].used:
                pick = i
        hi = &self.hist[pick]
        memset(hi, 0, sizeof(Hist))
        hi.ip, hi.sock, hi.session, hi.used = ip, sock, session, self.hist_clock
        return hi

    cdef void _flush_acks(self) noexcept nogil:
        cdef int sent
        if self.nacks == 0:
            return
        sent = sendmmsg(self.socks[self.ack_sock].fd, self.ackmsg, self.nacks, MSG_DONTWAIT)
        if sent < 0:
            sent = 0
        self.cnt[C_ACKS_SENT] += sent
        self.cnt[C_SEND_ERRORS] += self.nacks - sent
        self.nacks = 0

    # ---- samples ------------------------------------------------------------------------
    cdef void _maybe_complete(self, Slot* slot) noexcept nogil:
        cdef uint16_t want = F_ACKED
        if slot.flags & F_SENT0:
            want |= F_TX0
        if slot.flags & F_SENT1:
            want |= F_TX1
        if (slot.flags & want) == want:
            self._emit(slot)

    cdef void _expire(self, int64_t now) noexcept nogil:
        cdef Slot* slot
        while self.oldest_pair != self.next_pair:
            slot = &self.slots[self.oldest_pair % NSLOTS]
            if slot.busy and slot.pair == self.oldest_pair:
                if now - slot.sent_mono < self.timeout_ns:
                    return
                self.cnt[C_EXPIRED] += 1
                self._emit(slot)
            self.oldest_pair += 1

    cdef void _emit(self, Slot* slot) noexcept nogil:
        cdef size_t i = self.nsamples
        if i == self.cap_samples:
            if not self._grow():
                slot.busy = 0
                return
        self.s_flow[i] = slot.flow
        self.s_pair[i] = slot.pair
        self.s_ts[6 * i + 0] = slot.tx[0]
        self.s_ts[6 * i + 1] = slot.tx[1]
        self.s_ts[6 * i + 2] = slot.rx[0]
        self.s_ts[6 * i + 3] = slot.rx[1]
        self.s_ts[6 * i + 4] = slot.rxf[0]
        self.s_ts[6 * i + 5] = slot.rxf[1]
        self.s_flags[i] = slot.flags
        if slot.flags & F_ACK_LOST:
            self.cnt[C_ACKS_LOST] += 1
        self.nsamples += 1
        slot.busy = 0

    cdef bint _grow(self) noexcept nogil:
        cdef size_t cap = self.cap_samples * 2
        cdef uint32_t* f = <uint32_t*>realloc(self.s_flow, cap * sizeof(uint32_t))
        if f == NULL:
            return False
        self.s_flow = f
        f = <uint32_t*>realloc(self.s_pair, cap * sizeof(uint32_t))
        if f == NULL:
            return False
        self.s_pair = f
        cdef int64_t* t = <int64_t*>realloc(self.s_ts, cap * 6 * sizeof(int64_t))
        if t == NULL:
            return False
        self.s_ts = t
        cdef uint16_t* g = <uint16_t*>realloc(self.s_flags, cap * sizeof(uint16_t))
        if g == NULL:
            return False
        self.s_flags = g
        self.cap_samples = cap
        return True

    def take_samples(self) -> dict:
        """Every pair finished since the last call, as numpy arrays (raw clocks unless *_f)."""
        cdef size_t n = self.nsamples
        flow = np.empty(n, np.uint32)
        pair = np.empty(n, np.uint32)
        ts = np.empty((n, 6), np.int64)
        flags = np.empty(n, np.uint16)
        cdef uint32_t[:] fv = flow
        cdef uint32_t[:] pv = pair
        cdef int64_t[:, :] tv = ts
        cdef uint16_t[:] gv = flags
        if n:
            memcpy(&fv[0], self.s_flow, n * sizeof(uint32_t))
            memcpy(&pv[0], self.s_pair, n * sizeof(uint32_t))
            memcpy(&tv[0, 0], self.s_ts, n * 6 * sizeof(int64_t))
            memcpy(&gv[0], self.s_flags, n * sizeof(uint16_t))
        self.nsamples = 0
        return {
            "flow": flow, "pair": pair, "tx0": ts[:, 0], "tx1": ts[:, 1], "rx0": ts[:, 2],
            "rx1": ts[:, 3], "rx0_fleet": ts[:, 4], "rx1_fleet": ts[:, 5], "flags": flags,
        }

    def fleet_time(self, int64_t raw) -> int:
        return self._fleet(raw)


FLAG_SENT0, FLAG_SENT1, FLAG_TX0, FLAG_TX1 = F_SENT0, F_SENT1, F_TX0, F_TX1
FLAG_RX0, FLAG_RX1, FLAG_ACKED = F_RX0, F_RX1, F_ACKED
FLAG_ACK_LOST, FLAG_HEARD0, FLAG_HEARD1 = F_ACK_LOST, F_HEARD0, F_HEARD1
