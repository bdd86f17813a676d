/* Logical comms: one send or receive comm striped over one lane per NIC.
 *
 * Wire protocol (every lane is a byte stream carrying 48-byte frames):
 *   HELLO  connector -> acceptor, first frame of a lane: nonce of the comm + lane index.
 *   DATA   sender -> receiver: chunk seq, message seq, offset, length, message size, tag; then
 *          `len` payload bytes.
 *   CTRL   both ways, at least every hb_interval: heartbeat.  From the receiver it carries the
 *          cumulative ack (every chunk seq < ack has arrived) and whether the receiver drains
 *          its end of the lane; the first CTRL on a new lane confirms it to the sender.
 *
 * Failover: the sender keeps every chunk (the caller's buffer; isend completes only once all
 * its chunks are acked).  When a lane dies (socket error, EOF, heartbeat silence, link down
 * from netlink) every chunk in flight on it goes back to a resend queue and leaves on another
 * live lane.  The receiver places chunks by (message, offset), so arrival order across lanes
 * does not matter, and it drops a chunk whose seq it already has, so a chunk that made it
 * before its lane died is never delivered twice.  A dead lane is reconnected by the sender
 * every reconnect_ms; the receiver keeps its listening sockets for that.  All socket work
 * happens on one I/O thread per comm, so NCCL's setup and progress threads only take a lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "lp.h"

#define LP_MAGIC 0x4c503031u /* "LP01" */
#define LP_RING 4096         /* chunk seq window; power of two */
#define LP_MAX_REQS 64
#define LP_MAX_PEND 16
#define LP_HANDLE_NICS 12
#define LP_DISCARD 65536
#define LP_READ_BUDGET (8u << 20)
#define LP_ACK_EVERY 4      /* chunks */
#define LP_LOWAT (256u << 10) /* receive wake-up threshold within a chunk */

enum { F_DATA = 1, F_CTRL = 2, F_HELLO = 3 };
enum { LANE_DOWN = 0, LANE_CONNECTING, LANE_HELLO, LANE_UP };
enum { CH_FREE = 0, CH_QUEUED, CH_INFLIGHT };
/* Request life: the caller's thread takes a FREE slot and POSTs it; the I/O thread adopts it in
 * posting order (ACTIVE), completes it (DONE); test() hands the slot back (FREE).  Only atomics
 * are shared, so test() and isend() never wait for the I/O thread's lock. */
enum { R_FREE = 0, R_POSTED, R_ACTIVE, R_DONE };
#define CTRL_DRAINED 1u
#define CTRL_BYE 2u /* the peer is closing the comm: what follows is not a failure */

typedef struct {
  uint32_t magic;
  uint32_t type;
  uint64_t seq;      /* DATA: chunk seq; CTRL: cumulative ack; HELLO: comm nonce */
  uint64_t msg;      /* DATA: message seq; HELLO: lane index */
  uint64_t msg_size; /* DATA: whole message size */
  uint64_t off;      /* DATA: offset of this chunk in the message */
  uint32_t len;      /* DATA: payload bytes following */
  uint32_t flags;    /* CTRL: CTRL_DRAINED; DATA: low 32 bits of the tag */
} lp_frame_t;
_Static_assert(sizeof(lp_frame_t) == 48, "frame header is 48 bytes on the wire");

typedef struct {
  uint32_t magic;
  uint16_t nnics;
  uint16_t pad;
  uint64_t nonce;
  uint64_t pending; /* connector-local: the comm being built across connect() calls */
  struct {
    uint32_t ip;
    uint16_t port;
    uint16_t pad;
  } nics[LP_HANDLE_NICS];
} lp_handle_t;
_Static_assert(sizeof(lp_handle_t) <= LP_HANDLE_BYTES, "handle fits NCCL's 128 bytes");

struct lp_comm;
typedef struct {
  struct lp_comm *comm;
  int state; /* R_*, atomic: the hand-off between NCCL's threads and the I/O thread */
  int busy;
  uint64_t msg;
  char *data;
  size_t size; /* send: bytes; recv: capacity */
  int tag;
  size_t msg_size, got_bytes; /* recv */
  uint64_t nchunks, acked; /* send */
} lp_req_t;

typedef struct lp_unexp {
  struct lp_unexp *next;
  uint64_t msg, off, msg_size;
  uint32_t len;
  char *buf;
} lp_unexp_t;

typedef struct {
  lp_req_t *req;
  uint64_t off;
  uint32_t len;
  int8_t lane;
  uint8_t state;
} lp_chunk_t;

typedef struct {
  int fd, state, nic, ever_up, remote_drained, ctrl_due, lowat;
  uint64_t t_state, t_rx, t_tx, inflight;
  /* transmit side: one frame at a time, header then payload */
  lp_frame_t txh;
  size_t tx_hoff, txp_len, txp_off;
  const char *txp;
  lp_req_t *tx_req;
  int tx_busy;
  /* receive side */
  lp_frame_t rxh;
  size_t rx_hoff, rx_left;
  int rx_payload, rx_discard;
  char *rx_dst;
  uint64_t rx_seq;
  lp_unexp_t *rx_unexp;
} lp_lane_t;

