/* NIC discovery and health: link state from netlink, FleetLens drain decisions from a file.
 *
 * One background thread per process.  It listens to rtnetlink link/address events (and, as a
 * fallback that also covers a missed event, re-reads every NIC's flags each 100 ms), watches the
 * decision file by stat() polling every 100 ms (works for the agent's write-then-rename and on
 * any filesystem, unlike inotify on a file that is replaced), and rewrites the status file
 * every 200 ms.  Lanes read the resulting per-NIC flags lock-free.
 */
#include <errno.h>
#include <ifaddrs.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lp.h"

lp_nic_t lp_nics[LP_MAX_NICS];
int lp_nnics;

static pthread_t health_thr;
static atomic_int health_stop;
static int health_running;

/* ------------------------------------------------------------------ discovery */

static int read_speed(const char *name) {
  char path[128];
  snprintf(path, sizeof(path), "/sys/class/net/%s/speed", name);
  FILE *f = fopen(path, "r");
  int v = -1;
  if (f) {
    if (fscanf(f, "%d", &v) != 1) v = -1;
    fclose(f);
  }
  return v > 0 ? v : 10000; /* virtual links report nothing useful */
}

static int add_nic(const char *name) {
  if (lp_nnics >= LP_MAX_NICS || strlen(name) >= LP_NAME_LEN) return -1;
  for (int i = 0; i < lp_nnics; i++)
    if (strcmp(lp_nics[i].name, name) == 0) return 0;
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  memcpy(ifr.ifr_name, name, strnlen(name, IFNAMSIZ - 1));
  int rc = -1;
  if (ioctl(s, SIOCGIFADDR, &ifr) == 0) {
    lp_nic_t *n = &lp_nics[lp_nnics];
    memset(n, 0, sizeof(*n));
    snprintf(n->name, sizeof(n->name), "%s", name);
    n->ip = ((struct sockaddr_in *)&ifr.ifr_addr)->sin_addr.s_addr;
    n->ifindex = (int)if_nametoindex(name);
    n->speed_mbps = read_speed(name);
    lp_nnics++;
    rc = 0;
  } else {
    LP_WARN("LinkPass: NIC %s has no IPv4 address (%s); skipped", name, strerror(errno));
  }
  close(s);
  return rc;
}

int lp_nics_discover(void) {
  lp_nnics = 0;
  const char *env = getenv("LINKPASS_NICS");
  if (env && *env) {
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", env);
    char *save = NULL;
    for (char *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) add_nic(t);
  } else {
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) != 0) return 0;
    for (struct ifaddrs *a = ifa; a; a = a->ifa_next) {
      if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET) continue;
      if ((a->ifa_flags & IFF_LOOPBACK) || !(a->ifa_flags & IFF_UP)) continue;
      add_nic(a->ifa_name);
    }
    freeifaddrs(ifa);
  }
  lp_health_refresh_links();
  return lp_nnics;
}

void lp_health_refresh_links(void) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return;
  for (int i = 0; i < lp_nnics; i++) {
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    memcpy(ifr.ifr_name, lp_nics[i].name, strnlen(lp_nics[i].name, IFNAMSIZ - 1));
    int up = ioctl(s, SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags & IFF_UP) &&
             (ifr.ifr_flags & IFF_RUNNING);
    int was = atomic_exchange(&lp_nics[i].link_up, up);
    if (was != up)
      LP_INFO("LinkPass: NIC %s link %s", lp_nics[i].name, up ? "up" : "down");
  }
  close(s);
}

/* ------------------------------------------------------------------ decision file */
/* A small strict JSON reader: the whole document must parse; it only keeps the strings at
 * drain[*].nic_id.  Anything else (truncated file, wrong types) makes the parse fail and the
 * caller keeps its previous state. */

enum { R_ANY, R_TOP, R_DRAIN, R_ENTRY, R_NICID };

typedef struct {
  const char *p, *end;
  int depth, have_drain;
  int *drained;
} jp_t;

static void jws(jp_t *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
    j->p++;
}

