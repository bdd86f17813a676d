/* LinkPass's own declaration of the NCCL network-plugin ABI (versions 8..12).
 *
 * Written from the layout described in NCCL's plugins/net documentation: only the binary layout
 * (member order and types) has to agree with NCCL, so the names below are LinkPass's own where
 * NCCL does not look them up.  NCCL finds the plugin through the exported symbols
 * ncclNetPlugin_vN (N = 12 first, then older), each a table of function pointers.
 */
#ifndef LP_NCCL_H
#define LP_NCCL_H

#include <stddef.h>
#include <stdint.h>

/* Result codes shared with NCCL core (values are part of the ABI). */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

/* Logger handed to init(): level, subsystem mask, file, line, printf format. */
typedef enum {
  LP_LOG_NONE = 0,
  LP_LOG_VERSION = 1,
  LP_LOG_WARN = 2,
  LP_LOG_INFO = 3,
  LP_LOG_ABORT = 4,
  LP_LOG_TRACE = 5,
} lp_log_level_t;
#define LP_SUBSYS_INIT 1UL
#define LP_SUBSYS_NET 16UL
typedef void (*lp_logger_t)(lp_log_level_t level, unsigned long flags, const char *file, int line,
                            const char *fmt, ...);
typedef ncclResult_t (*lp_profiler_cb_t)(void **ev, int type, void *phandle, int64_t plugin_id,
                                         void *ext);

#define LP_HANDLE_BYTES 128 /* NCCL_NET_HANDLE_MAXSIZE */
#define LP_PTR_HOST 0x1
#define LP_PTR_CUDA 0x2
#define LP_PTR_DMABUF 0x4
#define LP_ID_UNDEF (-1)

typedef enum { LP_DEVICE_HOST = 0, LP_DEVICE_UNPACK = 1 } lp_dev_type_t;

/* Device-offload handle; LinkPass never offers offload, so it only passes through. */
typedef struct {
  lp_dev_type_t type;
  int version;
  void *handle;
  size_t size;
  int needs_proxy_progress;
} lp_dev_handle_t;

/* Virtual (fused) device list: 4 entries up to v11, 8 from v12 on. */
typedef struct {
  int ndevs;
  int devs[4];
} lp_vprops4_t;
typedef struct {
  int ndevs;
  int devs[8];
} lp_vprops8_t;

typedef struct {
  int traffic_class;
} lp_comm_config_t;

typedef struct {
  int32_t max_peers, min_peers, max_flows, min_flows;
} lp_comm_attr_t;
typedef struct {
  lp_comm_attr_t send_attr, recv_attr;
  uint32_t op, algo, proto;
} lp_net_attr_t;

/* ---- device properties, one layout per ABI generation ---- */
#define LP_PROPS_COMMON                                                                           \
  char *name;                                                                                     \
  char *pci_path;                                                                                 \
  uint64_t guid;                                                                                  \
  int ptr_support;                                                                                \
  int reg_is_global;
#define LP_PROPS_LINK                                                                             \
  int speed_mbps;                                                                                 \
  int port;                                                                                       \
  float latency_us;                                                                               \
  int max_comms;                                                                                  \
  int max_recvs;                                                                                  \
  lp_dev_type_t dev_type;                                                                         \
  int dev_version;

typedef struct {
  LP_PROPS_COMMON
  LP_PROPS_LINK
} lp_props_v8_t;

typedef struct {
  LP_PROPS_COMMON
  int force_flush;
  LP_PROPS_LINK
  lp_vprops4_t vprops;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
} lp_props_v9_t; /* also v10 */

typedef struct {
  LP_PROPS_COMMON
  int force_flush;
  LP_PROPS_LINK
  lp_vprops4_t vprops;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
  int max_multi_request;
} lp_props_v11_t;

typedef struct {
  LP_PROPS_COMMON
  int force_flush;
  LP_PROPS_LINK
  lp_vprops8_t vprops;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
  int max_multi_request;
  int16_t rail_id;
  int16_t plane_id;
} lp_props_v12_t;

/* ---- function tables ---- */
/* Members shared by every version from regMr to closeListen, parameterised on the send/recv
 * signatures that changed between versions. */
#define LP_TABLE_MR                                                                               \
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mh);                \
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t off,        \
                              int fd, void **mh);                                                 \
  ncclResult_t (*deregMr)(void *comm, void *mh);
