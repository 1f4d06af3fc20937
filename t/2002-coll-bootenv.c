/* Group bootstrap helpers (src/boot/bootenv.c): launcher environments and
 * their error messages, init URLs, NCCL-style interface lists, and local
 * address selection (loopback only: nothing is sent anywhere). */
#include "tap.h"

#include "boot/bootenv.h"
#include "uvccl.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

static char err[512];

static const char *const all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK",
    "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID",
    "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID",
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "UVCCL_SOCKET_IFNAME", NULL};

static void clear_env(void) {
  int i;
  for (i = 0; all_vars[i]; i++) unsetenv(all_vars[i]);
}

/* setenv of "NAME=VALUE" pairs, NULL-terminated. */
static void set_env(const char *kv, ...) {
  va_list ap;
  va_start(ap, kv);
  while (kv) {
    char name[64];
    const char *eq = strchr(kv, '=');
    snprintf(name, sizeof(name), "%.*s", (int)(eq - kv), kv);
    setenv(name, eq + 1, 1);
    kv = va_arg(ap, const char *);
  }
  va_end(ap);
}

static int contains(const char *s, const char *sub) {
  int c = s && strstr(s, sub) != NULL;
  if (!c) note("'%s' does not contain '%s'", s ? s : "(null)", sub);
  return c;
}

/* env_read must fail with a message containing want. */
static void env_err(const char *want, const char *what) {
  uvccl__env_t e;
  int r;
  err[0] = '\0';
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == UV_EINVAL && contains(err, want), "env error: %s", what);
}

