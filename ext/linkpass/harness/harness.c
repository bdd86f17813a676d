/* linkpass_harness: drives a NCCL net plugin the way NCCL's proxy does, without NCCL or a GPU.
 *
 *   --role recv: init, devices, getProperties, listen; writes the 128-byte handle to --handle
 *                (temp file + rename); accept() on the setup (main) thread until a comm exists;
 *                regMr; a progress thread keeps --inflight irecv(n=1) posted and polls test().
 *   --role send: waits for the handle file, connect() until a comm exists, regMr; a progress
 *                thread keeps --inflight isend(tag=rank) posted and polls test() for --seconds,
 *                then sends a zero-byte end marker.
 *   --role abi:  loads every exported table (v12..v8), checks the name, calls init, devices and
 *                getProperties through each version's own struct layout.
 *
 * Every message k is a pattern unique to (k, word index), so the receiver proves each byte
 * arrived exactly once, in order, in the k-th posted receive.  Output: JSON lines on stdout
 * (events ready, props, sample, log, error, done); exit 0 on success, 2 on a plugin error,
 * 3 on a data mismatch, 1 on harness misuse.
 */

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lp_nccl.h"

#define MAX_INFLIGHT 32
#define SALT 0x9E3779B97F4A7C15ull

typedef struct {
  const char *plugin, *role, *handle_path;
  size_t msg_bytes;
  double seconds;
  int inflight, sample_ms, verify, version, rank, conns;
  double deadline_s;
} opts_t;

static opts_t o = {.msg_bytes = 4u << 20, .seconds = 5, .inflight = 8, .sample_ms = 100,
                   .verify = 1, .version = 12, .rank = -1, .conns = 1, .deadline_s = 120};
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;
static double t0;
static int (*status_json)(char *, size_t);

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void emit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void emit(const char *fmt, ...) {
  va_list ap;
  pthread_mutex_lock(&out_mu);
  printf("{\"t\":%.4f,\"wall\":%.4f,", now_s() - t0, wall_s());
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("}\n");
  fflush(stdout);
  pthread_mutex_unlock(&out_mu);
}

static void json_escape(const char *in, char *out, size_t cap) {
  size_t n = 0;
  for (; *in && n + 7 < cap; in++) {
    unsigned char c = (unsigned char)*in;
    if (c == '"' || c == '\\') {
      out[n++] = '\\';
      out[n++] = (char)c;
    } else if (c < 0x20) {
      n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
    } else {
      out[n++] = (char)c;
    }
  }
  out[n] = 0;
}

/* The logger NCCL would pass: every plugin log line becomes a JSON "log" event. */
static void logger(lp_log_level_t lvl, unsigned long flags, const char *file, int line,
                   const char *fmt, ...) {
  (void)flags;
  char msg[1024], esc[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  json_escape(msg, esc, sizeof(esc));
  const char *f = strrchr(file, '/');
  emit("\"event\":\"log\",\"level\":%d,\"where\":\"%s:%d\",\"msg\":\"%s\"", (int)lvl,
       f ? f + 1 : file, line, esc);
}

/* ---------------------------------------------------------------- version-neutral ops */

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **ctx);
  ncclResult_t (*devices)(int *n);
  ncclResult_t (*props)(int dev, char **name, int *speed, int *ptr, int *max_recvs);
  ncclResult_t (*listen)(void *ctx, void *h, void **lc);
  ncclResult_t (*connect)(void *ctx, void *h, void **sc);
  ncclResult_t (*accept)(void *lc, void **rc);
  ncclResult_t (*reg)(void *c, void *d, size_t s, void **mh);
  ncclResult_t (*dereg)(void *c, void *mh);
  ncclResult_t (*isend)(void *sc, void *d, size_t s, int tag, void *mh, void **req);
  ncclResult_t (*irecv)(void *rc, void *d, size_t s, int tag, void *mh, void **req);
  ncclResult_t (*test)(void *req, int *done, int *size);
  ncclResult_t (*close_send)(void *), (*close_recv)(void *), (*close_listen)(void *);
} ops_t;

static const lp_net_v12_t *n12;
static const lp_net_v11_t *n11;
static const lp_net_v10_t *n10;
static const lp_net_v9_t *n9;
static const lp_net_v8_t *n8;