static int jstring(jp_t *j, char *out, size_t cap) {
  size_t n = 0;
  if (j->p >= j->end || *j->p != '"') return -1;
  j->p++;
  while (j->p < j->end && *j->p != '"') {
    char ch = *j->p++;
    if ((unsigned char)ch < 0x20) return -1;
    if (ch == '\\') {
      if (j->p >= j->end) return -1;
      char e = *j->p++;
      switch (e) {
        case '"': case '\\': case '/': ch = e; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u':
          for (int k = 0; k < 4; k++, j->p++)
            if (j->p >= j->end || !strchr("0123456789abcdefABCDEF", *j->p) || !*j->p) return -1;
          ch = '?'; /* never part of an interface name */
          break;
        default: return -1;
      }
    }
    if (out && n + 1 < cap) out[n++] = ch;
  }
  if (j->p >= j->end) return -1;
  j->p++;
  if (out) out[n] = 0;
  return 0;
}

static int jvalue(jp_t *j, int role);

static int jliteral(jp_t *j) {
  static const char *lits[] = {"true", "false", "null"};
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(lits[i]);
    if ((size_t)(j->end - j->p) >= n && memcmp(j->p, lits[i], n) == 0) {
      j->p += n;
      return 0;
    }
  }
  const char *s = j->p;
  if (j->p < j->end && *j->p == '-') j->p++;
  while (j->p < j->end && strchr("0123456789.eE+-", *j->p) && *j->p) j->p++;
  return j->p > s && (j->p - s > 1 || *s != '-') ? 0 : -1;
}

static void mark_drained(jp_t *j, const char *nic_id) {
  const char *slash = strrchr(nic_id, '/');
  const char *ifname = slash ? slash + 1 : nic_id;
  for (int i = 0; i < lp_nnics; i++)
    if (strcmp(lp_nics[i].name, ifname) == 0) j->drained[i] = 1;
}

static int jobject(jp_t *j, int role) {
  j->p++;
  jws(j);
  if (j->p < j->end && *j->p == '}') {
    j->p++;
    return 0;
  }
  for (;;) {
    char key[64];
    jws(j);
    if (jstring(j, key, sizeof(key)) != 0) return -1;
    jws(j);
    if (j->p >= j->end || *j->p++ != ':') return -1;
    int child = R_ANY;
    if (role == R_TOP && strcmp(key, "drain") == 0) {
      child = R_DRAIN;
      j->have_drain = 1;
    } else if (role == R_ENTRY && strcmp(key, "nic_id") == 0) {
      child = R_NICID;
    }
    if (jvalue(j, child) != 0) return -1;
    jws(j);
    if (j->p >= j->end) return -1;
    if (*j->p == ',') {
      j->p++;
      continue;
    }
    if (*j->p++ != '}') return -1;
    return 0;
  }
}

static int jarray(jp_t *j, int role) {
  j->p++;
  jws(j);
  if (j->p < j->end && *j->p == ']') {
    j->p++;
    return 0;
  }
  for (;;) {
    if (jvalue(j, role == R_DRAIN ? R_ENTRY : R_ANY) != 0) return -1;
    jws(j);
    if (j->p >= j->end) return -1;
    if (*j->p == ',') {
      j->p++;
      continue;
    }
    if (*j->p++ != ']') return -1;
    return 0;
  }
}

static int jvalue(jp_t *j, int role) {
  jws(j);
  if (j->p >= j->end || ++j->depth > 32) return -1;
  int rc;
  char c = *j->p;
  if (c == '{') {
    rc = (role == R_ANY || role == R_TOP || role == R_ENTRY) ? jobject(j, role) : -1;
  } else if (c == '[') {
    rc = (role == R_ANY || role == R_DRAIN) ? jarray(j, role) : -1;
  } else if (c == '"') {
    char s[128];
    rc = (role == R_ANY || role == R_NICID) ? jstring(j, s, sizeof(s)) : -1;
    if (rc == 0 && role == R_NICID) mark_drained(j, s);
  } else {
    rc = (role == R_ANY) ? jliteral(j) : -1;
  }
  j->depth--;
  return rc;
}