static void test_env(void) {
  uvccl__env_t e;
  int r;

  clear_env();
  env_err("RANK is not set", "nothing set");

  /* torchrun */
  set_env("RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2",
          "MASTER_ADDR=node0", "MASTER_PORT=29500", NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  is_int(r, 0, "torchrun: ok (%s)", err);
  is_str(e.source, "torchrun", "torchrun: source");
  ok(e.rank == 1 && e.size == 4 && e.local_rank == 1 && e.local_size == 2,
     "torchrun: rank %d size %d local %d/%d", e.rank, e.size, e.local_rank,
     e.local_size);
  is_str(e.master_addr, "node0", "torchrun: MASTER_ADDR");
  is_int(e.master_port, 29500, "torchrun: MASTER_PORT");

  /* Precedence: RANK wins over the MPI variables. */
  set_env("OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=8", NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && strcmp(e.source, "torchrun") == 0 && e.rank == 1,
     "torchrun variables win over Open MPI's");
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("OMPI_COMM_WORLD_SIZE");

  unsetenv("LOCAL_RANK");
  unsetenv("LOCAL_WORLD_SIZE");
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && e.local_rank == -1 && e.local_size == -1,
     "no LOCAL_*: local rank and size unknown (-1)");
  set_env("MASTER_ADDR=[::1]", NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && strcmp(e.master_addr, "::1") == 0,
     "MASTER_ADDR=[::1] loses its brackets ('%s')", e.master_addr);
  set_env("MASTER_ADDR=node0", NULL);

  set_env("RANK=abc", NULL);
  env_err("RANK=abc is not a number", "RANK=abc");
  set_env("RANK=1 ", NULL);
  env_err("RANK=1  is not a number", "trailing blank");
  set_env("RANK= 1", NULL);
  env_err("is not a number", "leading blank");
  set_env("RANK=+1", NULL);
  env_err("RANK=+1 is not a number", "sign");
  set_env("RANK=0x1", NULL);
  env_err("RANK=0x1 is not a number", "hex");
  set_env("RANK=1.0", NULL);
  env_err("RANK=1.0 is not a number", "decimal point");
  set_env("RANK=", NULL);
  env_err("RANK is set but empty", "empty");
  set_env("RANK=-1", NULL);
  env_err("RANK=-1 is out of range", "negative");
  set_env("RANK=99999999999999999999999", NULL);
  env_err("is out of range", "overflow");
  set_env("RANK=4", NULL);
  env_err("RANK=4 is not less than WORLD_SIZE=4", "rank >= size");
  set_env("RANK=0", "WORLD_SIZE=0", NULL);
  env_err("WORLD_SIZE=0 is out of range", "size 0");
  set_env("WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", NULL);
  env_err("LOCAL_RANK=2 is not less than LOCAL_WORLD_SIZE=2",
          "local rank >= local size");
  set_env("LOCAL_RANK=x", NULL);
  env_err("LOCAL_RANK=x is not a number", "bad LOCAL_RANK");
  unsetenv("LOCAL_RANK");
  unsetenv("LOCAL_WORLD_SIZE");
  unsetenv("WORLD_SIZE");
  env_err("WORLD_SIZE is not set (env:// needs RANK, WORLD_SIZE, "
          "MASTER_ADDR, MASTER_PORT)", "no WORLD_SIZE");
  set_env("WORLD_SIZE=4", NULL);
  unsetenv("RANK");
  env_err("RANK is not set (env:// needs RANK, WORLD_SIZE", "no RANK");
  set_env("RANK=0", NULL);
  unsetenv("MASTER_ADDR");
  env_err("MASTER_ADDR is not set (env:// needs RANK", "no MASTER_ADDR");
  set_env("MASTER_ADDR=", NULL);
  env_err("MASTER_ADDR is set but empty", "empty MASTER_ADDR");
  set_env("MASTER_ADDR=a b", NULL);
  env_err("MASTER_ADDR=a b is not a host name or address", "blank in addr");
  set_env("MASTER_ADDR=node0", NULL);
  unsetenv("MASTER_PORT");
  env_err("MASTER_PORT is not set (env:// needs", "no MASTER_PORT");
  set_env("MASTER_PORT=70000", NULL);
  env_err("MASTER_PORT=70000 is out of range (1 to 65535)", "port too big");
  set_env("MASTER_PORT=0", NULL);
  env_err("MASTER_PORT=0 is out of range", "port 0");
  set_env("MASTER_PORT=29x", NULL);
  env_err("MASTER_PORT=29x is not a number", "port junk");

  /* Open MPI */
  clear_env();
  set_env("OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=8",
          "OMPI_COMM_WORLD_LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_SIZE=4",
          "MASTER_ADDR=10.0.0.1", "MASTER_PORT=1234", NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && strcmp(e.source, "openmpi") == 0 && e.rank == 5 &&
         e.size == 8 && e.local_rank == 1 && e.local_size == 4 &&
         strcmp(e.master_addr, "10.0.0.1") == 0 && e.master_port == 1234,
     "openmpi (%s)", err);
  unsetenv("MASTER_ADDR");
  env_err("MASTER_ADDR is not set (env:// under openmpi needs "
          "OMPI_COMM_WORLD_RANK", "openmpi without MASTER_ADDR");
  ok(contains(err, "mpirun -x MASTER_ADDR"), "openmpi: the message says how");
  set_env("MASTER_ADDR=h", "OMPI_COMM_WORLD_SIZE=five", NULL);
  env_err("OMPI_COMM_WORLD_SIZE=five is not a number", "openmpi bad size");
  set_env("OMPI_COMM_WORLD_SIZE=8", "OMPI_COMM_WORLD_RANK=8", NULL);
  env_err("OMPI_COMM_WORLD_RANK=8 is not less than OMPI_COMM_WORLD_SIZE=8",
          "openmpi rank >= size");

  /* PMI (MPICH, Intel MPI) */
  clear_env();
  set_env("PMI_RANK=2", "PMI_SIZE=3", "MASTER_ADDR=h0", "MASTER_PORT=40000",
          NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && strcmp(e.source, "pmi") == 0 && e.rank == 2 && e.size == 3 &&
         e.local_rank == -1 && e.local_size == -1,
     "pmi (%s)", err);
  set_env("MPI_LOCALRANKID=0", "MPI_LOCALNRANKS=3", NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && e.local_rank == 0 && e.local_size == 3, "pmi: hydra's local");
  unsetenv("PMI_SIZE");
  env_err("PMI_SIZE is not set", "pmi without size");

  /* Slurm */
  clear_env();
  set_env("SLURM_PROCID=3", "SLURM_NTASKS=8", "SLURM_LOCALID=1",
          "SLURM_NTASKS_PER_NODE=2", "MASTER_ADDR=n0", "MASTER_PORT=29500",
          NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && strcmp(e.source, "slurm") == 0 && e.rank == 3 && e.size == 8 &&
         e.local_rank == 1 && e.local_size == 2,
     "slurm with SLURM_NTASKS_PER_NODE (%s; local %d/%d)", err, e.local_rank,
     e.local_size);
  unsetenv("SLURM_NTASKS_PER_NODE");
  set_env("SLURM_TASKS_PER_NODE=4(x2)", NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && e.local_size == 4, "slurm: SLURM_TASKS_PER_NODE=4(x2) -> %d",
     e.local_size);
  set_env("SLURM_TASKS_PER_NODE=3(x2),2", "SLURM_NODEID=2", NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && e.local_size == 2, "slurm: 3(x2),2 on node 2 -> %d",
     e.local_size);
  set_env("SLURM_NODEID=1", NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && e.local_size == 3, "slurm: 3(x2),2 on node 1 -> %d",
     e.local_size);
  unsetenv("SLURM_NODEID");
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && e.local_size == -1, "slurm: uneven list, no node id: unknown");
  set_env("SLURM_TASKS_PER_NODE=garbage", NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && e.local_size == -1, "slurm: unparsable list: unknown");
  unsetenv("SLURM_TASKS_PER_NODE");
  unsetenv("SLURM_NTASKS");
  set_env("SLURM_NPROCS=8", NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && e.size == 8, "slurm: SLURM_NPROCS when SLURM_NTASKS is unset");
  unsetenv("SLURM_NPROCS");
  env_err("SLURM_NTASKS is not set", "slurm without a size");
  set_env("SLURM_NTASKS=8", NULL);
  unsetenv("MASTER_ADDR");
  set_env("SLURM_STEP_NODELIST=node07", NULL);
  r = uvccl__env_read(&e, err, sizeof(err));
  ok(r == 0 && strcmp(e.master_addr, "node07") == 0,
     "slurm: MASTER_ADDR from a one-host SLURM_STEP_NODELIST (%s)", err);
  set_env("SLURM_STEP_NODELIST=node[01-04]", NULL);
  env_err("SLURM_STEP_NODELIST=node[01-04] is not a single host name",
          "slurm: a range is not guessed");
  ok(contains(err, "export MASTER_ADDR"), "slurm: the message says what to do");
  set_env("SLURM_STEP_NODELIST=a,b", NULL);
  env_err("is not a single host name", "slurm: a list is not guessed");
  unsetenv("SLURM_STEP_NODELIST");
  env_err("MASTER_ADDR is not set", "slurm without MASTER_ADDR or nodelist");
  set_env("MASTER_ADDR=n0", NULL);
  unsetenv("MASTER_PORT");
  env_err("MASTER_PORT is not set", "slurm: MASTER_PORT still needed");
  clear_env();
}