#define PROPS_OUT(p)                                                                             \
  do {                                                                                           \
    *name = (p).name;                                                                            \
    *speed = (p).speed_mbps;                                                                     \
    *ptr = (p).ptr_support;                                                                      \
    *max_recvs = (p).max_recvs;                                                                  \
  } while (0)

/* v12 */
static ncclResult_t i12(void **ctx) {
  lp_comm_config_t cfg = {.traffic_class = -1};
  return n12->init(ctx, 1, &cfg, logger, NULL);
}
static ncclResult_t d12(int *n) { return n12->devices(n); }
static ncclResult_t p12(int dev, char **name, int *speed, int *ptr, int *max_recvs) {
  lp_props_v12_t p;
  ncclResult_t r = n12->getProperties(dev, &p);
  PROPS_OUT(p);
  return r;
}
static ncclResult_t l12(void *ctx, void *h, void **lc) { return n12->listen(ctx, 0, h, lc); }
static ncclResult_t c12(void *ctx, void *h, void **sc) {
  lp_dev_handle_t *dc = NULL;
  return n12->connect(ctx, 0, h, sc, &dc);
}
static ncclResult_t a12(void *lc, void **rc) {
  lp_dev_handle_t *dc = NULL;
  return n12->accept(lc, rc, &dc);
}
static ncclResult_t r12(void *c, void *d, size_t s, void **mh) {
  return n12->regMr(c, d, s, LP_PTR_HOST, mh);
}
static ncclResult_t dr12(void *c, void *mh) { return n12->deregMr(c, mh); }
static ncclResult_t s12(void *sc, void *d, size_t s, int tag, void *mh, void **req) {
  return n12->isend(sc, d, s, tag, mh, NULL, req);
}
static ncclResult_t rv12(void *rc, void *d, size_t s, int tag, void *mh, void **req) {
  return n12->irecv(rc, 1, &d, &s, &tag, &mh, NULL, req);
}
static ncclResult_t t12(void *req, int *done, int *size) { return n12->test(req, done, size); }

/* v11 differs from v12 only in the properties layout */
static ncclResult_t p11(int dev, char **name, int *speed, int *ptr, int *max_recvs) {
  lp_props_v11_t p;
  ncclResult_t r = n11->getProperties(dev, &p);
  PROPS_OUT(p);
  return r;
}
/* v10: no context */
static ncclResult_t i10(void **ctx) {
  *ctx = NULL;
  return n10->init(logger, NULL);
}
static ncclResult_t p10(int dev, char **name, int *speed, int *ptr, int *max_recvs) {
  lp_props_v9_t p;
  ncclResult_t r = n10->getProperties(dev, &p);
  PROPS_OUT(p);
  return r;
}
static ncclResult_t l10(void *ctx, void *h, void **lc) {
  (void)ctx;
  return n10->listen(0, h, lc);
}
static ncclResult_t c10(void *ctx, void *h, void **sc) {
  (void)ctx;
  lp_dev_handle_t *dc = NULL;
  lp_comm_config_t cfg = {.traffic_class = -1};
  return n10->connect(0, &cfg, h, sc, &dc);
}
/* v9: no profiler, no per-request profiler handle */
static ncclResult_t i9(void **ctx) {
  *ctx = NULL;
  return n9->init(logger);
}
static ncclResult_t p9(int dev, char **name, int *speed, int *ptr, int *max_recvs) {
  lp_props_v9_t p;
  ncclResult_t r = n9->getProperties(dev, &p);
  PROPS_OUT(p);
  return r;
}
static ncclResult_t c9(void *ctx, void *h, void **sc) {
  (void)ctx;
  lp_dev_handle_t *dc = NULL;
  return n9->connect(0, h, sc, &dc);
}
static ncclResult_t s9(void *sc, void *d, size_t s, int tag, void *mh, void **req) {
  return n9->isend(sc, d, s, tag, mh, req);
}
static ncclResult_t rv9(void *rc, void *d, size_t s, int tag, void *mh, void **req) {
  return n9->irecv(rc, 1, &d, &s, &tag, &mh, req);
}
/* v8: int sizes */
static ncclResult_t i8(void **ctx) {
  *ctx = NULL;
  return n8->init(logger);
}
static ncclResult_t p8(int dev, char **name, int *speed, int *ptr, int *max_recvs) {
  lp_props_v8_t p;
  ncclResult_t r = n8->getProperties(dev, &p);
  PROPS_OUT(p);
  return r;
}
static ncclResult_t c8(void *ctx, void *h, void **sc) {
  (void)ctx;
  lp_dev_handle_t *dc = NULL;
  return n8->connect(0, h, sc, &dc);
}
static ncclResult_t s8(void *sc, void *d, size_t s, int tag, void *mh, void **req) {
  return n8->isend(sc, d, (int)s, tag, mh, req);
}
static ncclResult_t rv8(void *rc, void *d, size_t s, int tag, void *mh, void **req) {
  int is = (int)s;
  return n8->irecv(rc, 1, &d, &is, &tag, &mh, req);
}

