/* The ABI tables NCCL looks up (ncclNetPlugin_v12 first, then v11..v8), configuration from the
 * environment, logging through NCCL's logger, and the small calls that need no comm state.
 *
 * LinkPass exposes ONE network device: a logical NIC made of every physical NIC of the host.
 * Each comm stripes over all of them and moves traffic between them on failure; exposing the
 * NICs one by one would let NCCL pin a comm to a single NIC, which is what failover avoids.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lp.h"

#define EXPORT __attribute__((visibility("default")))

lp_config_t lp_cfg;
static lp_logger_t logger;
static int init_refs;
static int debug_stderr;
static char dev_name[] = "linkpass";
static int ctx_token;

uint64_t lp_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void lp_log(lp_log_level_t lvl, const char *file, int line, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (logger) logger(lvl, LP_SUBSYS_NET, file, line, "%s", buf);
  if (debug_stderr || (!logger && lvl == LP_LOG_WARN)) fprintf(stderr, "%s\n", buf);
}

static uint64_t env_u64(const char *name, uint64_t dflt, uint64_t lo, uint64_t hi) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end = NULL;
  unsigned long long x = strtoull(v, &end, 10);
  if (!end || *end || x < lo || x > hi) {
    LP_WARN("LinkPass: ignoring %s=%s (want %llu..%llu)", name, v, (unsigned long long)lo,
            (unsigned long long)hi);
    return dflt;
  }
  return x;
}

static void env_str(const char *name, char *out, size_t cap) {
  const char *v = getenv(name);
  snprintf(out, cap, "%s", v ? v : "");
}

static void config_load(void) {
  debug_stderr = getenv("LINKPASS_DEBUG") != NULL;
  lp_cfg.timeout_ms = env_u64("LINKPASS_TIMEOUT_MS", 10000, 100, 86400000);
  lp_cfg.hb_interval_ms = env_u64("LINKPASS_HB_INTERVAL_MS", 50, 5, 10000);
  lp_cfg.hb_timeout_ms = env_u64("LINKPASS_HB_TIMEOUT_MS", 500, 20, 600000);
  lp_cfg.user_timeout_ms = env_u64("LINKPASS_TCP_USER_TIMEOUT_MS", 1000, 100, 600000);
  lp_cfg.reconnect_ms = env_u64("LINKPASS_RECONNECT_MS", 200, 10, 60000);
  lp_cfg.connect_timeout_ms = env_u64("LINKPASS_CONNECT_TIMEOUT_MS", 500, 50, 60000);
  lp_cfg.chunk_bytes = env_u64("LINKPASS_CHUNK_BYTES", 512 * 1024, 4096, 64u << 20);
  lp_cfg.lane_window_bytes = env_u64("LINKPASS_LANE_WINDOW_BYTES", 4u << 20, 4096, 1u << 30);
  env_str("LINKPASS_DECISION_FILE", lp_cfg.decision_file, sizeof(lp_cfg.decision_file));
  env_str("LINKPASS_STATUS_FILE", lp_cfg.status_file, sizeof(lp_cfg.status_file));
}

/* ------------------------------------------------------------------ init / properties */

static ncclResult_t init_common(lp_logger_t log) {
  if (log) logger = log;
  if (init_refs++ > 0) return ncclSuccess;
  config_load();
  if (lp_nics_discover() == 0) {
    LP_WARN("LinkPass: no usable NIC (set LINKPASS_NICS=eth0,eth1,...)");
    init_refs = 0;
    return ncclSystemError;
  }
  if (lp_health_start() != 0) {
    init_refs = 0;
    return ncclSystemError;
  }
  for (int i = 0; i < lp_nnics; i++)
    LP_INFO("LinkPass: NIC %d %s link %s%s", i, lp_nics[i].name,
            lp_nic_usable(i) ? "up" : "down", lp_nic_drained(i) ? " (drained)" : "");
  return ncclSuccess;
}

