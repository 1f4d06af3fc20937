/* Shared by everything that watches a peer: the heartbeat timeout a user
 * asked for, and the socket options that find a vanished host. */
#include "internal.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

uint64_t uvccl__heartbeat_timeout(uint64_t opt) {
  uint64_t ms;
  if (opt == UINT64_MAX) return 0;
  if (opt != 0) return opt;
  uvccl__config_uint(UVCCL__CFG_HEARTBEAT_TIMEOUT_MS, &ms); /* 0 = off */
  return ms;
}

void uvccl__addr_fmt(const struct sockaddr *sa, char *buf, size_t len) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
    uv_ip4_name(a, ip, sizeof(ip));
    snprintf(buf, len, "%s:%d", ip, ntohs(a->sin_port));
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
    uv_ip6_name(a, ip, sizeof(ip));
    snprintf(buf, len, "[%s]:%d", ip, ntohs(a->sin6_port));
  } else {
    snprintf(buf, len, "?");
  }
}

void uvccl__peer_addr(const uv_tcp_t *tcp, char *buf, size_t len) {
  struct sockaddr_storage ss;
  int l = sizeof(ss);
  if (uv_tcp_getpeername(tcp, (struct sockaddr *)&ss, &l) == 0)
    uvccl__addr_fmt((struct sockaddr *)&ss, buf, len);
  else
    snprintf(buf, len, "?:0");
}

void uvccl__tune_socket(int fd, uint64_t timeout_ms, int user_timeout) {
  int on = 1, idle, intvl, cnt = 3;
  unsigned ut;
  if (fd < 0 || timeout_ms == 0) return;
  /* Keepalive finds a vanished host on an idle connection, within about
   * the heartbeat timeout. A stopped process's kernel still answers it,
   * so it never fires for a rank that is merely slow. */
  idle = (int)(timeout_ms / 2000);
  if (idle < 1) idle = 1;
  intvl = (int)(timeout_ms / 6000);
  if (intvl < 1) intvl = 1;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  /* The user timeout bounds how long sent data may stay unacknowledged,
   * but Linux (since 5.11) also applies it to a zero window: a live peer
   * that does not read for that long (its application computing between
   * collectives) would lose its connection. So only the monitor's links,
   * which their thread always reads, get it. */
  if (!user_timeout) return;
  ut = timeout_ms > UINT32_MAX ? UINT32_MAX : (unsigned)timeout_ms;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof(ut));
}

int uvccl__eof_cause(const uv_tcp_t *tcp) {
#if defined(__linux__) && defined(TCP_INFO)
  struct tcp_info ti;
  socklen_t len = sizeof(ti);
  uv_os_fd_t fd;
  /* A FIN leaves the socket waiting for our close (CLOSE_WAIT); an abort
   * closes it (CLOSE). */
  if (uv_fileno((const uv_handle_t *)tcp, &fd) == 0 &&
      getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
      ti.tcpi_state == TCP_CLOSE)
    return UV_ETIMEDOUT;
#else
  (void)tcp;
#endif
  return UV_EOF;
}