static int load_ops(void *lib, int version, ops_t *ops) {
  char sym[32];
  snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", version);
  void *t = dlsym(lib, sym);
  if (!t) return -1;
  memset(ops, 0, sizeof(*ops));
  /* v12's members from regMr on have the same layout in every version we drive (v9+). */
  switch (version) {
    case 12:
      n12 = t;
      *ops = (ops_t){n12->name, i12, d12, p12, l12, c12, a12, r12, dr12, s12, rv12, t12,
                     n12->closeSend, n12->closeRecv, n12->closeListen};
      break;
    case 11:
      n11 = t;
      n12 = t; /* identical apart from getProperties' struct */
      *ops = (ops_t){n11->name, i12, d12, p11, l12, c12, a12, r12, dr12, s12, rv12, t12,
                     n11->closeSend, n11->closeRecv, n11->closeListen};
      break;
    case 10:
      n10 = t;
      *ops = (ops_t){n10->name, i10, n10->devices, p10, l10, c10, NULL, NULL, NULL, NULL, NULL,
                     n10->test, n10->closeSend, n10->closeRecv, n10->closeListen};
      break;
    case 9:
      n9 = t;
      *ops = (ops_t){n9->name, i9, n9->devices, p9, l10, c9, NULL, NULL, NULL, s9, rv9,
                     n9->test, n9->closeSend, n9->closeRecv, n9->closeListen};
      break;
    case 8:
      n8 = t;
      *ops = (ops_t){n8->name, i8, n8->devices, p8, l10, c8, NULL, NULL, NULL, s8, rv8,
                     n8->test, n8->closeSend, n8->closeRecv, n8->closeListen};
      break;
    default:
      return -1;
  }
  return 0;
}

/* accept/regMr/deregMr/isend/irecv of v10 and the older listen: dispatch on the loaded table. */
static ncclResult_t a_old(void *lc, void **rc) {
  lp_dev_handle_t *dc = NULL;
  if (n10) return n10->accept(lc, rc, &dc);
  if (n9) return n9->accept(lc, rc, &dc);
  return n8->accept(lc, rc, &dc);
}
static ncclResult_t r_old(void *c, void *d, size_t s, void **mh) {
  if (n10) return n10->regMr(c, d, s, LP_PTR_HOST, mh);
  if (n9) return n9->regMr(c, d, s, LP_PTR_HOST, mh);
  return n8->regMr(c, d, s, LP_PTR_HOST, mh);
}
static ncclResult_t dr_old(void *c, void *mh) {
  if (n10) return n10->deregMr(c, mh);
  if (n9) return n9->deregMr(c, mh);
  return n8->deregMr(c, mh);
}
static ncclResult_t s10(void *sc, void *d, size_t s, int tag, void *mh, void **req) {
  return n10->isend(sc, d, s, tag, mh, NULL, req);
}
static ncclResult_t rv10(void *rc, void *d, size_t s, int tag, void *mh, void **req) {
  return n10->irecv(rc, 1, &d, &s, &tag, &mh, NULL, req);
}
static ncclResult_t l_old(void *ctx, void *h, void **lc) {
  (void)ctx;
  if (n10) return n10->listen(0, h, lc);
  if (n9) return n9->listen(0, h, lc);
  return n8->listen(0, h, lc);
}

static void fix_old_ops(ops_t *ops, int version) {
  if (version > 10) return;
  ops->accept = a_old;
  ops->reg = r_old;
  ops->dereg = dr_old;
  ops->listen = l_old;
  if (version == 10) {
    ops->isend = s10;
    ops->irecv = rv10;
  }
}

/* ---------------------------------------------------------------- data pattern */

