/* Worlds whose ranks sit in separate Linux network namespaces (t/2030,
 * t/2055): namespaces uvtA<pid>, uvtB<pid>, ... (one rank each) plus
 * uvtS<pid> holding a bridge; every rank namespace is joined to the bridge
 * by a veth pair (eth0 inside, pA, pB, ... on the bridge), addresses
 * NET_PREFIX 1, 2, ... /24, a private range that exists only inside these
 * namespaces (nothing is sent outside them). Rank 0 hosts the store
 * through env:// at NET_PREFIX "1":NS_MASTER_PORT. Needs root and
 * iproute2. The namespaces are removed at exit, on failure, on the test's
 * alarm and on SIGTERM/SIGINT (ns_install_cleanup). Include after
 * ranks.h. */
#ifndef UVCCL_T_NETNS_H
#define UVCCL_T_NETNS_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define NS_MAX 8
#define NET_PREFIX "10.213.0."
#define NS_MASTER_PORT "29500" /* the namespaces are ours: no conflict */

static const char *ipbin;
static char ns[NS_MAX + 1][32]; /* ranks, then the switch at ns[ns_n] */
static int ns_made[NS_MAX + 1];
static int ns_n;

/* Runs ip with args; output into out (may be NULL). Only fork/exec/wait
 * (so the cleanup may use it from a signal handler). Returns the exit
 * status, or -1. */
