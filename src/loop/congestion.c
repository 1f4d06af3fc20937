/* The congestion control of TCP connections between ranks of one host.
 *
 * Many systems now default to bbr, which paces every connection with a
 * timer. Between hosts that is the system's choice to keep (it moves a
 * lossy link); on the loopback nothing queues, and the pacing only costs
 * the loop a timer interrupt every few packets (bench/RESULTS.md). */
#include "internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>

/* 1 when both ends of a connected socket have one address: a connection
 * within one host (the loopback, whatever address it was made to). */
static int same_address(int fd) {
  struct sockaddr_storage a, b;
  socklen_t la = sizeof(a), lb = sizeof(b);
  if (getsockname(fd, (struct sockaddr *)&a, &la) != 0 ||
      getpeername(fd, (struct sockaddr *)&b, &lb) != 0 ||
      a.ss_family != b.ss_family)
    return 0;
  if (a.ss_family == AF_INET)
    return ((struct sockaddr_in *)&a)->sin_addr.s_addr ==
           ((struct sockaddr_in *)&b)->sin_addr.s_addr;
  if (a.ss_family == AF_INET6)
    return memcmp(&((struct sockaddr_in6 *)&a)->sin6_addr,
                  &((struct sockaddr_in6 *)&b)->sin6_addr, 16) == 0;
  return 0;
}

void uvccl__tune_local(int fd) {
#if defined(__linux__) && defined(TCP_CONGESTION)
  static atomic_int warned; /* once a process: every connection would */
  const char *cc = uvccl__config_text(UVCCL__CFG_TCP_LOCAL_CC);
  if (cc == NULL || *cc == '\0') cc = "cubic";
  if (fd < 0 || strcmp(cc, "system") == 0 || !same_address(fd)) return;
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc)) !=
          0 &&
      atomic_exchange(&warned, 1) == 0) {
    /* not fatal: the connection works with the system's default */
    LOG_WARN("net", "UVCCL_TCP_LOCAL_CC=%s: the kernel refused it (%s); "
             "connections within the host keep the system's default",
             cc, strerror(errno));
  }
#else
  (void)fd;
#endif
}