typedef struct lp_comm {
  int is_send;
  uint64_t nonce;
  pthread_mutex_t mu;
  pthread_t thr;
  int thr_started, efd;
  atomic_int stop;
  int nlanes, nup, nclean, returned, rr, warned_all_drained, peer_closed;
  lp_lane_t lanes[LP_MAX_NICS];
  uint32_t rip[LP_MAX_NICS];
  uint16_t rport[LP_MAX_NICS];
  int lfd[LP_MAX_NICS], lnic[LP_MAX_NICS], nlfd;
  int pfd[LP_MAX_PEND], pnic[LP_MAX_PEND];
  lp_frame_t phdr[LP_MAX_PEND];
  size_t poff[LP_MAX_PEND];
  uint64_t pt[LP_MAX_PEND];
  lp_req_t reqs[LP_MAX_REQS];
  pthread_mutex_t post_mu; /* callers only: slot allocation and posting order */
  uint64_t post_seq;       /* next message seq handed out to a caller (atomic) */
  uint64_t next_msg;       /* I/O thread: next message seq to adopt */
  uint64_t seen_post;      /* I/O thread: post_seq at the last adoption pass */
  int polling;             /* I/O thread is (about to be) in poll(): posters must wake it */
  /* sender */
  lp_chunk_t ch[LP_RING];
  uint64_t next_seq, cursor, acked;
  uint64_t rsq[2 * LP_RING];
  uint64_t rsq_head, rsq_tail;
  /* receiver */
  uint8_t got[LP_RING];
  uint64_t cum, cum_acked;
  lp_unexp_t *unexp;
  ncclResult_t error;
  uint64_t nopath_since, t_created;
  char *discard;
} lp_comm_t;

typedef struct {
  lp_comm_t *comm;
  int taken;
} lp_listen_t;

static const lp_transport_t *tp = &lp_tcp_transport;

static uint64_t ms_ns(uint64_t ms) { return ms * 1000000ull; }

static uint64_t rand64(void) {
  uint64_t v = lp_now_ns() ^ ((uint64_t)getpid() << 32);
  int fd = open("/dev/urandom", 0);
  if (fd >= 0) {
    if (read(fd, &v, sizeof(v)) != (ssize_t)sizeof(v)) v ^= (uint64_t)fd;
    close(fd);
  }
  return v;
}

/* ------------------------------------------------------------------ requests */

static int req_state(lp_req_t *r) { return __atomic_load_n(&r->state, __ATOMIC_ACQUIRE); }
static void req_set(lp_req_t *r, int st) { __atomic_store_n(&r->state, st, __ATOMIC_RELEASE); }

static void req_check_send_done(lp_req_t *r) {
  if (r->acked == r->nchunks && r->busy == 0) req_set(r, R_DONE);
}

/* Caller side, under post_mu: a free slot, not yet visible to the I/O thread. */
static lp_req_t *req_alloc(lp_comm_t *c) {
  for (int i = 0; i < LP_MAX_REQS; i++) {
    if (req_state(&c->reqs[i]) == R_FREE) {
      lp_req_t *r = &c->reqs[i];
      memset(r, 0, sizeof(*r));
      r->comm = c;
      return r;
    }
  }
  return NULL;
}

static lp_req_t *recv_req_for(lp_comm_t *c, uint64_t msg) {
  for (int i = 0; i < LP_MAX_REQS; i++)
    if (req_state(&c->reqs[i]) == R_ACTIVE && c->reqs[i].msg == msg) return &c->reqs[i];
  return NULL;
}

/* Accounts `len` bytes of message `msg_size` as placed in r; a size larger than the posted
 * buffer is the caller's error (NCCL posts a receive at least as large as the send). */
static void recv_account(lp_comm_t *c, lp_req_t *r, uint64_t msg_size, size_t len) {
  if (msg_size > r->size) {
    LP_WARN("LinkPass: message of %llu bytes for a %zu-byte receive",
            (unsigned long long)msg_size, r->size);
    __atomic_store_n(&c->error, ncclInvalidUsage, __ATOMIC_RELEASE);
    return;
  }
  r->msg_size = msg_size;
  r->got_bytes += len;
  if (r->got_bytes >= r->msg_size) req_set(r, R_DONE);
}

static void unexp_deliver(lp_comm_t *c, lp_req_t *r) {
  lp_unexp_t **pp = &c->unexp;
  while (*pp) {
    lp_unexp_t *u = *pp;
    if (u->msg != r->msg) {
      pp = &u->next;
      continue;
    }
    *pp = u->next;
    if (u->msg_size <= r->size && u->len) memcpy(r->data + u->off, u->buf, u->len);
    recv_account(c, r, u->msg_size, u->len);
    free(u->buf);
    free(u);
  }
}

/* ------------------------------------------------------------------ lanes */

static void rsq_push(lp_comm_t *c, uint64_t s) {
  c->rsq[c->rsq_tail++ % (2 * LP_RING)] = s;
}

static void lane_dead(lp_comm_t *c, int idx, const char *why, uint64_t now) {
  lp_lane_t *l = &c->lanes[idx];
  int was_up = l->state == LANE_UP;
  if (l->fd >= 0) tp->close(l->fd);
  l->fd = -1;
  l->state = LANE_DOWN;
  l->t_state = now;
  l->remote_drained = 0;
  if (l->tx_busy && l->tx_req) {
    l->tx_req->busy--;
    req_check_send_done(l->tx_req);
  }
  l->tx_busy = 0;
  l->tx_req = NULL;
  if (l->rx_payload && l->rx_unexp) {
    free(l->rx_unexp->buf);
    free(l->rx_unexp);
  }
  l->rx_unexp = NULL;
  l->rx_payload = 0;
  l->rx_hoff = 0;
  uint64_t n = 0, bytes = 0;
  if (c->is_send) {
    for (uint64_t s = c->acked; s < c->cursor; s++) {
      lp_chunk_t *ch = &c->ch[s % LP_RING];
      if (ch->state == CH_INFLIGHT && ch->lane == idx) {
        ch->state = CH_QUEUED;
        ch->lane = -1;
        rsq_push(c, s);
        n++;
        bytes += ch->len;
      }
    }
    l->inflight = 0;
    atomic_fetch_add(&lp_stats.resent_chunks, n);
    atomic_fetch_add(&lp_stats.resent_bytes, bytes);
  }
  if (was_up && c->peer_closed) {
    LP_INFO("LinkPass: %s lane %d (%s) closed by the peer", c->is_send ? "send" : "recv", idx,
            lp_nics[l->nic].name);
  } else if (was_up) {
    atomic_fetch_add(&lp_stats.failovers, 1);
    LP_WARN("LinkPass: %s lane %d (%s) failed: %s; %llu chunks re-queued on other NICs",
            c->is_send ? "send" : "recv", idx, lp_nics[l->nic].name, why,
            (unsigned long long)n);
  }
}