static inline int run_ip(const char *const *args, char *out, size_t outlen) {
  const char *argv[24];
  int n = 0, pfd[2] = {-1, -1}, st = 0;
  size_t len = 0;
  pid_t p;
  argv[n++] = ipbin;
  while (*args && n < 23) argv[n++] = *args++;
  argv[n] = NULL;
  if (out && pipe2(pfd, O_CLOEXEC) != 0) return -1;
  p = fork();
  if (p < 0) return -1;
  if (p == 0) {
    int dn = open("/dev/null", O_RDWR);
    dup2(dn, 0);
    dup2(out ? pfd[1] : dn, 1);
    dup2(out ? pfd[1] : dn, 2);
    execv(ipbin, (char *const *)argv);
    _exit(127);
  }
  if (out) {
    ssize_t r;
    close(pfd[1]);
    while (len + 1 < outlen &&
           ((r = read(pfd[0], out + len, outlen - len - 1)) > 0 ||
            (r < 0 && errno == EINTR)))
      if (r > 0) len += (size_t)r;
    out[len] = '\0';
    close(pfd[0]);
  }
  while (waitpid(p, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static inline void ns_cleanup(void) {
  int i;
  kill_live();
  for (i = NS_MAX; i >= 0; i--)
    if (ns_made[i]) {
      const char *a[] = {"netns", "del", ns[i], NULL};
      run_ip(a, NULL, 0);
      ns_made[i] = 0;
    }
}

static inline void ns_on_fatal_signal(int sig) {
  static const char m[] = "not ok - test timed out or was stopped; namespaces "
                          "removed\n";
  ns_cleanup();
  if (sig == SIGALRM && write(1, m, sizeof(m) - 1) < 0) { /* nothing */ }
  _exit(sig == SIGALRM ? 3 : 128 + sig);
}

/* Runs one ip command (NULL-terminated arguments); on failure, the command
 * and its output in err. */
static inline int ns_step(char *err, size_t errlen, ...) {
  const char *args[24];
  char out[1024];
  int n = 0, rc;
  va_list ap;
  va_start(ap, errlen);
  while (n < 23 && (args[n] = va_arg(ap, const char *)) != NULL) n++;
  va_end(ap);
  args[n] = NULL;
  rc = run_ip(args, out, sizeof(out));
  if (rc != 0 && err != NULL) {
    size_t l;
    int k;
    snprintf(err, errlen, "ip");
    for (k = 0; k < n; k++) {
      l = strlen(err);
      snprintf(err + l, errlen - l, " %s", args[k]);
    }
    l = strlen(err);
    snprintf(err + l, errlen - l, ": %s", out[0] ? out : "failed");
    for (l = 0; err[l]; l++)
      if (err[l] == '\n') err[l] = ' ';
  }
  return rc;
}

/* Finds ip, names the namespaces and arranges for their removal. 0, or a
 * reason to skip in why. */
static inline int ns_prepare(int n, char *why, size_t wl) {
  static const char *cands[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip",
                                "/bin/ip", NULL};
  int k;
  if (geteuid() != 0) {
    snprintf(why, wl, "network namespaces need root");
    return -1;
  }
  for (k = 0; cands[k]; k++)
    if (access(cands[k], X_OK) == 0) {
      ipbin = cands[k];
      break;
    }
  if (ipbin == NULL) {
    snprintf(why, wl, "no ip command (iproute2; tools/deps.sh installs it)");
    return -1;
  }
  ns_n = n;
  for (k = 0; k < n; k++)
    snprintf(ns[k], sizeof(ns[k]), "uvt%c%d", 'A' + k, (int)getpid());
  snprintf(ns[n], sizeof(ns[n]), "uvtS%d", (int)getpid());
  /* From the first namespace on, every way out removes them. */
  atexit(ns_cleanup);
  signal(SIGALRM, ns_on_fatal_signal);
  signal(SIGTERM, ns_on_fatal_signal);
  signal(SIGINT, ns_on_fatal_signal);
  signal(SIGHUP, ns_on_fatal_signal);
  return 0;
}

/* Makes the namespaces, the bridge and the veth pairs. */
static inline int ns_setup(char *err, size_t errlen) {
  char addr[32], port[16];
  int i;
  for (i = 0; i <= ns_n; i++) {
    const char *a[] = {"netns", "del", ns[i], NULL};
    run_ip(a, NULL, 0); /* a leftover of a run with our pid, if any */
    if (ns_step(err, errlen, "netns", "add", ns[i], NULL) != 0) return -1;
    ns_made[i] = 1;
  }
  if (ns_step(err, errlen, "-n", ns[ns_n], "link", "add", "br0", "type",
              "bridge", NULL) ||
      ns_step(err, errlen, "-n", ns[ns_n], "link", "set", "br0", "up", NULL))
    return -1;
  for (i = 0; i < ns_n; i++) {
    snprintf(port, sizeof(port), "p%c", 'A' + i);
    snprintf(addr, sizeof(addr), NET_PREFIX "%d/24", i + 1);
    if (ns_step(err, errlen, "-n", ns[i], "link", "add", "eth0", "type",
                "veth", "peer", "name", port, "netns", ns[ns_n], NULL) ||
        ns_step(err, errlen, "-n", ns[ns_n], "link", "set", port, "master",
                "br0", NULL) ||
        ns_step(err, errlen, "-n", ns[ns_n], "link", "set", port, "up",
                NULL) ||
        ns_step(err, errlen, "-n", ns[i], "addr", "add", addr, "dev", "eth0",
                NULL) ||
        ns_step(err, errlen, "-n", ns[i], "link", "set", "eth0", "up",
                NULL) ||
        ns_step(err, errlen, "-n", ns[i], "link", "set", "lo", "up", NULL))
      return -1;
  }
  return 0;
}

/* Starts rank r of a world of `world` in namespace nsi (`ip netns
 * exec`), with env:// variables and UVCCL_T_ROLE=role, plus extra "K=V"
 * entries. Rank 0 must be in namespace 0 (the store's address). */
static inline int ns_spawn_rank_in(proc_t *p, int r, int world, int nsi,
                                   const char *role,
                                   const char *const *extra) {
  char e_rank[32], e_size[32], *argv[6];
  int o[2], e[2], in[2];
  pid_t parent = getpid(), pid;
  memset(p, 0, sizeof(*p));
  p->obuf = calloc(1, 1);
  p->ebuf = calloc(1, 1);
  p->out = p->err = p->in = -1;
  if (pipe2(o, O_CLOEXEC) || pipe2(e, O_CLOEXEC) || pipe2(in, O_CLOEXEC))
    return -errno;
  snprintf(e_rank, sizeof(e_rank), "%d", r);
  snprintf(e_size, sizeof(e_size), "%d", world);
  argv[0] = (char *)ipbin;
  argv[1] = "netns";
  argv[2] = "exec";
  argv[3] = ns[nsi];
  argv[4] = self;
  argv[5] = NULL;
  fflush(stdout);
  pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(o[1], 1);
    dup2(e[1], 2);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    setenv("UVCCL_T_ROLE", role, 1);
    setenv("RANK", e_rank, 1);
    setenv("WORLD_SIZE", e_size, 1);
    setenv("MASTER_ADDR", NET_PREFIX "1", 1);
    setenv("MASTER_PORT", NS_MASTER_PORT, 1);
    for (; extra && *extra; extra++) putenv((char *)*extra);
    execv(ipbin, argv); /* ip netns exec execs the program itself */
    _exit(127);
  }
  close(o[1]);
  close(e[1]);
  close(in[0]);
  p->pid = pid;
  live_set(pid, 1);
  snprintf(p->name, sizeof(p->name), "rank %d in %.24s", r, ns[nsi]);
  p->out = o[0];
  p->err = e[0];
  p->in = in[1];
  return 0;
}

/* Rank r of ns_n, in namespace r. */
static inline int ns_spawn_rank(proc_t *p, int r, const char *role,
                                const char *const *extra) {
  return ns_spawn_rank_in(p, r, ns_n, r, role, extra);
}

/* 1 if a namespace of ours is still listed or mounted. */
static inline int ns_leftovers(void) {
  const char *a[] = {"netns", "list", NULL};
  char out[8192];
  int i, left = 0;
  run_ip(a, out, sizeof(out));
  for (i = 0; i <= ns_n; i++) {
    struct stat st;
    char path[192];
    snprintf(path, sizeof(path), "/run/netns/%s", ns[i]);
    if (stat(path, &st) == 0) left = 1;
    {
      const char *p = out;
      size_t nl = strlen(ns[i]);
      while ((p = strstr(p, ns[i])) != NULL) {
        if (p[nl] == '\0' || p[nl] == ' ' || p[nl] == '\n') left = 1;
        p += nl;
      }
    }
  }
  return left;
}

#endif