/* ---- URLs ------------------------------------------------------------------ */

static int url(const char *u, char *scheme, char *host, int *port, char *path,
               int *rank, int *size) {
  err[0] = '\0';
  return uvccl__url_parse(u, scheme, host, port, path, rank, size, err,
                          sizeof(err));
}

static void url_bad(const char *u, const char *want) {
  char scheme[16], host[256], path[4096];
  int port, rank, size, r = url(u, scheme, host, &port, path, &rank, &size);
  ok(r == UV_EINVAL && contains(err, want), "bad URL '%.40s': %s", u, err);
}

static void test_url(void) {
  char scheme[16], host[256], path[4096], big[5000];
  int port, rank, size, r;

  r = url("env://", scheme, host, &port, path, &rank, &size);
  ok(r == 0 && !strcmp(scheme, "env") && !host[0] && port == 0 && !path[0] &&
         rank == -1 && size == -1,
     "env:// (%s)", err);
  r = url("env://?rank=1&world_size=4", scheme, host, &port, path, &rank,
          &size);
  ok(r == 0 && !strcmp(scheme, "env") && rank == 1 && size == 4,
     "env://?rank=1&world_size=4 -> %d %d", rank, size);
  r = url("ENV:///", scheme, host, &port, path, NULL, NULL);
  ok(r == 0 && !strcmp(scheme, "env"), "ENV:/// (case, trailing slash)");

  r = url("tcp://10.1.2.3:29500", scheme, host, &port, path, &rank, &size);
  ok(r == 0 && !strcmp(scheme, "tcp") && !strcmp(host, "10.1.2.3") &&
         port == 29500 && !path[0] && rank == -1,
     "tcp://10.1.2.3:29500 (%s)", err);
  r = url("tcp://node-7.cluster_a:1/", scheme, host, &port, path, &rank,
          &size);
  ok(r == 0 && !strcmp(host, "node-7.cluster_a") && port == 1,
     "tcp:// name with trailing slash");
  r = url("tcp://[::1]:23456?world_size=2&rank=0&use_libuv=1", scheme, host,
          &port, path, &rank, &size);
  ok(r == 0 && !strcmp(host, "::1") && port == 23456 && rank == 0 &&
         size == 2,
     "tcp://[::1]:23456 with query (%s) -> '%s' %d %d %d", err, host, port,
     rank, size);
  r = url("tcp://[fe80::1%eth0]:5", scheme, host, &port, path, NULL, NULL);
  ok(r == 0 && !strcmp(host, "fe80::1%eth0") && port == 5,
     "tcp:// IPv6 with a zone");
  r = url("tcp://h:65535", scheme, host, &port, path, NULL, NULL);
  ok(r == 0 && port == 65535, "port 65535");

  r = url("file:///tmp/uvccl/store", scheme, host, &port, path, &rank, &size);
  ok(r == 0 && !strcmp(scheme, "file") && !strcmp(path, "/tmp/uvccl/store") &&
         !host[0] && port == 0,
     "file:///tmp/uvccl/store -> '%s'", path);
  r = url("file:///tmp/s?rank=3&world_size=5", scheme, host, &port, path,
          &rank, &size);
  ok(r == 0 && !strcmp(path, "/tmp/s") && rank == 3 && size == 5,
     "file:// with query");
  r = url("file://relative/dir/f", scheme, host, &port, path, NULL, NULL);
  ok(r == 0 && !strcmp(path, "relative/dir/f"), "file://relative -> '%s'",
     path);
  r = url("file://localhost/abs", scheme, host, &port, path, NULL, NULL);
  ok(r == 0 && !strcmp(path, "/abs"), "file://localhost/abs -> '%s'", path);

  url_bad("", "empty");
  url_bad("localhost:29500", "is not an init URL");
  url_bad("://x", "is not an init URL");
  url_bad("http://h:1", "unsupported scheme 'http'");
  url_bad("env://host:1", "env:// takes no host");
  url_bad("tcp://", "needs a host");
  url_bad("tcp://:29500", "needs a host");
  url_bad("tcp://host", "needs a port");
  url_bad("tcp://host:", "needs a port");
  url_bad("tcp://host:0", "not a port number");
  url_bad("tcp://host:65536", "not a port number");
  url_bad("tcp://host:12a", "not a port number");
  url_bad("tcp://host:-1", "not a port number");
  url_bad("tcp://::1:29500", "must be in brackets");
  url_bad("tcp://[::1:29500", "missing ']'");
  url_bad("tcp://[::1]29500", "expected ':PORT'");
  url_bad("tcp://[::1]", "needs a port");
  url_bad("tcp://[]:1", "is not an IPv6 address");
  url_bad("tcp://[zz]:1", "is not an IPv6 address");
  url_bad("tcp://user@host:1", "user names");
  url_bad("tcp://ho st:1", "is not a host name");
  url_bad("tcp://host:1/path", "takes no path");
  url_bad("file://", "needs a path");
  url_bad("file://?rank=1", "needs a path");
  url_bad("env://?rank=x", "rank=x is not a number");
  url_bad("env://?world_size=0", "world_size=0 is not a positive number");
  url_bad("env://?rank=4&world_size=4", "rank=4 is not less than world_size=4");
  url_bad("env://?rank", "has no value");
  memset(big, 'a', sizeof(big));
  memcpy(big, "file:///", 8);
  big[sizeof(big) - 1] = '\0';
  url_bad(big, "path longer than");
  memset(big, 'a', 400);
  memcpy(big, "tcp://", 6);
  memcpy(big + 400, ":1", 3);
  url_bad(big, "host longer than");
}