static void lane_up(lp_comm_t *c, int idx, uint64_t now) {
  lp_lane_t *l = &c->lanes[idx];
  l->state = LANE_UP;
  l->t_state = now;
  l->t_rx = now;
  if (l->ever_up) {
    atomic_fetch_add(&lp_stats.failbacks, 1);
    LP_INFO("LinkPass: %s lane %d (%s) is back", c->is_send ? "send" : "recv", idx,
            lp_nics[l->nic].name);
  }
  l->ever_up = 1;
}

static void frame_init(lp_frame_t *f, uint32_t type) {
  memset(f, 0, sizeof(*f));
  f->magic = LP_MAGIC;
  f->type = type;
}

static int lane_drained(lp_lane_t *l) { return lp_nic_drained(l->nic) || l->remote_drained; }

/* May this lane take a chunk now?  Re-sent chunks ignore the per-lane window: the window only
 * shrinks on the cumulative ack, which is stuck behind exactly those chunks after a failover.
 * Drained lanes carry nothing while a clean lane is up; if FleetLens drained every live NIC,
 * slow beats stuck, so they are used anyway. */
static int sched_ok(lp_comm_t *c, lp_lane_t *l) {
  return c->is_send && l->state == LANE_UP && lp_nic_usable(l->nic) &&
         (!lane_drained(l) || c->nclean == 0) &&
         (l->inflight < lp_cfg.lane_window_bytes || c->rsq_head != c->rsq_tail);
}

static int have_chunk(lp_comm_t *c) {
  return c->rsq_head != c->rsq_tail || c->cursor < c->next_seq;
}

static int64_t pick_chunk(lp_comm_t *c) {
  while (c->rsq_head != c->rsq_tail) {
    uint64_t s = c->rsq[c->rsq_head++ % (2 * LP_RING)];
    if (s >= c->acked && c->ch[s % LP_RING].state == CH_QUEUED) return (int64_t)s;
  }
  while (c->cursor < c->next_seq) {
    uint64_t s = c->cursor++;
    if (c->ch[s % LP_RING].state == CH_QUEUED) return (int64_t)s;
  }
  return -1;
}

/* Chooses the next frame for an idle lane: control first (acks must not wait behind data),
 * then a chunk if the lane may carry data. */
static int next_frame(lp_comm_t *c, int idx, uint64_t now) {
  lp_lane_t *l = &c->lanes[idx];
  if (l->state != LANE_UP && l->state != LANE_HELLO) return 0;
  l->tx_hoff = 0;
  l->txp = NULL;
  l->txp_len = l->txp_off = 0;
  l->tx_req = NULL;
  if (l->ctrl_due || now - l->t_tx >= ms_ns(lp_cfg.hb_interval_ms)) {
    frame_init(&l->txh, F_CTRL);
    l->txh.seq = c->is_send ? 0 : c->cum;
    if (!c->is_send) c->cum_acked = c->cum;
    l->txh.flags = lp_nic_drained(l->nic) ? CTRL_DRAINED : 0;
    l->ctrl_due = 0;
    l->t_tx = now;
    l->tx_busy = 1;
    return 1;
  }
  if (!sched_ok(c, l)) return 0;
  int64_t s = pick_chunk(c);
  if (s < 0) return 0;
  lp_chunk_t *ch = &c->ch[(uint64_t)s % LP_RING];
  ch->state = CH_INFLIGHT;
  ch->lane = (int8_t)idx;
  frame_init(&l->txh, F_DATA);
  l->txh.seq = (uint64_t)s;
  l->txh.msg = ch->req->msg;
  l->txh.msg_size = ch->req->size;
  l->txh.off = ch->off;
  l->txh.len = ch->len;
  l->txh.flags = (uint32_t)ch->req->tag;
  l->txp = ch->req->data + ch->off;
  l->txp_len = ch->len;
  l->tx_req = ch->req;
  ch->req->busy++;
  l->inflight += ch->len;
  l->t_tx = now;
  l->tx_busy = 1;
  return 1;
}

static void lane_write(lp_comm_t *c, int idx, uint64_t now) {
  lp_lane_t *l = &c->lanes[idx];
  for (int frames = 0; frames < 32 && l->fd >= 0; frames++) {
    if (!l->tx_busy && !next_frame(c, idx, now)) return;
    struct iovec iov[2];
    int n = 0;
    if (l->tx_hoff < sizeof(lp_frame_t)) {
      iov[n].iov_base = (char *)&l->txh + l->tx_hoff;
      iov[n++].iov_len = sizeof(lp_frame_t) - l->tx_hoff;
    }
    if (l->txp_off < l->txp_len) {
      iov[n].iov_base = (char *)l->txp + l->txp_off;
      iov[n++].iov_len = l->txp_len - l->txp_off;
    }
    ssize_t w = n ? tp->sendv(l->fd, iov, n) : 0;
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      lane_dead(c, idx, strerror(errno), now);
      return;
    }
    size_t left = (size_t)w;
    size_t h = sizeof(lp_frame_t) - l->tx_hoff;
    if (h > left) h = left;
    l->tx_hoff += h;
    left -= h;
    l->txp_off += left;
    atomic_fetch_add(&lp_nics[l->nic].tx_bytes, (uint64_t)w);
    if (l->tx_hoff < sizeof(lp_frame_t) || l->txp_off < l->txp_len) return; /* socket full */
    l->tx_busy = 0;
    if (l->tx_req) {
      l->tx_req->busy--;
      req_check_send_done(l->tx_req);
      l->tx_req = NULL;
    }
  }
}