/* Word i of message k on connection ci: distinct for every (k, i) of a connection, and every
 * connection has its own salt, so a byte landing in the wrong message, place or connection
 * is caught. */
static uint64_t salt(int ci) { return SALT ^ ((uint64_t)ci * 0xA24BAED4963EE407ull); }
static void fill(uint64_t *w, size_t words, uint64_t k, uint64_t s) {
  for (size_t i = 0; i < words; i++) w[i] = ((k << 32) | (i & 0xffffffffu)) ^ s;
}
static long check(const uint64_t *w, size_t words, uint64_t k, uint64_t s) {
  for (size_t i = 0; i < words; i++)
    if (w[i] != (((k << 32) | (i & 0xffffffffu)) ^ s)) return (long)i;
  return -1;
}

/* ---------------------------------------------------------------- progress thread */

typedef struct {
  void *req;
  uint64_t msg;
} slot_t;

/* One connection as NCCL's proxy sees it: its buffer, registration and requests in flight. */
typedef struct {
  void *comm, *lc, *mh;
  char *buf;
  slot_t slot[MAX_INFLIGHT];
  uint64_t next, end_msg, bytes, msgs, mismatches;
  int ended, end_posted;
} conn_t;

typedef struct {
  ops_t *ops;
  conn_t *conns;
  int nconns, send;
  int rc; /* exit code */
} prog_t;

static void sample(double *t_last, uint64_t bytes, uint64_t msgs) {
  double t = now_s();
  if (t - *t_last < o.sample_ms * 1e-3) return;
  *t_last = t;
  char st[4096] = "null";
  if (status_json && status_json(st, sizeof(st)) < 0) snprintf(st, sizeof(st), "null");
  emit("\"event\":\"sample\",\"bytes\":%llu,\"messages\":%llu,\"status\":%s",
       (unsigned long long)bytes, (unsigned long long)msgs, st);
}

typedef struct {
  const char *call;
  ncclResult_t rc;
} fail_t;

/* Posts what fits, then tests oldest-first; returns 1 if anything completed. */
static int drive(prog_t *p, int ci, double t, double end, fail_t *f) {
  ops_t *ops = p->ops;
  conn_t *c = &p->conns[ci];
  size_t words = o.msg_bytes / 8;
  int progressed = 0;
  for (int s = 0; s < o.inflight && !c->ended; s++) {
    if (c->slot[s].req) continue;
    char *b = c->buf + (size_t)s * o.msg_bytes;
    void *req = NULL;
    ncclResult_t r;
    if (p->send) {
      if (c->end_posted) break;
      size_t sz = o.msg_bytes;
      if (t >= end) {
        sz = 0; /* end marker */
      } else if (o.verify) {
        fill((uint64_t *)b, words, c->next, salt(ci));
      }
      r = ops->isend(c->comm, b, sz, o.rank, c->mh, &req);
      f->call = "isend";
      if (req && sz == 0) {
        c->end_posted = 1;
        c->end_msg = c->next;
      }
    } else {
      r = ops->irecv(c->comm, b, o.msg_bytes, 1 - o.rank, c->mh, &req);
      f->call = "irecv";
    }
    if (r != ncclSuccess) {
      f->rc = r;
      return -1;
    }
    if (!req) break; /* plugin busy: retry later, as NCCL does */
    c->slot[s].req = req;
    c->slot[s].msg = c->next++;
  }
  while (!c->ended) {
    int best = -1;
    for (int s = 0; s < o.inflight; s++)
      if (c->slot[s].req && (best < 0 || c->slot[s].msg < c->slot[best].msg)) best = s;
    if (best < 0) break;
    int done = 0, size = -1;
    ncclResult_t r = ops->test(c->slot[best].req, &done, &size);
    if (r != ncclSuccess) {
      f->call = "test";
      f->rc = r;
      return -1;
    }
    if (!done) break;
    progressed = 1;
    uint64_t k = c->slot[best].msg;
    c->slot[best].req = NULL;
    c->msgs++;
    if (p->send) {
      if (c->end_posted && k == c->end_msg) c->ended = 1;
      else c->bytes += (uint64_t)size;
    } else if (size == 0) {
      c->ended = 1;
    } else if ((size_t)size != o.msg_bytes) {
      c->mismatches++;
      emit("\"event\":\"mismatch\",\"conn\":%d,\"message\":%llu,\"size\":%d", ci,
           (unsigned long long)k, size);
    } else {
      const uint64_t *w = (const uint64_t *)(c->buf + (size_t)best * o.msg_bytes);
      long bad = o.verify ? check(w, words, k, salt(ci)) : -1;
      if (bad >= 0) {
        if (c->mismatches++ < 5)
          emit("\"event\":\"mismatch\",\"conn\":%d,\"message\":%llu,\"word\":%ld", ci,
               (unsigned long long)k, bad);
      } else if (!c->mismatches) {
        c->bytes += (uint64_t)size;
      }
    }
  }
  return progressed;
}

