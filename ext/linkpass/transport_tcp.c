/* TCP transport: one nonblocking stream socket per lane, pinned to one NIC.
 *
 * Pinning uses both bind() to the NIC's address and SO_BINDTODEVICE, so a lane never silently
 * reroutes over another NIC when its own one fails (that would hide the failure and defeat the
 * per-NIC accounting).  TCP_USER_TIMEOUT bounds how long the kernel keeps retrying unacked data
 * on a link that drops everything, so a silent failure surfaces as a socket error quickly.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lp.h"

static void tcp_tune(int fd) {
  int one = 1;
  unsigned int uto = (unsigned int)lp_cfg.user_timeout_ms;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof(uto));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

static int tcp_socket_on(const lp_nic_t *nic, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  /* Best effort: needs CAP_NET_RAW; bind() to the address still pins the source. */
  setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, nic->name, (socklen_t)strlen(nic->name));
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  sa.sin_addr.s_addr = nic->ip;
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

static int tcp_listen(const lp_nic_t *nic, uint16_t *port) {
  int fd = tcp_socket_on(nic, 0);
  if (fd < 0) return -1;
  struct sockaddr_in sa;
  socklen_t sl = sizeof(sa);
  if (listen(fd, 64) != 0 || getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  *port = ntohs(sa.sin_port);
  return fd;
}

static int tcp_accept(int lfd) {
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  if (fd >= 0) tcp_tune(fd);
  return fd;
}

static int tcp_connect_start(const lp_nic_t *nic, uint32_t ip, uint16_t port) {
  int fd = tcp_socket_on(nic, 0);
  if (fd < 0) return -1;
  tcp_tune(fd);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  sa.sin_addr.s_addr = ip;
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 && errno != EINPROGRESS) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

static int tcp_connect_done(int fd) {
  int err = 0;
  socklen_t sl = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0) return -1;
  if (err != 0) {
    errno = err;
    return -1;
  }
  struct sockaddr_in peer;
  socklen_t pl = sizeof(peer);
  if (getpeername(fd, (struct sockaddr *)&peer, &pl) != 0) return errno == ENOTCONN ? 0 : -1;
  return 1;
}

static ssize_t tcp_sendv(int fd, const struct iovec *iov, int n) {
  struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
  return sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static ssize_t tcp_recv(int fd, void *buf, size_t n) { return recv(fd, buf, n, MSG_DONTWAIT); }

static int tcp_set_rcvlowat(int fd, int bytes) {
  return setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof(bytes));
}

static void tcp_close(int fd) {
  if (fd >= 0) close(fd);
}

const lp_transport_t lp_tcp_transport = {
    .name = "tcp",
    .listen = tcp_listen,
    .accept = tcp_accept,
    .connect_start = tcp_connect_start,
    .connect_done = tcp_connect_done,
    .sendv = tcp_sendv,
    .recv = tcp_recv,
    .set_rcvlowat = tcp_set_rcvlowat,
    .close = tcp_close,
};