/* ------------------------------------------------------------------ receive path */

static void sender_ack(lp_comm_t *c, uint64_t cum) {
  if (cum > c->next_seq) cum = c->next_seq;
  for (; c->acked < cum; c->acked++) {
    lp_chunk_t *ch = &c->ch[c->acked % LP_RING];
    if (ch->state == CH_INFLIGHT && ch->lane >= 0) {
      lp_lane_t *l = &c->lanes[ch->lane];
      l->inflight = l->inflight > ch->len ? l->inflight - ch->len : 0;
    }
    ch->state = CH_FREE;
    if (ch->req) {
      ch->req->acked++;
      req_check_send_done(ch->req);
    }
    ch->req = NULL;
  }
}

static void chunk_complete(lp_comm_t *c, int idx) {
  lp_lane_t *l = &c->lanes[idx];
  l->rx_payload = 0;
  lp_unexp_t *u = l->rx_unexp;
  l->rx_unexp = NULL;
  uint64_t s = l->rx_seq;
  if (l->rx_discard || c->got[s % LP_RING]) {
    if (u) {
      free(u->buf);
      free(u);
    }
    return;
  }
  c->got[s % LP_RING] = 1;
  while (c->got[c->cum % LP_RING]) c->got[c->cum++ % LP_RING] = 0;
  /* Another copy of this chunk still streaming on another lane must not touch the caller's
   * buffer any more: the message may complete and be handed back. */
  for (int j = 0; j < c->nlanes; j++) {
    lp_lane_t *o = &c->lanes[j];
    if (j != idx && o->rx_payload && o->rx_seq == s) o->rx_discard = 1;
  }
  lp_req_t *r = recv_req_for(c, l->rxh.msg);
  if (u) {
    if (r) {
      if (u->msg_size <= r->size && u->len) memcpy(r->data + u->off, u->buf, u->len);
      recv_account(c, r, u->msg_size, u->len);
      free(u->buf);
      free(u);
    } else {
      u->next = c->unexp;
      c->unexp = u;
    }
  } else if (r) {
    recv_account(c, r, l->rxh.msg_size, l->rxh.len);
  }
  /* Ack when a message completes (the sender's isend is waiting for it) or every few chunks
   * (keeps the lane windows open); heartbeats carry the ack point in between. */
  if ((r && req_state(r) == R_DONE) || c->cum - c->cum_acked >= LP_ACK_EVERY) l->ctrl_due = 1;
}

static void data_header(lp_comm_t *c, int idx) {
  lp_lane_t *l = &c->lanes[idx];
  lp_frame_t *h = &l->rxh;
  uint64_t s = h->seq;
  l->rx_seq = s;
  l->rx_left = h->len;
  l->rx_discard = 0;
  l->rx_unexp = NULL;
  l->rx_dst = NULL;
  if (s < c->cum || s - c->cum >= LP_RING || c->got[s % LP_RING] || h->off + h->len > h->msg_size) {
    l->rx_discard = 1; /* duplicate (resent after a failover) or nonsense */
  } else {
    lp_req_t *r = recv_req_for(c, h->msg);
    if (r && h->msg_size <= r->size) {
      l->rx_dst = r->data + h->off;
    } else if (r) {
      recv_account(c, r, h->msg_size, 0); /* records the size error */
      l->rx_discard = 1;
    } else {
      lp_unexp_t *u = calloc(1, sizeof(*u));
      char *buf = h->len ? malloc(h->len) : NULL;
      if (!u || (h->len && !buf)) {
        free(u);
        free(buf);
        l->rx_discard = 1; /* not acked: the sender keeps it; lane dies below if it persists */
      } else {
        u->msg = h->msg;
        u->off = h->off;
        u->len = h->len;
        u->msg_size = h->msg_size;
        u->buf = buf;
        l->rx_unexp = u;
        l->rx_dst = buf;
      }
    }
  }
  l->rx_payload = 1;
  if (h->len == 0) chunk_complete(c, idx);
}

/* Before waiting on a receive lane, tell the kernel how many bytes are worth a wake-up: the rest
 * of the frame header, or of the chunk (up to LP_LOWAT).  Without it poll() fires for every
 * segment and the I/O thread reads ~100 KiB per wake-up instead of several hundred. */
static void lane_lowat(lp_lane_t *l) {
  if (!tp->set_rcvlowat) return;
  size_t want = l->rx_payload ? l->rx_left : sizeof(lp_frame_t) - l->rx_hoff;
  if (want > LP_LOWAT) want = LP_LOWAT;
  if (want < 1) want = 1;
  if ((int)want != l->lowat && tp->set_rcvlowat(l->fd, (int)want) == 0) l->lowat = (int)want;
}

