/* LinkPass internals shared between the per-concern C files. */
#ifndef LP_H
#define LP_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/uio.h>
#include <sys/types.h>

#include "lp_nccl.h"

#define LP_MAX_NICS 8
#define LP_NAME_LEN 16

/* ---------- configuration (config in plugin.c, read once at init) ---------- */
typedef struct {
  uint64_t timeout_ms;        /* no path at all for this long -> error */
  uint64_t hb_interval_ms;    /* heartbeat period per lane */
  uint64_t hb_timeout_ms;     /* silence on a lane for this long -> lane dead */
  uint64_t user_timeout_ms;   /* TCP_USER_TIMEOUT on lane sockets */
  uint64_t reconnect_ms;      /* retry period for a dead lane */
  uint64_t connect_timeout_ms;/* give up one connect attempt after this */
  size_t chunk_bytes;         /* striping unit */
  size_t lane_window_bytes;   /* unacked bytes allowed on one lane */
  char decision_file[512];
  char status_file[512];
} lp_config_t;
extern lp_config_t lp_cfg;

/* ---------- logging (plugin.c) ---------- */
void lp_log(lp_log_level_t lvl, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define LP_WARN(...) lp_log(LP_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define LP_INFO(...) lp_log(LP_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)

uint64_t lp_now_ns(void);

/* ---------- NICs and their health (health.c) ---------- */
typedef struct {
  char name[LP_NAME_LEN];
  uint32_t ip; /* network byte order */
  int ifindex;
  int speed_mbps;
  atomic_int link_up;  /* IFF_UP && IFF_RUNNING, from netlink + ioctl */
  atomic_int drained;  /* listed in the FleetLens decision file */
  /* counters (stats.c prints them) */
  atomic_uint_fast64_t tx_bytes, rx_bytes;
} lp_nic_t;

extern lp_nic_t lp_nics[LP_MAX_NICS];
extern int lp_nnics;

int lp_nics_discover(void);          /* fills lp_nics from LINKPASS_NICS or the interfaces */
int lp_health_start(void);           /* netlink + decision-file + status-file thread */
void lp_health_stop(void);
void lp_health_refresh_links(void);  /* re-read link flags now */
/* Parses a decision document; on success fills drained[] per NIC and returns 0, else -1. */
int lp_decision_parse(const char *text, size_t len, int drained[LP_MAX_NICS]);
static inline int lp_nic_usable(int i) { return atomic_load(&lp_nics[i].link_up); }
static inline int lp_nic_drained(int i) { return atomic_load(&lp_nics[i].drained); }

/* ---------- counters (stats.c) ---------- */
typedef struct {
  atomic_uint_fast64_t failovers, failbacks, resent_chunks, resent_bytes, comms, errors;
  atomic_uint_fast64_t decision_loads, decision_errors;
} lp_stats_t;
extern lp_stats_t lp_stats;
int lp_status_json(char *buf, size_t len);
void lp_status_write(void);

/* ---------- transport interface (transport_tcp.c) ---------- */
/* Everything the logical comm needs from a byte-stream transport over one NIC. A verbs
 * transport would implement the same operations on a QP. Returns follow syscall style. */
typedef struct {
  const char *name;
  int (*listen)(const lp_nic_t *nic, uint16_t *port);            /* -> fd or -1 */
  int (*accept)(int lfd);                                        /* -> fd, -1 (errno) */
  int (*connect_start)(const lp_nic_t *nic, uint32_t ip, uint16_t port); /* -> fd or -1 */
  int (*connect_done)(int fd);                                   /* 1 done, 0 pending, -1 err */
  ssize_t (*sendv)(int fd, const struct iovec *iov, int n);      /* nonblocking */
  ssize_t (*recv)(int fd, void *buf, size_t n);                  /* nonblocking */
  int (*set_rcvlowat)(int fd, int bytes); /* optional: bytes that make the fd readable */
  void (*close)(int fd);
} lp_transport_t;
extern const lp_transport_t lp_tcp_transport;

/* ---------- logical comms (comm.c) ---------- */
ncclResult_t lp_listen(int dev, void *handle, void **listen_comm);
ncclResult_t lp_connect(int dev, void *handle, void **send_comm);
ncclResult_t lp_accept(void *listen_comm, void **recv_comm);
ncclResult_t lp_isend(void *send_comm, void *data, size_t size, int tag, void **request);
ncclResult_t lp_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                      void **request);
ncclResult_t lp_test(void *request, int *done, int *size);
ncclResult_t lp_close_send(void *send_comm);
ncclResult_t lp_close_recv(void *recv_comm);
ncclResult_t lp_close_listen(void *listen_comm);

#endif