/* ---- interface lists ------------------------------------------------------ */

static void test_ifname(void) {
  static const struct {
    const char *spec, *name;
    int want;
  } c[] = {
      {"eth", "eth0", 1},         {"eth", "eth1", 1},
      {"eth", "ens3", 0},         {"eth0", "eth0", 1},
      {"eth0", "eth01", 1},       {"eth,ib", "ib0", 1},
      {"eth,ib", "lo", 0},        {"^lo,docker", "lo", 0},
      {"^lo,docker", "docker0", 0}, {"^lo,docker", "eth0", 1},
      {"^docker", "lo", 1},       {"=eth0", "eth0", 1},
      {"=eth0", "eth01", 0},      {"=eth0", "eth", 0},
      {"=eth0,ib0", "ib0", 1},    {"^=lo", "lo", 0},
      {"^=lo", "lo0", 1},         {"^=lo", "eth0", 1},
      {" eth0 , ib0 ", "ib0", 1}, {"eth,,ib", "ib1", 1},
      {"", "eth0", 1},            {"^", "eth0", 1},
      {"=", "eth0", 1},           {"^lo", "loopy", 0},
      {"eth0,eth0", "eth0", 1},
  };
  size_t i;
  for (i = 0; i < sizeof(c) / sizeof(c[0]); i++)
    is_int(uvccl__ifname_match(c[i].spec, c[i].name), c[i].want,
           "ifname '%s' vs %s", c[i].spec, c[i].name);
  is_int(uvccl__ifname_match(NULL, "eth0"), 1, "NULL spec matches all");
}