static void lane_read(lp_comm_t *c, int idx, uint64_t now) {
  lp_lane_t *l = &c->lanes[idx];
  size_t budget = LP_READ_BUDGET;
  while (l->fd >= 0 && budget > 0) {
    ssize_t n;
    if (!l->rx_payload) {
      n = tp->recv(l->fd, (char *)&l->rxh + l->rx_hoff, sizeof(lp_frame_t) - l->rx_hoff);
    } else {
      size_t want = l->rx_left;
      char *dst = l->rx_dst;
      if (l->rx_discard) {
        dst = c->discard;
        if (want > LP_DISCARD) want = LP_DISCARD;
      }
      n = tp->recv(l->fd, dst, want);
    }
    if (n == 0) {
      lane_dead(c, idx, "peer closed", now);
      return;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        if (!c->is_send) lane_lowat(l);
        return;
      }
      lane_dead(c, idx, strerror(errno), now);
      return;
    }
    l->t_rx = now;
    budget = budget > (size_t)n ? budget - (size_t)n : 0;
    atomic_fetch_add(&lp_nics[l->nic].rx_bytes, (uint64_t)n);
    if (l->rx_payload) {
      if (!l->rx_discard) l->rx_dst += n;
      l->rx_left -= (size_t)n;
      if (l->rx_left == 0) chunk_complete(c, idx);
      continue;
    }
    l->rx_hoff += (size_t)n;
    if (l->rx_hoff < sizeof(lp_frame_t)) continue;
    l->rx_hoff = 0;
    if (l->rxh.magic != LP_MAGIC) {
      lane_dead(c, idx, "bad frame magic", now);
      return;
    }
    if (l->rxh.type == F_CTRL) {
      if (l->rxh.flags & CTRL_BYE) c->peer_closed = 1;
      if (c->is_send) {
        sender_ack(c, l->rxh.seq);
        l->remote_drained = (l->rxh.flags & CTRL_DRAINED) != 0;
        if (l->state == LANE_HELLO) lane_up(c, idx, now);
      }
    } else if (l->rxh.type == F_DATA && !c->is_send) {
      data_header(c, idx);
    } else {
      lane_dead(c, idx, "unexpected frame", now);
      return;
    }
  }
}

/* ------------------------------------------------------------------ receiver: new lanes */

static void pend_close(lp_comm_t *c, int i) {
  tp->close(c->pfd[i]);
  c->pfd[i] = -1;
}

static void accept_new(lp_comm_t *c, int li) {
  for (;;) {
    int fd = tp->accept(c->lfd[li]);
    if (fd < 0) return;
    int slot = -1;
    for (int i = 0; i < LP_MAX_PEND; i++)
      if (c->pfd[i] < 0) slot = i;
    if (slot < 0) {
      tp->close(fd);
      continue;
    }
    c->pfd[slot] = fd;
    c->pnic[slot] = c->lnic[li];
    c->poff[slot] = 0;
    c->pt[slot] = lp_now_ns();
  }
}

static void pend_read(lp_comm_t *c, int i, uint64_t now) {
  ssize_t n = tp->recv(c->pfd[i], (char *)&c->phdr[i] + c->poff[i], sizeof(lp_frame_t) - c->poff[i]);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    pend_close(c, i);
    return;
  }
  if (n < 0) return;
  c->poff[i] += (size_t)n;
  if (c->poff[i] < sizeof(lp_frame_t)) return;
  lp_frame_t *h = &c->phdr[i];
  if (h->magic != LP_MAGIC || h->type != F_HELLO || h->seq != c->nonce || h->msg >= LP_MAX_NICS) {
    LP_WARN("LinkPass: rejected a connection with a wrong hello");
    pend_close(c, i);
    return;
  }
  int idx = (int)h->msg;
  lp_lane_t *l = &c->lanes[idx];
  if (l->fd >= 0) lane_dead(c, idx, "replaced by a new connection", now);
  l->fd = c->pfd[i];
  l->nic = c->pnic[i];
  l->lowat = 1; /* socket default */
  c->pfd[i] = -1;
  l->ctrl_due = 1; /* confirm the lane to the sender right away */
  l->t_tx = now;
  if (idx >= c->nlanes) c->nlanes = idx + 1;
  lane_up(c, idx, now);
}

/* ------------------------------------------------------------------ timers */

static void lane_timers(lp_comm_t *c, int idx, uint64_t now) {
  lp_lane_t *l = &c->lanes[idx];
  if (l->state != LANE_DOWN && !lp_nic_usable(l->nic)) {
    lane_dead(c, idx, "link down (netlink)", now);
    return;
  }
  if ((l->state == LANE_UP || l->state == LANE_HELLO) &&
      now - l->t_rx > ms_ns(lp_cfg.hb_timeout_ms)) {
    lane_read(c, idx, now); /* bytes below the wake-up threshold still prove the lane alive */
    if (l->fd >= 0 && now - l->t_rx > ms_ns(lp_cfg.hb_timeout_ms)) {
      lane_dead(c, idx, "heartbeat timeout", now);
      return;
    }
    if (l->fd < 0) return;
  }
  if (!c->is_send) return;
  if (l->state == LANE_CONNECTING && now - l->t_state > ms_ns(lp_cfg.connect_timeout_ms)) {
    lane_dead(c, idx, "connect timeout", now);
    return;
  }
  if (l->state == LANE_DOWN && c->rport[idx] && !c->peer_closed && lp_nic_usable(l->nic) &&
      (l->t_state == 0 || now - l->t_state >= ms_ns(lp_cfg.reconnect_ms))) {
    l->t_state = now;
    l->fd = tp->connect_start(&lp_nics[l->nic], c->rip[idx], c->rport[idx]);
    if (l->fd >= 0) l->state = LANE_CONNECTING;
  }
}

static void connecting_progress(lp_comm_t *c, int idx, uint64_t now) {
  lp_lane_t *l = &c->lanes[idx];
  int r = tp->connect_done(l->fd);
  if (r < 0) {
    lane_dead(c, idx, "connect failed", now);
    return;
  }
  if (r == 0) return;
  l->state = LANE_HELLO;
  l->t_rx = now;
  l->t_tx = now;
  l->rx_hoff = 0;
  l->rx_payload = 0;
  frame_init(&l->txh, F_HELLO);
  l->txh.seq = c->nonce;
  l->txh.msg = (uint64_t)idx;
  l->tx_hoff = 0;
  l->txp = NULL;
  l->txp_len = l->txp_off = 0;
  l->tx_req = NULL;
  l->tx_busy = 1;
}

