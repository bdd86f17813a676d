/* Counters and the status file.
 *
 * The status file (LINKPASS_STATUS_FILE) is one JSON object, rewritten every 200 ms by the
 * health thread through write-to-temp + rename so a reader never sees half a file.  The same
 * text is available in-process through linkpass_status_json() (the harness samples it).
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lp.h"

lp_stats_t lp_stats;

#define U(x) ((unsigned long long)atomic_load(&(x)))

int lp_status_json(char *buf, size_t len) {
  size_t o = 0;
  int n = snprintf(buf, len,
                   "{\"t_ns\":%llu,\"pid\":%d,\"failovers\":%llu,\"failbacks\":%llu,"
                   "\"resent_chunks\":%llu,\"resent_bytes\":%llu,\"comms\":%llu,"
                   "\"errors\":%llu,\"decision_loads\":%llu,\"decision_errors\":%llu,\"nics\":[",
                   (unsigned long long)lp_now_ns(), (int)getpid(), U(lp_stats.failovers),
                   U(lp_stats.failbacks), U(lp_stats.resent_chunks), U(lp_stats.resent_bytes),
                   U(lp_stats.comms), U(lp_stats.errors), U(lp_stats.decision_loads),
                   U(lp_stats.decision_errors));
  if (n < 0 || (size_t)n >= len) return -1;
  o = (size_t)n;
  for (int i = 0; i < lp_nnics; i++) {
    char ip[INET_ADDRSTRLEN];
    struct in_addr a = {.s_addr = lp_nics[i].ip};
    inet_ntop(AF_INET, &a, ip, sizeof(ip));
    n = snprintf(buf + o, len - o,
                 "%s{\"name\":\"%s\",\"ip\":\"%s\",\"link_up\":%s,\"drained\":%s,"
                 "\"tx_bytes\":%llu,\"rx_bytes\":%llu}",
                 i ? "," : "", lp_nics[i].name, ip, lp_nic_usable(i) ? "true" : "false",
                 lp_nic_drained(i) ? "true" : "false", U(lp_nics[i].tx_bytes),
                 U(lp_nics[i].rx_bytes));
    if (n < 0 || (size_t)n >= len - o) return -1;
    o += (size_t)n;
  }
  n = snprintf(buf + o, len - o, "]}");
  if (n < 0 || (size_t)n >= len - o) return -1;
  return (int)(o + (size_t)n);
}

void lp_status_write(void) {
  const char *path = lp_cfg.status_file;
  if (!path[0]) return;
  char buf[4096], tmp[600];
  int n = lp_status_json(buf, sizeof(buf));
  if (n < 0) return;
  snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return;
  int ok = fwrite(buf, 1, (size_t)n, f) == (size_t)n;
  ok &= fputc('\n', f) != EOF;
  ok &= fclose(f) == 0;
  if (ok && rename(tmp, path) == 0) return;
  unlink(tmp);
}

/* Exported for tools linked against the plugin (the harness): same JSON as the status file. */
__attribute__((visibility("default"))) int linkpass_status_json(char *buf, size_t len) {
  return lp_status_json(buf, len);
}
