/* linkpass_tcpbase: the raw baseline for the benchmark, iperf-style.
 * One blocking TCP stream per address, one thread per stream, 4 MiB writes for --seconds.
 *   recv: --role recv --addrs A,B,.. --port P   (prints one JSON line when all streams end)
 *   send: --role send --addrs A,B,.. --port P --seconds S
 */

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXS 16
#define BUF (4u << 20)

typedef struct {
  char addr[64];
  int port, send;
  double seconds, first, last;
  unsigned long long bytes;
} stream_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int sock_addr(const char *ip, int port, struct sockaddr_in *sa) {
  memset(sa, 0, sizeof(*sa));
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)port);
  return inet_pton(AF_INET, ip, &sa->sin_addr) == 1 ? 0 : -1;
}

static void *run(void *arg) {
  stream_t *s = arg;
  struct sockaddr_in sa;
  if (sock_addr(s->addr, s->port, &sa) != 0) return NULL;
  char *buf = malloc(BUF);
  memset(buf, 0x5a, BUF);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (s->send) {
    double until = now_s() + 10;
    while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && now_s() < until) {
      close(fd);
      usleep(20000);
      fd = socket(AF_INET, SOCK_STREAM, 0);
    }
    double end = now_s() + s->seconds;
    s->first = now_s();
    while (now_s() < end) {
      ssize_t n = send(fd, buf, BUF, MSG_NOSIGNAL);
      if (n <= 0) break;
      s->bytes += (unsigned long long)n;
    }
    s->last = now_s();
  } else {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 1) != 0) {
      perror("bind/listen");
      free(buf);
      return NULL;
    }
    int c = accept(fd, NULL, NULL);
    close(fd);
    fd = c;
    for (;;) {
      ssize_t n = recv(fd, buf, BUF, 0);
      if (n <= 0) break;
      if (!s->bytes) s->first = now_s();
      s->bytes += (unsigned long long)n;
      s->last = now_s();
    }
  }
  close(fd);
  free(buf);
  return NULL;
}

int main(int argc, char **argv) {
  const char *role = NULL, *addrs = NULL;
  int port = 5201;
  double seconds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--role")) role = argv[i + 1];
    else if (!strcmp(argv[i], "--addrs")) addrs = argv[i + 1];
    else if (!strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
  }
  if (!role || !addrs) {
    fprintf(stderr, "usage: linkpass_tcpbase --role send|recv --addrs A,B --port P --seconds S\n");
    return 1;
  }
  stream_t st[MAXS];
  pthread_t th[MAXS];
  int n = 0;
  char list[1024];
  snprintf(list, sizeof(list), "%s", addrs);
  char *save = NULL;
  for (char *t = strtok_r(list, ",", &save); t && n < MAXS; t = strtok_r(NULL, ",", &save)) {
    memset(&st[n], 0, sizeof(st[n]));
    snprintf(st[n].addr, sizeof(st[n].addr), "%s", t);
    st[n].port = port;
    st[n].send = !strcmp(role, "send");
    st[n].seconds = seconds;
    n++;
  }
  if (!strcmp(role, "recv")) printf("{\"event\":\"listening\"}\n"), fflush(stdout);
  for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, run, &st[i]);
  unsigned long long total = 0;
  double first = 1e300, last = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(th[i], NULL);
    total += st[i].bytes;
    if (st[i].bytes && st[i].first < first) first = st[i].first;
    if (st[i].last > last) last = st[i].last;
  }
  double el = last > first ? last - first : 0;
  printf("{\"event\":\"done\",\"role\":\"%s\",\"streams\":%d,\"bytes\":%llu,\"elapsed_s\":%.3f,"
         "\"gbit_s\":%.3f}\n",
         role, n, total, el, el > 0 ? (double)total * 8 / el / 1e9 : 0.0);
  return 0;
}