static int work_pending(lp_comm_t *c) {
  if (c->is_send && c->acked < c->next_seq) return 1;
  for (int i = 0; i < LP_MAX_REQS; i++) {
    int st = req_state(&c->reqs[i]);
    if (st == R_POSTED || st == R_ACTIVE) return 1;
  }
  return 0;
}

/* Takes posted requests into the protocol state in posting order.  A send waits here while the
 * chunk window is full (its chunks need seq numbers within LP_RING of the ack point). */
static void adopt(lp_comm_t *c) {
  c->seen_post = __atomic_load_n(&c->post_seq, __ATOMIC_SEQ_CST);
  while (c->next_msg < c->seen_post) {
    lp_req_t *r = NULL;
    for (int i = 0; i < LP_MAX_REQS && !r; i++)
      if (req_state(&c->reqs[i]) == R_POSTED && c->reqs[i].msg == c->next_msg) r = &c->reqs[i];
    if (!r) return; /* still being filled in by the caller */
    if (c->is_send) {
      uint64_t nch = r->nchunks;
      if (c->next_seq + nch - c->acked > LP_RING) return;
      size_t cb = lp_cfg.chunk_bytes;
      for (uint64_t k = 0; k < nch; k++) {
        lp_chunk_t *ch = &c->ch[(c->next_seq + k) % LP_RING];
        ch->req = r;
        ch->off = k * cb;
        ch->len = (uint32_t)(k + 1 == nch ? r->size - k * cb : cb);
        ch->lane = -1;
        ch->state = CH_QUEUED;
      }
      c->next_seq += nch;
    }
    req_set(r, R_ACTIVE);
    c->next_msg++;
    if (!c->is_send) unexp_deliver(c, r);
  }
}

static void path_timer(lp_comm_t *c, uint64_t now) {
  int nup = 0, nclean = 0;
  for (int i = 0; i < c->nlanes; i++) {
    lp_lane_t *l = &c->lanes[i];
    nup += l->state == LANE_UP;
    nclean += l->state == LANE_UP && lp_nic_usable(l->nic) && !lane_drained(l);
  }
  c->nup = nup;
  c->nclean = nclean;
  if (c->is_send && nup > 0 && nclean == 0 && !c->warned_all_drained) {
    LP_WARN("LinkPass: every live NIC is drained; using drained NICs rather than stopping");
    c->warned_all_drained = 1;
  } else if (nclean > 0) {
    c->warned_all_drained = 0;
  }
  if (nup > 0 || !c->returned || !work_pending(c)) {
    c->nopath_since = 0;
    return;
  }
  if (!c->nopath_since) c->nopath_since = now;
  if (c->error == ncclSuccess && now - c->nopath_since > ms_ns(lp_cfg.timeout_ms)) {
    __atomic_store_n(&c->error, ncclSystemError, __ATOMIC_RELEASE);
    atomic_fetch_add(&lp_stats.errors, 1);
    LP_WARN("LinkPass: no usable NIC for %llu ms; failing the %s comm",
            (unsigned long long)lp_cfg.timeout_ms, c->is_send ? "send" : "recv");
  }
}

/* ------------------------------------------------------------------ I/O thread */

#define LP_MAX_PFDS (1 + 2 * LP_MAX_NICS + LP_MAX_PEND)