static ncclResult_t lp_init_v12(void **ctx, uint64_t comm_id, lp_comm_config_t *cfg,
                                lp_logger_t log, lp_profiler_cb_t prof) {
  (void)comm_id;
  (void)cfg;
  (void)prof;
  ncclResult_t r = init_common(log);
  if (ctx) *ctx = r == ncclSuccess ? &ctx_token : NULL;
  return r;
}

static ncclResult_t lp_finalize(void *ctx) {
  (void)ctx;
  if (init_refs > 0 && --init_refs == 0) lp_health_stop();
  return ncclSuccess;
}

static ncclResult_t lp_set_net_attr(void *ctx, lp_net_attr_t *attr) {
  (void)ctx;
  (void)attr; /* no per-op tuning: every comm already uses every NIC */
  return ncclSuccess;
}

static ncclResult_t lp_devices(int *ndev) {
  *ndev = lp_nnics > 0 ? 1 : 0;
  return ncclSuccess;
}

static ncclResult_t lp_props_v12(int dev, lp_props_v12_t *p) {
  if (dev != 0) return ncclInvalidArgument;
  memset(p, 0, sizeof(*p));
  int speed = 0;
  for (int i = 0; i < lp_nnics; i++) speed += lp_nics[i].speed_mbps;
  p->name = dev_name;
  p->pci_path = NULL; /* virtual device: no PCI topology to report */
  p->guid = 0x4c696e6b50617373ull;
  p->ptr_support = LP_PTR_HOST;
  p->reg_is_global = 0;
  p->force_flush = 0;
  p->speed_mbps = speed;
  p->port = 0;
  p->latency_us = 0;
  p->max_comms = 65536;
  p->max_recvs = 1;
  p->dev_type = LP_DEVICE_HOST;
  p->dev_version = 0;
  p->vprops.ndevs = 1;
  p->vprops.devs[0] = 0;
  p->max_p2p_bytes = lp_cfg.chunk_bytes * 2048; /* LP_RING/2 chunks per message */
  p->max_coll_bytes = p->max_p2p_bytes;
  p->max_multi_request = 1;
  p->rail_id = LP_ID_UNDEF;
  p->plane_id = LP_ID_UNDEF;
  return ncclSuccess;
}

#define COPY_COMMON(d, s)                                                                        \
  do {                                                                                           \
    (d)->name = (s).name;                                                                        \
    (d)->pci_path = (s).pci_path;                                                                \
    (d)->guid = (s).guid;                                                                        \
    (d)->ptr_support = (s).ptr_support;                                                          \
    (d)->reg_is_global = (s).reg_is_global;                                                      \
    (d)->speed_mbps = (s).speed_mbps;                                                            \
    (d)->port = (s).port;                                                                        \
    (d)->latency_us = (s).latency_us;                                                            \
    (d)->max_comms = (s).max_comms;                                                              \
    (d)->max_recvs = (s).max_recvs;                                                              \
    (d)->dev_type = (s).dev_type;                                                                \
    (d)->dev_version = (s).dev_version;                                                          \
  } while (0)

static ncclResult_t lp_props_v11(int dev, lp_props_v11_t *p) {
  lp_props_v12_t q;
  ncclResult_t r = lp_props_v12(dev, &q);
  if (r != ncclSuccess) return r;
  memset(p, 0, sizeof(*p));
  COPY_COMMON(p, q);
  p->force_flush = q.force_flush;
  p->vprops.ndevs = 1;
  p->max_p2p_bytes = q.max_p2p_bytes;
  p->max_coll_bytes = q.max_coll_bytes;
  p->max_multi_request = q.max_multi_request;
  return ncclSuccess;
}

static ncclResult_t lp_props_v9(int dev, lp_props_v9_t *p) {
  lp_props_v12_t q;
  ncclResult_t r = lp_props_v12(dev, &q);
  if (r != ncclSuccess) return r;
  memset(p, 0, sizeof(*p));
  COPY_COMMON(p, q);
  p->force_flush = q.force_flush;
  p->vprops.ndevs = 1;
  p->max_p2p_bytes = q.max_p2p_bytes;
  p->max_coll_bytes = q.max_coll_bytes;
  return ncclSuccess;
}