int lp_decision_parse(const char *text, size_t len, int drained[LP_MAX_NICS]) {
  memset(drained, 0, sizeof(int) * LP_MAX_NICS);
  jp_t j = {.p = text, .end = text + len, .drained = drained};
  jws(&j);
  if (j.p >= j.end || *j.p != '{') return -1;
  if (jvalue(&j, R_TOP) != 0) return -1;
  jws(&j);
  if (j.p != j.end || !j.have_drain) return -1;
  return 0;
}

static struct stat dec_st;
static int dec_seen;

static void apply_drained(const int *drained) {
  for (int i = 0; i < lp_nnics; i++) {
    int was = atomic_exchange(&lp_nics[i].drained, drained[i]);
    if (was != drained[i])
      LP_INFO("LinkPass: NIC %s %s by FleetLens decision", lp_nics[i].name,
              drained[i] ? "drained" : "undrained");
  }
}

static void decision_check(void) {
  const char *path = lp_cfg.decision_file;
  if (!path[0]) return;
  struct stat st;
  if (stat(path, &st) != 0) {
    if (dec_seen) { /* file removed: nothing is drained any more */
      int none[LP_MAX_NICS] = {0};
      apply_drained(none);
      LP_INFO("LinkPass: decision file %s removed; all NICs in service", path);
      dec_seen = 0;
    }
    return;
  }
  if (dec_seen && st.st_ino == dec_st.st_ino && st.st_size == dec_st.st_size &&
      st.st_mtim.tv_sec == dec_st.st_mtim.tv_sec && st.st_mtim.tv_nsec == dec_st.st_mtim.tv_nsec)
    return;
  dec_st = st;
  dec_seen = 1;
  FILE *f = fopen(path, "r");
  if (!f) return;
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof(buf), f);
  int truncated = !feof(f);
  fclose(f);
  int drained[LP_MAX_NICS];
  if (truncated || lp_decision_parse(buf, n, drained) != 0) {
    atomic_fetch_add(&lp_stats.decision_errors, 1);
    LP_WARN("LinkPass: decision file %s is malformed; keeping the previous drain set", path);
    return;
  }
  atomic_fetch_add(&lp_stats.decision_loads, 1);
  apply_drained(drained);
}

/* ------------------------------------------------------------------ thread */

static int netlink_open(void) {
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
  if (fd < 0) return -1;
  struct sockaddr_nl sa = {.nl_family = AF_NETLINK,
                           .nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR};
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void *health_main(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "lp-health");
  int nl = netlink_open();
  if (nl < 0) LP_WARN("LinkPass: no netlink socket (%s); polling link state", strerror(errno));
  uint64_t t_links = 0, t_dec = 0, t_stat = 0;
  while (!atomic_load(&health_stop)) {
    struct pollfd pf = {.fd = nl, .events = POLLIN};
    int r = poll(&pf, nl >= 0 ? 1 : 0, 20);
    uint64_t now = lp_now_ns();
    if (r > 0 && (pf.revents & POLLIN)) {
      char buf[8192];
      while (recv(nl, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
      }
      lp_health_refresh_links(); /* any link/address event: re-read all flags now */
      t_links = now;
    }
    if (now - t_links > 100000000ull) {
      lp_health_refresh_links();
      t_links = now;
    }
    if (now - t_dec > 100000000ull) {
      decision_check();
      t_dec = now;
    }
    if (now - t_stat > 200000000ull) {
      lp_status_write();
      t_stat = now;
    }
  }
  if (nl >= 0) close(nl);
  lp_status_write();
  return NULL;
}

int lp_health_start(void) {
  if (health_running) return 0;
  atomic_store(&health_stop, 0);
  dec_seen = 0;
  decision_check(); /* drains apply before the first connection */
  if (pthread_create(&health_thr, NULL, health_main, NULL) != 0) return -1;
  health_running = 1;
  return 0;
}

void lp_health_stop(void) {
  if (!health_running) return;
  atomic_store(&health_stop, 1);
  pthread_join(health_thr, NULL);
  health_running = 0;
}