static void *comm_thread(void *arg) {
  lp_comm_t *c = arg;
  pthread_setname_np(pthread_self(), c->is_send ? "lp-send-io" : "lp-recv-io");
  struct pollfd pf[LP_MAX_PFDS];
  int kind[LP_MAX_PFDS], who[LP_MAX_PFDS];
  pthread_mutex_lock(&c->mu);
  while (!atomic_load(&c->stop)) {
    adopt(c);
    int n = 0;
    pf[n] = (struct pollfd){.fd = c->efd, .events = POLLIN};
    kind[n++] = 0;
    uint64_t now = lp_now_ns();
    /* Rotate which lane is served first so no NIC is starved of chunks by its neighbours. */
    c->rr = c->nlanes ? (c->rr + 1) % c->nlanes : 0;
    for (int j = 0; j < c->nlanes; j++) {
      int i = (c->rr + j) % c->nlanes;
      lp_lane_t *l = &c->lanes[i];
      if (l->fd < 0) continue;
      short ev = POLLIN;
      if (l->state == LANE_CONNECTING)
        ev = POLLOUT;
      else if (l->tx_busy || l->ctrl_due || (sched_ok(c, l) && have_chunk(c)))
        ev |= POLLOUT;
      pf[n] = (struct pollfd){.fd = l->fd, .events = ev};
      kind[n] = 1;
      who[n++] = i;
    }
    for (int i = 0; i < c->nlfd; i++) {
      pf[n] = (struct pollfd){.fd = c->lfd[i], .events = POLLIN};
      kind[n] = 2;
      who[n++] = i;
    }
    for (int i = 0; i < LP_MAX_PEND; i++) {
      if (c->pfd[i] < 0) continue;
      pf[n] = (struct pollfd){.fd = c->pfd[i], .events = POLLIN};
      kind[n] = 3;
      who[n++] = i;
    }
    pthread_mutex_unlock(&c->mu);
    __atomic_store_n(&c->polling, 1, __ATOMIC_SEQ_CST);
    int tmo = __atomic_load_n(&c->post_seq, __ATOMIC_SEQ_CST) != c->seen_post ? 0 : 5;
    poll(pf, (nfds_t)n, tmo);
    __atomic_store_n(&c->polling, 0, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&c->mu);
    adopt(c);
    now = lp_now_ns();
    for (int k = 0; k < n; k++) {
      if (!pf[k].revents && kind[k] != 1) continue;
      if (kind[k] == 0) {
        uint64_t v;
        if (read(c->efd, &v, sizeof(v)) < 0) { /* nothing queued: fine */
        }
      } else if (kind[k] == 1) {
        int i = who[k];
        lp_lane_t *l = &c->lanes[i];
        if (l->fd != pf[k].fd) continue; /* replaced meanwhile */
        if (l->state == LANE_CONNECTING) {
          if (pf[k].revents) connecting_progress(c, i, now);
          continue;
        }
        if (pf[k].revents & (POLLIN | POLLERR | POLLHUP)) lane_read(c, i, now);
        /* a busy lane is only worth a write when the socket has room again */
        if (!l->tx_busy || (pf[k].revents & POLLOUT)) lane_write(c, i, now);
      } else if (kind[k] == 2) {
        accept_new(c, who[k]);
      } else if (c->pfd[who[k]] == pf[k].fd) {
        pend_read(c, who[k], now);
      }
    }
    for (int i = 0; i < LP_MAX_PEND; i++)
      if (c->pfd[i] >= 0 && now > c->pt[i] && now - c->pt[i] > ms_ns(2000)) pend_close(c, i);
    for (int i = 0; i < c->nlanes; i++) lane_timers(c, i, now);
    path_timer(c, now);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

static void wake(lp_comm_t *c) {
  if (!__atomic_load_n(&c->polling, __ATOMIC_SEQ_CST)) return; /* it adopts before sleeping */
  uint64_t one = 1;
  if (write(c->efd, &one, sizeof(one)) < 0) { /* counter saturated: thread is awake anyway */
  }
}

static lp_comm_t *comm_new(int is_send) {
  lp_comm_t *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->discard = malloc(LP_DISCARD);
  c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (!c->discard || c->efd < 0) {
    free(c->discard);
    if (c->efd >= 0) close(c->efd);
    free(c);
    return NULL;
  }
  c->is_send = is_send;
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_init(&c->post_mu, NULL);
  for (int i = 0; i < LP_MAX_NICS; i++) {
    c->lanes[i].fd = -1;
    c->lanes[i].nic = i % lp_nnics;
    c->lfd[i] = -1;
  }
  for (int i = 0; i < LP_MAX_PEND; i++) c->pfd[i] = -1;
  c->t_created = lp_now_ns();
  atomic_fetch_add(&lp_stats.comms, 1);
  return c;
}

static int comm_start(lp_comm_t *c) {
  if (pthread_create(&c->thr, NULL, comm_thread, c) != 0) return -1;
  c->thr_started = 1;
  return 0;
}

/* Best effort: tell the peer on every lane at a frame boundary that this is an orderly close,
 * so its lanes ending now are not failovers (nor WARN lines in NCCL's log). */
static void say_bye(lp_comm_t *c) {
  for (int i = 0; i < c->nlanes; i++) {
    lp_lane_t *l = &c->lanes[i];
    if (l->fd < 0 || l->state != LANE_UP || l->tx_busy) continue;
    lp_frame_t f;
    frame_init(&f, F_CTRL);
    f.seq = c->is_send ? 0 : c->cum;
    f.flags = CTRL_BYE;
    struct iovec iov = {.iov_base = &f, .iov_len = sizeof(f)};
    if (tp->sendv(l->fd, &iov, 1) != (ssize_t)sizeof(f)) { /* full socket: the peer will see EOF */
    }
  }
}

static void comm_free(lp_comm_t *c) {
  if (c->thr_started) {
    atomic_store(&c->stop, 1);
    wake(c);
    pthread_join(c->thr, NULL);
  }
  say_bye(c);
  for (int i = 0; i < LP_MAX_NICS; i++) {
    if (c->lanes[i].fd >= 0) tp->close(c->lanes[i].fd);
    if (c->lanes[i].rx_unexp) {
      free(c->lanes[i].rx_unexp->buf);
      free(c->lanes[i].rx_unexp);
    }
    if (c->lfd[i] >= 0) tp->close(c->lfd[i]);
  }
  for (int i = 0; i < LP_MAX_PEND; i++)
    if (c->pfd[i] >= 0) tp->close(c->pfd[i]);
  while (c->unexp) {
    lp_unexp_t *u = c->unexp;
    c->unexp = u->next;
    free(u->buf);
    free(u);
  }
  close(c->efd);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->post_mu);
  free(c->discard);
  atomic_fetch_sub(&lp_stats.comms, 1);
  free(c);
  lp_status_write(); /* final counters of this comm are visible without waiting a period */
}

/* ------------------------------------------------------------------ NCCL-facing calls */

ncclResult_t lp_listen(int dev, void *handle, void **listen_comm) {
  (void)dev; /* one logical device spanning every NIC */
  lp_comm_t *c = comm_new(0);
  lp_listen_t *lc = calloc(1, sizeof(*lc));
  if (!c || !lc) {
    if (c) comm_free(c);
    free(lc);
    return ncclSystemError;
  }
  lp_handle_t *h = handle;
  memset(h, 0, LP_HANDLE_BYTES);
  h->magic = LP_MAGIC;
  c->nonce = h->nonce = rand64();
  int nh = lp_nnics < LP_HANDLE_NICS ? lp_nnics : LP_HANDLE_NICS;
  for (int i = 0; i < nh; i++) {
    uint16_t port = 0;
    int fd = tp->listen(&lp_nics[i], &port);
    h->nics[i].ip = lp_nics[i].ip;
    if (fd < 0) {
      LP_WARN("LinkPass: cannot listen on %s: %s", lp_nics[i].name, strerror(errno));
      continue;
    }
    h->nics[i].port = port;
    c->lfd[c->nlfd] = fd;
    c->lnic[c->nlfd++] = i;
  }
  h->nnics = (uint16_t)nh;
  if (c->nlfd == 0 || comm_start(c) != 0) {
    comm_free(c);
    free(lc);
    return ncclSystemError;
  }
  lc->comm = c;
  *listen_comm = lc;
  return ncclSuccess;
}

ncclResult_t lp_connect(int dev, void *handle, void **send_comm) {
  (void)dev;
  lp_handle_t *h = handle;
  *send_comm = NULL;
  if (h->magic != LP_MAGIC || h->nnics == 0 || h->nnics > LP_HANDLE_NICS) {
    LP_WARN("LinkPass: connect got a handle that is not LinkPass's");
    return ncclInternalError;
  }
  lp_comm_t *c = (lp_comm_t *)(uintptr_t)h->pending;
  if (!c) {
    c = comm_new(1);
    if (!c) return ncclSystemError;
    c->nonce = h->nonce;
    c->nlanes = lp_nnics > h->nnics ? lp_nnics : h->nnics;
    if (c->nlanes > LP_MAX_NICS) c->nlanes = LP_MAX_NICS;
    for (int i = 0; i < c->nlanes; i++) {
      c->rip[i] = h->nics[i % h->nnics].ip;
      c->rport[i] = h->nics[i % h->nnics].port;
    }
    if (comm_start(c) != 0) {
      comm_free(c);
      return ncclSystemError;
    }
    h->pending = (uint64_t)(uintptr_t)c;
  }
  pthread_mutex_lock(&c->mu);
  int ready = c->nup > 0;
  if (ready) c->returned = 1;
  uint64_t age = lp_now_ns() - c->t_created;
  pthread_mutex_unlock(&c->mu);
  if (ready) {
    h->pending = 0;
    *send_comm = c;
    return ncclSuccess;
  }
  if (age > ms_ns(lp_cfg.timeout_ms)) {
    LP_WARN("LinkPass: no lane came up within %llu ms", (unsigned long long)lp_cfg.timeout_ms);
    h->pending = 0;
    comm_free(c);
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t lp_accept(void *listen_comm, void **recv_comm) {
  lp_listen_t *lc = listen_comm;
  *recv_comm = NULL;
  if (lc->taken) return ncclInternalError;
  lp_comm_t *c = lc->comm;
  pthread_mutex_lock(&c->mu);
  int ready = c->nup > 0;
  if (ready) c->returned = 1;
  pthread_mutex_unlock(&c->mu);
  if (ready) {
    lc->taken = 1; /* the comm keeps the listening sockets for reconnecting lanes */
    *recv_comm = c;
  }
  return ncclSuccess;
}

ncclResult_t lp_close_listen(void *listen_comm) {
  lp_listen_t *lc = listen_comm;
  if (!lc) return ncclSuccess;
  if (!lc->taken) comm_free(lc->comm);
  free(lc);
  return ncclSuccess;
}

static ncclResult_t comm_error(lp_comm_t *c) {
  return __atomic_load_n(&c->error, __ATOMIC_ACQUIRE);
}

/* Fills a free slot and publishes it; NULL when all LP_MAX_REQS slots are in use. */
static lp_req_t *post(lp_comm_t *c, char *data, size_t size, int tag, uint64_t nchunks) {
  pthread_mutex_lock(&c->post_mu);
  lp_req_t *r = req_alloc(c);
  if (r) {
    r->data = data;
    r->size = size;
    r->tag = tag;
    r->nchunks = nchunks;
    r->msg = __atomic_load_n(&c->post_seq, __ATOMIC_RELAXED);
    req_set(r, R_POSTED);
    __atomic_store_n(&c->post_seq, r->msg + 1, __ATOMIC_SEQ_CST);
  }
  pthread_mutex_unlock(&c->post_mu);
  if (r) wake(c);
  return r;
}

ncclResult_t lp_isend(void *send_comm, void *data, size_t size, int tag, void **request) {
  lp_comm_t *c = send_comm;
  *request = NULL;
  size_t cb = lp_cfg.chunk_bytes;
  uint64_t nch = size ? (size + cb - 1) / cb : 1;
  if (nch > LP_RING / 2) return ncclInvalidUsage;
  ncclResult_t err = comm_error(c);
  if (err == ncclSuccess) *request = post(c, data, size, tag, nch);
  return err;
}

ncclResult_t lp_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                      void **request) {
  lp_comm_t *c = recv_comm;
  *request = NULL;
  if (n != 1) return ncclInternalError; /* maxRecvs is 1 */
  ncclResult_t err = comm_error(c);
  if (err == ncclSuccess) *request = post(c, data[0], sizes[0], tags ? tags[0] : 0, 0);
  return err;
}

ncclResult_t lp_test(void *request, int *done, int *size) {
  lp_req_t *r = request;
  *done = 0;
  if (req_state(r) != R_DONE) return comm_error(r->comm);
  *done = 1;
  if (size) *size = (int)(r->comm->is_send ? r->size : r->msg_size);
  req_set(r, R_FREE);
  return ncclSuccess;
}

ncclResult_t lp_close_send(void *send_comm) {
  if (send_comm) comm_free(send_comm);
  return ncclSuccess;
}

ncclResult_t lp_close_recv(void *recv_comm) {
  if (recv_comm) comm_free(recv_comm);
  return ncclSuccess;
}