static ncclResult_t lp_props_v8(int dev, lp_props_v8_t *p) {
  lp_props_v12_t q;
  ncclResult_t r = lp_props_v12(dev, &q);
  if (r != ncclSuccess) return r;
  memset(p, 0, sizeof(*p));
  COPY_COMMON(p, q);
  return ncclSuccess;
}

/* ------------------------------------------------------------------ memory registration */

typedef struct {
  void *data;
  size_t size;
} lp_mr_t;

static ncclResult_t lp_reg_mr(void *comm, void *data, size_t size, int type, void **mh) {
  (void)comm;
  if (type != LP_PTR_HOST) return ncclInternalError; /* only host memory is advertised */
  lp_mr_t *m = malloc(sizeof(*m));
  if (!m) return ncclSystemError;
  m->data = data;
  m->size = size;
  *mh = m;
  return ncclSuccess;
}

static ncclResult_t lp_reg_mr_dmabuf(void *comm, void *data, size_t size, int type,
                                     uint64_t off, int fd, void **mh) {
  (void)comm, (void)data, (void)size, (void)type, (void)off, (void)fd, (void)mh;
  return ncclInternalError; /* DMA-BUF not advertised in ptrSupport */
}

static ncclResult_t lp_dereg_mr(void *comm, void *mh) {
  (void)comm;
  free(mh);
  return ncclSuccess;
}

static ncclResult_t lp_iflush(void *rc, int n, void **data, int *sizes, void **mh, void **req) {
  (void)rc, (void)n, (void)data, (void)sizes, (void)mh;
  *req = NULL; /* host memory: nothing to flush */
  return ncclSuccess;
}

/* ------------------------------------------------------------------ per-version adapters */

static ncclResult_t lp_listen_v12(void *ctx, int dev, void *h, void **lc) {
  (void)ctx;
  return lp_listen(dev, h, lc);
}
static ncclResult_t lp_connect_v12(void *ctx, int dev, void *h, void **sc, lp_dev_handle_t **dc) {
  (void)ctx, (void)dc;
  return lp_connect(dev, h, sc);
}
static ncclResult_t lp_accept_any(void *lc, void **rc, lp_dev_handle_t **dc) {
  (void)dc;
  return lp_accept(lc, rc);
}
static ncclResult_t lp_isend_v12(void *sc, void *data, size_t size, int tag, void *mh, void *ph,
                                 void **req) {
  (void)mh, (void)ph;
  return lp_isend(sc, data, size, tag, req);
}
static ncclResult_t lp_irecv_v12(void *rc, int n, void **data, size_t *sizes, int *tags,
                                 void **mh, void **ph, void **req) {
  (void)mh, (void)ph;
  return lp_irecv(rc, n, data, sizes, tags, req);
}
static ncclResult_t lp_init_v10(lp_logger_t log, lp_profiler_cb_t prof) {
  (void)prof;
  return init_common(log);
}
static ncclResult_t lp_init_v9(lp_logger_t log) { return init_common(log); }
static ncclResult_t lp_listen_v10(int dev, void *h, void **lc) { return lp_listen(dev, h, lc); }
static ncclResult_t lp_connect_v10(int dev, lp_comm_config_t *cfg, void *h, void **sc,
                                   lp_dev_handle_t **dc) {
  (void)cfg, (void)dc;
  return lp_connect(dev, h, sc);
}
static ncclResult_t lp_connect_v9(int dev, void *h, void **sc, lp_dev_handle_t **dc) {
  (void)dc;
  return lp_connect(dev, h, sc);
}
static ncclResult_t lp_isend_v9(void *sc, void *data, size_t size, int tag, void *mh, void **req) {
  (void)mh;
  return lp_isend(sc, data, size, tag, req);
}
static ncclResult_t lp_irecv_v9(void *rc, int n, void **data, size_t *sizes, int *tags, void **mh,
                                void **req) {
  (void)mh;
  return lp_irecv(rc, n, data, sizes, tags, req);
}
static ncclResult_t lp_isend_v8(void *sc, void *data, int size, int tag, void *mh, void **req) {
  (void)mh;
  if (size < 0) return ncclInvalidArgument;
  return lp_isend(sc, data, (size_t)size, tag, req);
}
static ncclResult_t lp_irecv_v8(void *rc, int n, void **data, int *sizes, int *tags, void **mh,
                                void **req) {
  (void)mh;
  if (n != 1 || sizes[0] < 0) return ncclInternalError;
  size_t s = (size_t)sizes[0];
  return lp_irecv(rc, n, data, &s, tags, req);
}