#define LP_TABLE_TAIL                                                                             \
  ncclResult_t (*iflush)(void *rc, int n, void **data, int *sizes, void **mh, void **req);        \
  ncclResult_t (*test)(void *req, int *done, int *sizes);                                         \
  ncclResult_t (*closeSend)(void *sc);                                                            \
  ncclResult_t (*closeRecv)(void *rc);                                                            \
  ncclResult_t (*closeListen)(void *lc);                                                          \
  ncclResult_t (*getDeviceMr)(void *comm, void *mh, void **dptr);                                 \
  ncclResult_t (*irecvConsumed)(void *rc, int n, void *req);

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **ctx, uint64_t comm_id, lp_comm_config_t *cfg, lp_logger_t log,
                       lp_profiler_cb_t prof);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, lp_props_v12_t *props);
  ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **lc);
  ncclResult_t (*connect)(void *ctx, int dev, void *handle, void **sc, lp_dev_handle_t **dc);
  ncclResult_t (*accept)(void *lc, void **rc, lp_dev_handle_t **dc);
  LP_TABLE_MR
  ncclResult_t (*isend)(void *sc, void *data, size_t size, int tag, void *mh, void *ph,
                        void **req);
  ncclResult_t (*irecv)(void *rc, int n, void **data, size_t *sizes, int *tags, void **mh,
                        void **ph, void **req);
  LP_TABLE_TAIL
  ncclResult_t (*makeVDevice)(int *d, lp_vprops8_t *props);
  ncclResult_t (*finalize)(void *ctx);
  ncclResult_t (*setNetAttr)(void *ctx, lp_net_attr_t *attr);
} lp_net_v12_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **ctx, uint64_t comm_id, lp_comm_config_t *cfg, lp_logger_t log,
                       lp_profiler_cb_t prof);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, lp_props_v11_t *props);
  ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **lc);
  ncclResult_t (*connect)(void *ctx, int dev, void *handle, void **sc, lp_dev_handle_t **dc);
  ncclResult_t (*accept)(void *lc, void **rc, lp_dev_handle_t **dc);
  LP_TABLE_MR
  ncclResult_t (*isend)(void *sc, void *data, size_t size, int tag, void *mh, void *ph,
                        void **req);
  ncclResult_t (*irecv)(void *rc, int n, void **data, size_t *sizes, int *tags, void **mh,
                        void **ph, void **req);
  LP_TABLE_TAIL
  ncclResult_t (*makeVDevice)(int *d, lp_vprops4_t *props);
  ncclResult_t (*finalize)(void *ctx);
  ncclResult_t (*setNetAttr)(void *ctx, lp_net_attr_t *attr);
} lp_net_v11_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(lp_logger_t log, lp_profiler_cb_t prof);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, lp_props_v9_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **lc);
  ncclResult_t (*connect)(int dev, lp_comm_config_t *cfg, void *handle, void **sc,
                          lp_dev_handle_t **dc);
  ncclResult_t (*accept)(void *lc, void **rc, lp_dev_handle_t **dc);
  LP_TABLE_MR
  ncclResult_t (*isend)(void *sc, void *data, size_t size, int tag, void *mh, void *ph,
                        void **req);
  ncclResult_t (*irecv)(void *rc, int n, void **data, size_t *sizes, int *tags, void **mh,
                        void **ph, void **req);
  LP_TABLE_TAIL
  ncclResult_t (*makeVDevice)(int *d, lp_vprops4_t *props);
} lp_net_v10_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(lp_logger_t log);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, lp_props_v9_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **lc);
  ncclResult_t (*connect)(int dev, void *handle, void **sc, lp_dev_handle_t **dc);
  ncclResult_t (*accept)(void *lc, void **rc, lp_dev_handle_t **dc);
  LP_TABLE_MR
  ncclResult_t (*isend)(void *sc, void *data, size_t size, int tag, void *mh, void **req);
  ncclResult_t (*irecv)(void *rc, int n, void **data, size_t *sizes, int *tags, void **mh,
                        void **req);
  LP_TABLE_TAIL
  ncclResult_t (*makeVDevice)(int *d, lp_vprops4_t *props);
} lp_net_v9_t;

typedef struct {
  const char *name;
  ncclResult_t (*init)(lp_logger_t log);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, lp_props_v8_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **lc);
  ncclResult_t (*connect)(int dev, void *handle, void **sc, lp_dev_handle_t **dc);
  ncclResult_t (*accept)(void *lc, void **rc, lp_dev_handle_t **dc);
  LP_TABLE_MR
  ncclResult_t (*isend)(void *sc, void *data, int size, int tag, void *mh, void **req);
  ncclResult_t (*irecv)(void *rc, int n, void **data, int *sizes, int *tags, void **mh,
                        void **req);
  LP_TABLE_TAIL
} lp_net_v8_t;

#endif