/* ---- addresses ---------------------------------------------------------------- */

static int have_ipv6_loopback(void) {
  int fd = socket(AF_INET6, SOCK_DGRAM, 0), ok6;
  struct sockaddr_in6 a;
  if (fd < 0) return 0;
  memset(&a, 0, sizeof(a));
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  ok6 = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
  close(fd);
  return ok6;
}

static const char *astr(const struct sockaddr_storage *ss) {
  static char b[128];
  return uvccl__addr_str((const struct sockaddr *)ss, b, sizeof(b));
}

static int is_loop(const struct sockaddr_storage *ss) {
  if (ss->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) ==
           127;
  return ss->ss_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ss)->sin6_addr);
}

/* The name of the loopback interface, and a non-loopback UP interface
 * with an IPv4 address (and that address), if any. */
static void find_ifaces(char *lo, char *other, char *other_addr) {
  struct ifaddrs *ifs, *ifa;
  lo[0] = other[0] = other_addr[0] = '\0';
  if (getifaddrs(&ifs) != 0) return;
  for (ifa = ifs; ifa; ifa = ifa->ifa_next) {
    if (!ifa->ifa_addr || !(ifa->ifa_flags & IFF_UP)) continue;
    if ((ifa->ifa_flags & IFF_LOOPBACK) && !lo[0])
      snprintf(lo, IF_NAMESIZE, "%s", ifa->ifa_name);
    if (!(ifa->ifa_flags & IFF_LOOPBACK) && !other[0] &&
        ifa->ifa_addr->sa_family == AF_INET) {
      snprintf(other, IF_NAMESIZE, "%s", ifa->ifa_name);
      inet_ntop(AF_INET, &((struct sockaddr_in *)ifa->ifa_addr)->sin_addr,
                other_addr, INET6_ADDRSTRLEN);
    }
  }
  freeifaddrs(ifs);
}

static void test_addr_str(void) {
  struct sockaddr_in a4;
  struct sockaddr_in6 a6;
  char b[128], tiny[6];
  memset(&a4, 0, sizeof(a4));
  a4.sin_family = AF_INET;
  a4.sin_port = htons(29500);
  inet_pton(AF_INET, "1.2.3.4", &a4.sin_addr);
  is_str(uvccl__addr_str((struct sockaddr *)&a4, b, sizeof(b)),
         "1.2.3.4:29500", "addr_str IPv4");
  memset(&a6, 0, sizeof(a6));
  a6.sin6_family = AF_INET6;
  a6.sin6_port = htons(1);
  a6.sin6_addr = in6addr_loopback;
  is_str(uvccl__addr_str((struct sockaddr *)&a6, b, sizeof(b)), "[::1]:1",
         "addr_str IPv6");
  inet_pton(AF_INET6, "2001:db8::42", &a6.sin6_addr);
  a6.sin6_port = htons(65535);
  is_str(uvccl__addr_str((struct sockaddr *)&a6, b, sizeof(b)),
         "[2001:db8::42]:65535", "addr_str IPv6 global");
  inet_pton(AF_INET6, "fe80::1", &a6.sin6_addr);
  a6.sin6_scope_id = if_nametoindex("lo");
  if (a6.sin6_scope_id)
    is_str(uvccl__addr_str((struct sockaddr *)&a6, b, sizeof(b)),
           "[fe80::1%lo]:65535", "addr_str IPv6 with scope");
  else
    ok(1, "# SKIP no interface 'lo'");
  uvccl__addr_str((struct sockaddr *)&a4, tiny, sizeof(tiny));
  is_str(tiny, "1.2.3", "addr_str truncates to the buffer");
  a4.sin_family = AF_UNIX;
  ok(contains(uvccl__addr_str((struct sockaddr *)&a4, b, sizeof(b)),
              "family"), "addr_str other family");
  is_str(uvccl__addr_str(NULL, b, sizeof(b)), "(null)", "addr_str NULL");
}