static void *progress(void *arg) {
  prog_t *p = arg;
  pthread_setname_np(pthread_self(), "progress");
  double start = now_s(), end = start + o.seconds, last_prog = start, max_stall = 0;
  double stall_at = 0, t_sample = 0;
  int first = 1;
  long idle_ns = 100000;
  fail_t f = {NULL, ncclSuccess};
  uint64_t bytes = 0, msgs = 0, mismatches = 0;
  if (p->send && !o.verify)
    for (int ci = 0; ci < p->nconns; ci++)
      for (int s = 0; s < o.inflight; s++)
        fill((uint64_t *)(p->conns[ci].buf + (size_t)s * o.msg_bytes), o.msg_bytes / 8, 0, 0);
  for (;;) {
    double t = now_s();
    if (t - start > o.deadline_s) {
      f.call = "harness-deadline";
      f.rc = ncclInternalError;
      break;
    }
    int progressed = 0, ended = 1;
    for (int ci = 0; ci < p->nconns; ci++) {
      int r = drive(p, ci, t, end, &f);
      if (r < 0) goto out;
      progressed |= r;
      ended &= p->conns[ci].ended;
    }
    if (progressed) {
      t = now_s();
      if (!first && t - last_prog > max_stall) {
        max_stall = t - last_prog;
        stall_at = last_prog - t0;
      }
      first = 0;
      last_prog = t;
    }
    bytes = msgs = mismatches = 0;
    for (int ci = 0; ci < p->nconns; ci++) {
      bytes += p->conns[ci].bytes;
      msgs += p->conns[ci].msgs;
      mismatches += p->conns[ci].mismatches;
    }
    if (ended) {
      f.call = NULL;
      break;
    }
    sample(&t_sample, bytes, msgs);
    /* Back off 0.1 .. 1 ms while nothing completes: 8 messages of 4 MiB in flight are ~20 ms,
     * and a tight loop would steal the CPU the plugin's I/O thread needs. */
    if (!progressed) {
      struct timespec ts = {0, idle_ns};
      nanosleep(&ts, NULL);
      idle_ns = idle_ns * 2 > 1000000 ? 1000000 : idle_ns * 2;
    } else {
      idle_ns = 100000;
    }
  }
out:
  if (f.call) emit("\"event\":\"error\",\"call\":\"%s\",\"rc\":%d", f.call, (int)f.rc);
  t_sample = 0;
  sample(&t_sample, bytes, msgs);
  double el = last_prog - start;
  emit("\"event\":\"done\",\"role\":\"%s\",\"version\":%d,\"conns\":%d,\"bytes\":%llu,"
       "\"bytes_verified\":%llu,\"messages\":%llu,\"mismatches\":%llu,\"errors\":%d,"
       "\"max_stall_ms\":%.3f,\"max_stall_at\":%.3f,\"elapsed_s\":%.3f,\"gbit_s\":%.3f,"
       "\"verify\":%d",
       p->send ? "send" : "recv", o.version, p->nconns, (unsigned long long)bytes,
       (unsigned long long)(p->send || o.verify ? bytes : 0), (unsigned long long)msgs,
       (unsigned long long)mismatches, f.call ? 1 : 0, max_stall * 1e3, stall_at, el,
       el > 0 ? (double)bytes * 8 / el / 1e9 : 0.0, o.verify);
  p->rc = f.call ? 2 : mismatches ? 3 : 0;
  return NULL;
}

/* ---------------------------------------------------------------- roles */

static int write_handles(const char *path, const char *h, int n) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) return -1;
  int ok = fwrite(h, LP_HANDLE_BYTES, (size_t)n, f) == (size_t)n;
  ok &= fclose(f) == 0;
  return ok && rename(tmp, path) == 0 ? 0 : -1;
}