#define LP_COMMON_TAIL                                                                           \
  .regMr = lp_reg_mr, .regMrDmaBuf = lp_reg_mr_dmabuf, .deregMr = lp_dereg_mr,                   \
  .iflush = lp_iflush, .test = lp_test, .closeSend = lp_close_send, .closeRecv = lp_close_recv,  \
  .closeListen = lp_close_listen, .getDeviceMr = NULL, .irecvConsumed = NULL

EXPORT const lp_net_v12_t ncclNetPlugin_v12 = {
    .name = "linkpass",
    .init = lp_init_v12,
    .devices = lp_devices,
    .getProperties = lp_props_v12,
    .listen = lp_listen_v12,
    .connect = lp_connect_v12,
    .accept = lp_accept_any,
    .isend = lp_isend_v12,
    .irecv = lp_irecv_v12,
    LP_COMMON_TAIL,
    .makeVDevice = NULL,
    .finalize = lp_finalize,
    .setNetAttr = lp_set_net_attr,
};

EXPORT const lp_net_v11_t ncclNetPlugin_v11 = {
    .name = "linkpass",
    .init = lp_init_v12,
    .devices = lp_devices,
    .getProperties = lp_props_v11,
    .listen = lp_listen_v12,
    .connect = lp_connect_v12,
    .accept = lp_accept_any,
    .isend = lp_isend_v12,
    .irecv = lp_irecv_v12,
    LP_COMMON_TAIL,
    .makeVDevice = NULL,
    .finalize = lp_finalize,
    .setNetAttr = lp_set_net_attr,
};

EXPORT const lp_net_v10_t ncclNetPlugin_v10 = {
    .name = "linkpass",
    .init = lp_init_v10,
    .devices = lp_devices,
    .getProperties = lp_props_v9,
    .listen = lp_listen_v10,
    .connect = lp_connect_v10,
    .accept = lp_accept_any,
    .isend = lp_isend_v12,
    .irecv = lp_irecv_v12,
    LP_COMMON_TAIL,
    .makeVDevice = NULL,
};

EXPORT const lp_net_v9_t ncclNetPlugin_v9 = {
    .name = "linkpass",
    .init = lp_init_v9,
    .devices = lp_devices,
    .getProperties = lp_props_v9,
    .listen = lp_listen_v10,
    .connect = lp_connect_v9,
    .accept = lp_accept_any,
    .isend = lp_isend_v9,
    .irecv = lp_irecv_v9,
    LP_COMMON_TAIL,
    .makeVDevice = NULL,
};

EXPORT const lp_net_v8_t ncclNetPlugin_v8 = {
    .name = "linkpass",
    .init = lp_init_v9,
    .devices = lp_devices,
    .getProperties = lp_props_v8,
    .listen = lp_listen_v10,
    .connect = lp_connect_v9,
    .accept = lp_accept_any,
    .isend = lp_isend_v8,
    .irecv = lp_irecv_v8,
    LP_COMMON_TAIL,
};

/* Exposed for the harness and tests: parse a decision document against this process's NICs. */
EXPORT int linkpass_decision_parse(const char *text, size_t len, int *drained_out) {
  return lp_decision_parse(text, len, drained_out);
}