static void test_pick(void) {
  struct sockaddr_storage ss;
  char lo[IF_NAMESIZE], other[IF_NAMESIZE], other_addr[INET6_ADDRSTRLEN];
  int v6 = have_ipv6_loopback(), r;

  find_ifaces(lo, other, other_addr);
  note("loopback interface '%s', other '%s' (%s), IPv6 loopback: %s", lo,
       other, other_addr, v6 ? "yes" : "no");
  unsetenv("UVCCL_SOCKET_IFNAME");

  /* host */
  r = uvccl__pick_address("127.0.0.1", NULL, AF_UNSPEC, NULL, &ss, err,
                          sizeof(err));
  ok(r == 0 && !strcmp(astr(&ss), "127.0.0.1:0"),
     "host 127.0.0.1 -> %s (%s)", astr(&ss), err);
  r = uvccl__pick_address("127.0.0.1", "nonexistent0", AF_INET, "::1", &ss,
                          err, sizeof(err));
  ok(r == 0 && !strcmp(astr(&ss), "127.0.0.1:0"),
     "host wins over ifname and peer");
  r = uvccl__pick_address("localhost", NULL, AF_INET, NULL, &ss, err,
                          sizeof(err));
  ok(r == 0 && !strcmp(astr(&ss), "127.0.0.1:0"), "host localhost, AF_INET");
  r = uvccl__pick_address("127.0.0.1", NULL, AF_INET6, NULL, &ss, err,
                          sizeof(err));
  ok(r == UV_EAI_ADDRFAMILY && contains(err, "no IPv6 address") &&
         ss.ss_family == 0,
     "host 127.0.0.1 with AF_INET6: family mismatch (%s)", err);
  r = uvccl__pick_address("0.0.0.0", NULL, AF_UNSPEC, NULL, &ss, err,
                          sizeof(err));
  ok(r == UV_EINVAL && contains(err, "wildcard"), "host 0.0.0.0 refused (%s)",
     err);
  r = uvccl__pick_address("192.0.2.200", NULL, AF_UNSPEC, NULL, &ss, err,
                          sizeof(err));
  ok(r == UV_EADDRNOTAVAIL && contains(err, "not an address of this machine"),
     "host that is not ours refused (%s)", err);
  r = uvccl__pick_address("bad host!", NULL, AF_UNSPEC, NULL, &ss, err,
                          sizeof(err));
  ok(r < 0 && contains(err, "bad host!"), "unresolvable host (%s)", err);
  r = uvccl__pick_address("127.0.0.1", NULL, 12345, NULL, &ss, err,
                          sizeof(err));
  ok(r == UV_EINVAL, "bad family refused");
  if (v6) {
    r = uvccl__pick_address("::1", NULL, AF_UNSPEC, NULL, &ss, err,
                            sizeof(err));
    ok(r == 0 && !strcmp(astr(&ss), "[::1]:0"), "host ::1 -> %s", astr(&ss));
    r = uvccl__pick_address("[::1]", NULL, AF_INET6, NULL, &ss, err,
                            sizeof(err));
    ok(r == 0 && !strcmp(astr(&ss), "[::1]:0"), "host [::1] -> %s",
       astr(&ss));
    r = uvccl__pick_address("::1", NULL, AF_INET, NULL, &ss, err,
                            sizeof(err));
    ok(r == UV_EAI_ADDRFAMILY && contains(err, "no IPv4 address"),
       "host ::1 with AF_INET: family mismatch (%s)", err);
  } else {
    ok(1, "# SKIP no IPv6 loopback");
    ok(1, "# SKIP no IPv6 loopback");
    ok(1, "# SKIP no IPv6 loopback");
  }

  /* route to the store's host */
  r = uvccl__pick_address(NULL, NULL, AF_UNSPEC, "127.0.0.1", &ss, err,
                          sizeof(err));
  ok(r == 0 && !strcmp(astr(&ss), "127.0.0.1:0"), "peer 127.0.0.1 -> %s (%s)",
     astr(&ss), err);
  r = uvccl__pick_address(NULL, NULL, AF_INET, "localhost", &ss, err,
                          sizeof(err));
  ok(r == 0 && is_loop(&ss) && ss.ss_family == AF_INET,
     "peer localhost, AF_INET -> %s", astr(&ss));
  if (v6) {
    r = uvccl__pick_address(NULL, NULL, AF_INET6, "::1", &ss, err,
                            sizeof(err));
    ok(r == 0 && !strcmp(astr(&ss), "[::1]:0"), "peer ::1, AF_INET6 -> %s (%s)",
       astr(&ss), err);
    /* A forced family other than the route's: the same interface's. */
    r = uvccl__pick_address(NULL, NULL, AF_INET6, "127.0.0.1", &ss, err,
                            sizeof(err));
    ok(r == 0 && !strcmp(astr(&ss), "[::1]:0"),
       "peer 127.0.0.1, AF_INET6 -> %s (%s)", astr(&ss), err);
    r = uvccl__pick_address(NULL, NULL, AF_INET, "::1", &ss, err,
                            sizeof(err));
    ok(r == 0 && !strcmp(astr(&ss), "127.0.0.1:0"),
       "peer ::1, AF_INET -> %s (%s)", astr(&ss), err);
  } else {
    ok(1, "# SKIP no IPv6 loopback");
    ok(1, "# SKIP no IPv6 loopback");
    ok(1, "# SKIP no IPv6 loopback");
  }
  if (other[0]) {
    /* This host's own address: routed over lo, but the source is that
     * address, not loopback. */
    char want[64];
    snprintf(want, sizeof(want), "%s:0", other_addr);
    r = uvccl__pick_address(NULL, NULL, AF_INET, other_addr, &ss, err,
                            sizeof(err));
    ok(r == 0 && !strcmp(astr(&ss), want), "peer %s (this host) -> %s",
       other_addr, astr(&ss));
  } else {
    ok(1, "# SKIP no non-loopback IPv4 interface");
  }
  r = uvccl__pick_address(NULL, NULL, AF_UNSPEC, "bad host!", &ss, err,
                          sizeof(err));
  ok(r < 0 && contains(err, "store host 'bad host!'"),
     "unresolvable peer (%s)", err);

  /* no peer: a non-loopback interface when there is one */
  r = uvccl__pick_address(NULL, NULL, AF_UNSPEC, NULL, &ss, err, sizeof(err));
  ok(r == 0 && (other[0] ? !is_loop(&ss) : is_loop(&ss)),
     "no peer -> %s", astr(&ss));

  /* ifname */
  if (lo[0]) {
    r = uvccl__pick_address(NULL, lo, AF_UNSPEC, NULL, &ss, err, sizeof(err));
    ok(r == 0 && is_loop(&ss) && ss.ss_family == AF_INET,
       "ifname %s -> %s (%s)", lo, astr(&ss), err);
    r = uvccl__pick_address(NULL, lo, AF_UNSPEC, "192.0.2.1", &ss, err,
                            sizeof(err));
    ok(r == 0 && is_loop(&ss), "ifname wins over the peer's route");
    if (v6) {
      r = uvccl__pick_address(NULL, lo, AF_INET6, NULL, &ss, err,
                              sizeof(err));
      ok(r == 0 && !strcmp(astr(&ss), "[::1]:0"), "ifname %s AF_INET6 -> %s",
         lo, astr(&ss));
    } else {
      ok(1, "# SKIP no IPv6 loopback");
    }
    setenv("UVCCL_SOCKET_IFNAME", lo, 1);
    r = uvccl__pick_address(NULL, NULL, AF_INET, "192.0.2.1", &ss, err,
                            sizeof(err));
    ok(r == 0 && is_loop(&ss), "UVCCL_SOCKET_IFNAME=%s -> %s", lo, astr(&ss));
    r = uvccl__pick_address(NULL, "", AF_INET, NULL, &ss, err, sizeof(err));
    ok(r == 0 && is_loop(&ss), "empty ifname: UVCCL_SOCKET_IFNAME used");
    setenv("UVCCL_SOCKET_IFNAME", "nonexistent0", 1);
    r = uvccl__pick_address(NULL, NULL, AF_UNSPEC, NULL, &ss, err,
                            sizeof(err));
    ok(r == UV_ENODEV && contains(err, "UVCCL_SOCKET_IFNAME='nonexistent0'"),
       "bad UVCCL_SOCKET_IFNAME named (%s)", err);
    setenv("UVCCL_SOCKET_IFNAME", "", 1);
    r = uvccl__pick_address(NULL, NULL, AF_INET, "127.0.0.1", &ss, err,
                            sizeof(err));
    ok(r == 0 && is_loop(&ss), "empty UVCCL_SOCKET_IFNAME is unset");
    unsetenv("UVCCL_SOCKET_IFNAME");
  } else {
    int i;
    for (i = 0; i < 7; i++) ok(1, "# SKIP no loopback interface");
  }
  r = uvccl__pick_address(NULL, "nonexistent0", AF_UNSPEC, NULL, &ss, err,
                          sizeof(err));
  ok(r == UV_ENODEV && contains(err, "ifname='nonexistent0'") &&
         contains(err, "this host has:") && ss.ss_family == 0,
     "ifname nonexistent0 -> error (%s)", err);
  r = uvccl__pick_address(NULL, "=nonexistent0,nonexistent1", AF_UNSPEC,
                          "127.0.0.1", &ss, err, sizeof(err));
  ok(r == UV_ENODEV && contains(err, "=nonexistent0,nonexistent1"),
     "exact list names the spec");
  if (other[0]) {
    char spec[64];
    /* "^lo"-style exclude lists never fall to loopback when something else
     * matches: "^docker" must not pick lo just because it comes first. */
    r = uvccl__pick_address(NULL, "^docker", AF_INET, NULL, &ss, err,
                            sizeof(err));
    ok(r == 0 && !is_loop(&ss), "^docker prefers %s over loopback -> %s",
       other, astr(&ss));
    snprintf(spec, sizeof(spec), "^%s", lo[0] ? lo : "lo");
    r = uvccl__pick_address(NULL, spec, AF_INET, NULL, &ss, err, sizeof(err));
    ok(r == 0 && !is_loop(&ss), "%s excludes loopback -> %s", spec,
       astr(&ss));
    snprintf(spec, sizeof(spec), "=%s", other);
    r = uvccl__pick_address(NULL, spec, AF_INET, NULL, &ss, err, sizeof(err));
    ok(r == 0 && strstr(astr(&ss), other_addr) == astr(&ss),
       "%s -> %s", spec, astr(&ss));
  } else {
    ok(1, "# SKIP no non-loopback IPv4 interface");
    ok(1, "# SKIP no non-loopback IPv4 interface");
    ok(1, "# SKIP no non-loopback IPv4 interface");
  }
  r = uvccl__pick_address(NULL, NULL, AF_UNSPEC, NULL, NULL, err, sizeof(err));
  ok(r == UV_EINVAL, "NULL out refused");
}