static int read_handles(const char *path, char *h, int n, double timeout) {
  double until = now_s() + timeout;
  while (now_s() < until) {
    FILE *f = fopen(path, "rb");
    if (f) {
      size_t got = fread(h, LP_HANDLE_BYTES, (size_t)n, f);
      fclose(f);
      if (got == (size_t)n) return 0;
    }
    usleep(10000);
  }
  return -1;
}

/* Setup thread, as NCCL's: listen on all, publish the handles, then accept / connect every
 * connection with non-blocking calls until each returns a comm. */
static int setup(ops_t *ops, void *ctx, conn_t *conns, int send) {
  char *handles = calloc((size_t)o.conns, LP_HANDLE_BYTES);
  ncclResult_t r;
  double ts = now_s();
  if (!send) {
    for (int i = 0; i < o.conns; i++) {
      if ((r = ops->listen(ctx, handles + i * LP_HANDLE_BYTES, &conns[i].lc)) != ncclSuccess) {
        emit("\"event\":\"error\",\"call\":\"listen\",\"rc\":%d", (int)r);
        return 2;
      }
    }
    if (write_handles(o.handle_path, handles, o.conns) != 0) {
      emit("\"event\":\"error\",\"call\":\"write-handle\",\"rc\":-1");
      return 1;
    }
  } else if (read_handles(o.handle_path, handles, o.conns, 60) != 0) {
    emit("\"event\":\"error\",\"call\":\"read-handle\",\"rc\":-1");
    return 1;
  }
  for (int pending = o.conns; pending > 0;) {
    pending = 0;
    for (int i = 0; i < o.conns; i++) {
      if (conns[i].comm) continue;
      r = send ? ops->connect(ctx, handles + i * LP_HANDLE_BYTES, &conns[i].comm)
               : ops->accept(conns[i].lc, &conns[i].comm);
      if (r != ncclSuccess) {
        emit("\"event\":\"error\",\"call\":\"%s\",\"rc\":%d", send ? "connect" : "accept",
             (int)r);
        return 2;
      }
      pending += conns[i].comm == NULL;
    }
    if (pending) usleep(1000);
    if (now_s() - ts > 60) {
      emit("\"event\":\"error\",\"call\":\"setup-timeout\",\"rc\":-1");
      return 2;
    }
  }
  free(handles);
  size_t bytes = (size_t)o.inflight * o.msg_bytes;
  for (int i = 0; i < o.conns; i++) {
    conns[i].buf = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095); /* C11: size % align */
    if (!conns[i].buf || (r = ops->reg(conns[i].comm, conns[i].buf, bytes, &conns[i].mh))) {
      emit("\"event\":\"error\",\"call\":\"regMr\",\"rc\":%d", (int)r);
      return 2;
    }
    memset(conns[i].buf, 0, bytes);
  }
  emit("\"event\":\"ready\",\"role\":\"%s\",\"conns\":%d,\"setup_ms\":%.1f",
       send ? "send" : "recv", o.conns, (now_s() - ts) * 1e3);
  return 0;
}

static int run_rank(ops_t *ops, int send) {
  void *ctx = NULL;
  ncclResult_t r = ops->init(&ctx);
  if (r != ncclSuccess) {
    emit("\"event\":\"error\",\"call\":\"init\",\"rc\":%d", (int)r);
    return 2;
  }
  int ndev = 0;
  ops->devices(&ndev);
  char *name = NULL;
  int speed = 0, ptr = 0, maxr = 0;
  if (ndev < 1 || ops->props(0, &name, &speed, &ptr, &maxr) != ncclSuccess) {
    emit("\"event\":\"error\",\"call\":\"getProperties\",\"rc\":-1");
    return 2;
  }
  emit("\"event\":\"props\",\"plugin\":\"%s\",\"ndev\":%d,\"dev_name\":\"%s\",\"speed\":%d,"
       "\"ptr_support\":%d,\"max_recvs\":%d",
       ops->name, ndev, name ? name : "", speed, ptr, maxr);
  conn_t *conns = calloc((size_t)o.conns, sizeof(conn_t));
  int rc = setup(ops, ctx, conns, send);
  if (rc != 0) return rc;
  prog_t p = {.ops = ops, .conns = conns, .nconns = o.conns, .send = send};
  pthread_t th;
  pthread_create(&th, NULL, progress, &p);
  pthread_join(th, NULL);
  for (int i = 0; i < o.conns; i++) {
    ops->dereg(conns[i].comm, conns[i].mh);
    if (send) ops->close_send(conns[i].comm);
    else ops->close_recv(conns[i].comm);
    if (conns[i].lc) ops->close_listen(conns[i].lc);
    free(conns[i].buf);
  }
  free(conns);
  if (o.version >= 11 && n12 && n12->finalize) n12->finalize(ctx);
  return p.rc;
}

static int run_abi(void *lib) {
  int bad = 0;
  for (int v = 12; v >= 8; v--) {
    ops_t ops;
    n12 = NULL, n11 = NULL, n10 = NULL, n9 = NULL, n8 = NULL;
    if (load_ops(lib, v, &ops) != 0) {
      emit("\"event\":\"abi\",\"version\":%d,\"found\":false", v);
      bad++;
      continue;
    }
    void *ctx = NULL;
    int ndev = 0, speed = 0, ptr = 0, maxr = 0;
    char *name = NULL;
    ncclResult_t ri = ops.init(&ctx);
    ncclResult_t rd = ops.devices(&ndev);
    ncclResult_t rp = ndev > 0 ? ops.props(0, &name, &speed, &ptr, &maxr) : ncclInternalError;
    emit("\"event\":\"abi\",\"version\":%d,\"found\":true,\"name\":\"%s\",\"init\":%d,"
         "\"devices\":%d,\"ndev\":%d,\"props\":%d,\"dev_name\":\"%s\",\"speed\":%d,"
         "\"ptr_support\":%d,\"max_recvs\":%d",
         v, ops.name ? ops.name : "", (int)ri, (int)rd, ndev, (int)rp, name ? name : "", speed,
         ptr, maxr);
    if (v >= 11 && n12->finalize) n12->finalize(ctx);
  }
  return bad ? 2 : 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: linkpass_harness --plugin SO --role send|recv|abi [--handle FILE]\n"
          "  [--msg-bytes N] [--seconds S] [--inflight K<=32] [--sample-ms MS] [--verify 0|1]\n"
          "  [--version 8..12] [--deadline S] [--conns N<=64]\n");
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      usage();
      return 1;
    }
    if (!strcmp(a, "--plugin")) o.plugin = v;
    else if (!strcmp(a, "--role")) o.role = v;
    else if (!strcmp(a, "--handle")) o.handle_path = v;
    else if (!strcmp(a, "--msg-bytes")) o.msg_bytes = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--seconds")) o.seconds = atof(v);
    else if (!strcmp(a, "--inflight")) o.inflight = atoi(v);
    else if (!strcmp(a, "--sample-ms")) o.sample_ms = atoi(v);
    else if (!strcmp(a, "--verify")) o.verify = atoi(v);
    else if (!strcmp(a, "--version")) o.version = atoi(v);
    else if (!strcmp(a, "--deadline")) o.deadline_s = atof(v);
    else if (!strcmp(a, "--conns")) o.conns = atoi(v);
    else {
      usage();
      return 1;
    }
    i++;
  }
  if (!o.plugin || !o.role || o.inflight < 1 || o.inflight > MAX_INFLIGHT || o.msg_bytes % 8 ||
      o.conns < 1 || o.conns > 64 ||
      o.msg_bytes == 0) {
    usage();
    return 1;
  }
  t0 = now_s();
  void *lib = dlopen(o.plugin, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    emit("\"event\":\"error\",\"call\":\"dlopen\",\"rc\":-1");
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  status_json = (int (*)(char *, size_t))dlsym(lib, "linkpass_status_json");
  if (!strcmp(o.role, "abi")) return run_abi(lib);
  int send = !strcmp(o.role, "send");
  if ((!send && strcmp(o.role, "recv")) || !o.handle_path) {
    usage();
    return 1;
  }
  if (o.rank < 0) o.rank = send ? 0 : 1;
  ops_t ops;
  if (load_ops(lib, o.version, &ops) != 0) {
    emit("\"event\":\"error\",\"call\":\"dlsym\",\"rc\":-1");
    return 1;
  }
  fix_old_ops(&ops, o.version);
  return run_rank(&ops, send);
}