static void test_host_is_local(void) {
  char lo[IF_NAMESIZE], other[IF_NAMESIZE], other_addr[INET6_ADDRSTRLEN];
  find_ifaces(lo, other, other_addr);
  is_int(uvccl__host_is_local("127.0.0.1"), 1, "127.0.0.1 is local");
  is_int(uvccl__host_is_local("127.0.1.1"), 1, "127.0.1.1 is local");
  is_int(uvccl__host_is_local("localhost"), 1, "localhost is local");
  is_int(uvccl__host_is_local("0.0.0.0"), 1, "0.0.0.0 is local");
  if (have_ipv6_loopback()) {
    is_int(uvccl__host_is_local("::1"), 1, "::1 is local");
    is_int(uvccl__host_is_local("[::1]"), 1, "[::1] is local");
  } else {
    ok(1, "# SKIP no IPv6 loopback");
    ok(1, "# SKIP no IPv6 loopback");
  }
  if (other[0])
    is_int(uvccl__host_is_local(other_addr), 1, "%s (%s) is local",
           other_addr, other);
  else
    ok(1, "# SKIP no non-loopback IPv4 interface");
  is_int(uvccl__host_is_local("203.0.113.7"), 0, "203.0.113.7 is not local");
  is_int(uvccl__host_is_local("2001:db8::7"), 0, "2001:db8::7 is not local");
  is_int(uvccl__host_is_local(""), 0, "empty is not local");
  is_int(uvccl__host_is_local(NULL), 0, "NULL is not local");
}

int main(void) {
  tap_alarm(60);
  test_env();
  test_url();
  test_ifname();
  test_addr_str();
  test_pick();
  test_host_is_local();
  return done_testing();
}
