/* Group bootstrap helpers: launcher environment, init URLs, and address
 * selection. See bootenv.h.
 *
 * Address selection avoids the classic traps of Gloo and NCCL:
 *  - the host name resolving to 127.0.1.1 (Debian) and every rank
 *    advertising loopback: by default we ask the kernel which local address
 *    routes to the store's host, so loopback comes out only when the store
 *    itself is on loopback;
 *  - "^docker" picking lo because it comes first: loopback interfaces are
 *    taken only when no other interface the spec selects has an address;
 *  - mixed IPv4/IPv6 ranks (gloo#399): IPv4 first under AF_UNSPEC, and a
 *    forced family is never answered with the other one. */
#define _GNU_SOURCE
#include "bootenv.h"

#include "loop/internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define COMP "bootenv"

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  if (err == NULL || errlen == 0) return;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* Copies src into dst (size n); 0, or -1 if it does not fit. */
static int copy_str(char *dst, size_t n, const char *src, size_t len) {
  if (len >= n) return -1;
  memcpy(dst, src, len);
  dst[len] = '\0';
  return 0;
}

/* ---- Strict numbers ------------------------------------------------------ */

enum { NUM_OK = 0, NUM_BAD = -1, NUM_RANGE = -2 };

/* s[0..len): decimal digits only (at least one, at most 18), value within
 * [min, max]. */
static int parse_num(const char *s, size_t len, long long min, long long max,
                     long long *out) {
  long long v = 0;
  size_t i;
  if (len == 0) return NUM_BAD;
  for (i = 0; i < len; i++)
    if (s[i] < '0' || s[i] > '9') return NUM_BAD;
  if (len > 18) return NUM_RANGE;
  for (i = 0; i < len; i++) v = v * 10 + (s[i] - '0');
  if (v < min || v > max) return NUM_RANGE;
  *out = v;
  return NUM_OK;
}

/* ---- Launcher environment ------------------------------------------------ */

#define TORCH_HINT "env:// needs RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"

/* Reads the integer variable name. Returns 1 if set (value in *out), 0 if
 * unset and not required, UV_EINVAL otherwise (message in err). */
static int env_int(const char *name, int required, int min, int max,
                   const char *hint, int *out, char *err, size_t errlen) {
  const char *v = getenv(name);
  long long x = 0;
  int r;
  if (v == NULL) {
    if (!required) return 0;
    seterr(err, errlen, "%s is not set (%s)", name, hint);
    return UV_EINVAL;
  }
  if (*v == '\0') {
    seterr(err, errlen, "%s is set but empty (%s)", name, hint);
    return UV_EINVAL;
  }
  r = parse_num(v, strlen(v), min, max, &x);
  if (r == NUM_BAD) {
    /* A minus sign gets the range message: "-1" is a number, just not a
     * valid one here. */
    if (v[0] == '-' && v[1] != '\0' &&
        parse_num(v + 1, strlen(v + 1), 0, LLONG_MAX, &x) == NUM_OK)
      r = NUM_RANGE;
    else {
      seterr(err, errlen, "%s=%.64s is not a number", name, v);
      return UV_EINVAL;
    }
  }
  if (r == NUM_RANGE) {
    seterr(err, errlen, "%s=%.64s is out of range (%d to %d)", name, v, min,
           max);
    return UV_EINVAL;
  }
  *out = (int)x;
  return 1;
}

/* Slurm's compressed tasks-per-node list, "2(x3),1": the entry of node
 * nodeid (or, nodeid < 0, the common value when all entries agree). -1 when
 * unknown or unparsable. */
static int slurm_tasks_per_node(const char *s, int nodeid) {
  int node = 0, common = -1;
  if (s == NULL || *s == '\0') return -1;
  while (*s) {
    const char *p = s;
    long long n = 0, rep = 1;
    while (*p >= '0' && *p <= '9') p++;
    if (parse_num(s, (size_t)(p - s), 0, INT_MAX, &n) != NUM_OK) return -1;
    if (p[0] == '(') {
      const char *q;
      if (p[1] != 'x') return -1;
      q = p + 2;
      while (*q >= '0' && *q <= '9') q++;
      if (*q != ')' ||
          parse_num(p + 2, (size_t)(q - p - 2), 1, INT_MAX, &rep) != NUM_OK)
        return -1;
      p = q + 1;
    }
    if (nodeid >= 0 && nodeid >= node && nodeid - node < rep) return (int)n;
    if (nodeid < 0) {
      if (common >= 0 && common != n) return -1;
      common = (int)n;
    }
    node += rep > INT_MAX - node ? INT_MAX - node : (int)rep;
    if (*p == ',') p++;
    else if (*p != '\0') return -1;
    s = p;
  }
  return nodeid >= 0 ? -1 : common;
}

/* A plain host name: letters, digits, '.', '-', '_'. */
static int plain_hostname(const char *s) {
  const char *p;
  if (s == NULL || *s == '\0') return 0;
  for (p = s; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
          (*p >= '0' && *p <= '9') || *p == '.' || *p == '-' || *p == '_'))
      return 0;
  return p - s < 256;
}

int uvccl__env_read(uvccl__env_t *e, char *err, size_t errlen) {
  const char *rank_var, *size_var, *lrank_var, *lsize_var, *hint, *addr;
  char mpi_hint[160];
  int r;

  if (err && errlen) err[0] = '\0';
  if (e == NULL) {
    seterr(err, errlen, "no output struct");
    return UV_EINVAL;
  }
  memset(e, 0, sizeof(*e));
  e->local_rank = e->local_size = -1;

  if (getenv("RANK") || getenv("WORLD_SIZE")) {
    e->source = "torchrun";
    rank_var = "RANK";
    size_var = "WORLD_SIZE";
    lrank_var = "LOCAL_RANK";
    lsize_var = "LOCAL_WORLD_SIZE";
  } else if (getenv("OMPI_COMM_WORLD_RANK") || getenv("OMPI_COMM_WORLD_SIZE")) {
    e->source = "openmpi";
    rank_var = "OMPI_COMM_WORLD_RANK";
    size_var = "OMPI_COMM_WORLD_SIZE";
    lrank_var = "OMPI_COMM_WORLD_LOCAL_RANK";
    lsize_var = "OMPI_COMM_WORLD_LOCAL_SIZE";
  } else if (getenv("PMI_RANK") || getenv("PMI_SIZE")) {
    e->source = "pmi";
    rank_var = "PMI_RANK";
    size_var = "PMI_SIZE";
    lrank_var = "MPI_LOCALRANKID"; /* MPICH's Hydra */
    lsize_var = "MPI_LOCALNRANKS";
  } else if (getenv("SLURM_PROCID")) {
    e->source = "slurm";
    rank_var = "SLURM_PROCID";
    size_var = getenv("SLURM_NTASKS") || !getenv("SLURM_NPROCS")
                   ? "SLURM_NTASKS"
                   : "SLURM_NPROCS";
    lrank_var = "SLURM_LOCALID";
    lsize_var = NULL; /* below */
  } else {
    seterr(err, errlen,
           "RANK is not set (" TORCH_HINT
           ", as torchrun sets them; mpirun's OMPI_COMM_WORLD_RANK/SIZE, "
           "PMI_RANK/PMI_SIZE or srun's SLURM_PROCID/SLURM_NTASKS also do, "
           "with MASTER_ADDR and MASTER_PORT exported)");
    return UV_EINVAL;
  }

  if (strcmp(e->source, "torchrun") == 0) {
    hint = TORCH_HINT;
  } else {
    snprintf(mpi_hint, sizeof(mpi_hint),
             "env:// under %s needs %s, %s, MASTER_ADDR, MASTER_PORT",
             e->source, rank_var, size_var);
    hint = mpi_hint;
  }

  if ((r = env_int(rank_var, 1, 0, INT_MAX, hint, &e->rank, err, errlen)) < 0)
    return r;
  if ((r = env_int(size_var, 1, 1, INT_MAX, hint, &e->size, err, errlen)) < 0)
    return r;
  if (e->rank >= e->size) {
    seterr(err, errlen, "%s=%d is not less than %s=%d", rank_var, e->rank,
           size_var, e->size);
    return UV_EINVAL;
  }
  if ((r = env_int(lrank_var, 0, 0, INT_MAX, hint, &e->local_rank, err,
                   errlen)) < 0)
    return r;
  if (lsize_var) {
    if ((r = env_int(lsize_var, 0, 1, INT_MAX, hint, &e->local_size, err,
                     errlen)) < 0)
      return r;
  } else {
    /* Slurm: --ntasks-per-node when it is a plain number, else the
     * compressed per-node list. */
    const char *v = getenv("SLURM_NTASKS_PER_NODE");
    long long x;
    int nodeid = -1;
    if (v && parse_num(v, strlen(v), 1, INT_MAX, &x) == NUM_OK) {
      e->local_size = (int)x;
      lsize_var = "SLURM_NTASKS_PER_NODE";
    } else {
      v = getenv("SLURM_STEP_TASKS_PER_NODE");
      lsize_var = "SLURM_STEP_TASKS_PER_NODE";
      if (v == NULL) {
        v = getenv("SLURM_TASKS_PER_NODE");
        lsize_var = "SLURM_TASKS_PER_NODE";
      }
      if (getenv("SLURM_NODEID") &&
          env_int("SLURM_NODEID", 0, 0, INT_MAX, hint, &nodeid, err, errlen) <
              0)
        return UV_EINVAL;
      e->local_size = slurm_tasks_per_node(v, nodeid);
      if (e->local_size == 0) e->local_size = -1;
      if (v && e->local_size < 0)
        LOG_DEBUG(COMP, "%s=%s: local size unknown", lsize_var, v);
    }
  }
  if (e->local_rank >= 0 && e->local_size > 0 &&
      e->local_rank >= e->local_size) {
    seterr(err, errlen, "%s=%d is not less than %s=%d", lrank_var,
           e->local_rank, lsize_var, e->local_size);
    return UV_EINVAL;
  }
  if (e->local_size > e->size) {
    seterr(err, errlen, "%s=%d is more than %s=%d", lsize_var, e->local_size,
           size_var, e->size);
    return UV_EINVAL;
  }

  addr = getenv("MASTER_ADDR");
  if (addr == NULL || *addr == '\0') {
    const char *nl = getenv("SLURM_STEP_NODELIST");
    if (strcmp(e->source, "slurm") == 0 && addr == NULL && nl != NULL &&
        plain_hostname(nl)) {
      addr = nl;
    } else if (strcmp(e->source, "slurm") == 0 && addr == NULL && nl) {
      seterr(err, errlen,
             "MASTER_ADDR is not set and SLURM_STEP_NODELIST=%.64s is not a "
             "single host name; export MASTER_ADDR (for example "
             "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" "
             "| head -n 1)) and MASTER_PORT",
             nl);
      return UV_EINVAL;
    } else if (addr == NULL && strcmp(e->source, "torchrun") != 0) {
      seterr(err, errlen,
             "MASTER_ADDR is not set (%s; export them to every rank%s)", hint,
             strcmp(e->source, "openmpi") == 0
                 ? ", e.g. mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500"
                 : "");
      return UV_EINVAL;
    } else {
      seterr(err, errlen, "MASTER_ADDR is %s (%s)",
             addr ? "set but empty" : "not set", hint);
      return UV_EINVAL;
    }
  }
  {
    size_t len = strlen(addr);
    const char *p;
    if (addr[0] == '[' && len >= 2 && addr[len - 1] == ']') {
      addr++;
      len -= 2;
    }
    for (p = addr; p < addr + len; p++)
      if ((unsigned char)*p <= ' ' || *p == '/' || *p == '[' || *p == ']')
        break;
    if (len == 0 || p < addr + len) {
      seterr(err, errlen, "MASTER_ADDR=%.64s is not a host name or address",
             getenv("MASTER_ADDR") ? getenv("MASTER_ADDR") : addr);
      return UV_EINVAL;
    }
    if (copy_str(e->master_addr, sizeof(e->master_addr), addr, len) != 0) {
      seterr(err, errlen, "MASTER_ADDR is longer than %zu bytes",
             sizeof(e->master_addr) - 1);
      return UV_EINVAL;
    }
  }
  if ((r = env_int("MASTER_PORT", 1, 1, 65535, hint, &e->master_port, err,
                   errlen)) < 0)
    return r;
  return 0;
}

/* ---- Init URLs ------------------------------------------------------------ */

static int host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
}

static int v6_char(char c) {
  return (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
         (c >= '0' && c <= '9') || c == ':' || c == '.';
}

static int parse_query(const char *url, const char *q, int *rank, int *size,
                       char *err, size_t errlen) {
  int rk = -1, sz = -1;
  while (*q) {
    const char *amp = strchr(q, '&'), *eq;
    size_t n = amp ? (size_t)(amp - q) : strlen(q);
    long long v;
    if (n == 0) {
      q++;
      continue;
    }
    eq = memchr(q, '=', n);
    if (eq == NULL) {
      seterr(err, errlen, "URL '%s': query parameter '%.*s' has no value",
             url, (int)n, q);
      return UV_EINVAL;
    }
    if ((size_t)(eq - q) == 4 && memcmp(q, "rank", 4) == 0) {
      if (parse_num(eq + 1, n - 5, 0, INT_MAX, &v) != NUM_OK) {
        seterr(err, errlen, "URL '%s': rank=%.*s is not a number", url,
               (int)(n - 5), eq + 1);
        return UV_EINVAL;
      }
      rk = (int)v;
    } else if ((size_t)(eq - q) == 10 && memcmp(q, "world_size", 10) == 0) {
      if (parse_num(eq + 1, n - 11, 1, INT_MAX, &v) != NUM_OK) {
        seterr(err, errlen, "URL '%s': world_size=%.*s is not a positive number",
               url, (int)(n - 11), eq + 1);
        return UV_EINVAL;
      }
      sz = (int)v;
    } /* other parameters are ignored, as torch does */
    q += n;
  }
  if (rk >= 0 && sz > 0 && rk >= sz) {
    seterr(err, errlen, "URL '%s': rank=%d is not less than world_size=%d",
           url, rk, sz);
    return UV_EINVAL;
  }
  if (rank) *rank = rk;
  if (size) *size = sz;
  return 0;
}

int uvccl__url_parse(const char *url, char *scheme, char *host, int *port,
                     char *path, int *rank, int *size, char *err,
                     size_t errlen) {
  const char *sep, *rest, *q, *end, *p;
  size_t n, i;
  int r;

  if (err && errlen) err[0] = '\0';
  if (rank) *rank = -1;
  if (size) *size = -1;
  if (scheme) scheme[0] = '\0';
  if (host) host[0] = '\0';
  if (port) *port = 0;
  if (path) path[0] = '\0';
  if (scheme == NULL || host == NULL || port == NULL || path == NULL) {
    seterr(err, errlen, "no output buffers");
    return UV_EINVAL;
  }
  if (url == NULL || *url == '\0') {
    seterr(err, errlen, "empty init URL (expected env://, tcp://HOST:PORT "
                        "or file://PATH)");
    return UV_EINVAL;
  }
  sep = strstr(url, "://");
  n = sep ? (size_t)(sep - url) : 0;
  for (i = 0; sep && i < n; i++) {
    char c = url[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (i > 0 && ((c >= '0' && c <= '9') || c == '+' || c == '-' ||
                     c == '.'))))
      sep = NULL;
  }
  if (sep == NULL || n == 0) {
    seterr(err, errlen, "'%s' is not an init URL (expected env://, "
                        "tcp://HOST:PORT or file://PATH)", url);
    return UV_EINVAL;
  }
  if (n >= UVCCL__URL_SCHEME_MAX) n = UVCCL__URL_SCHEME_MAX - 1;
  for (i = 0; i < n; i++)
    scheme[i] = (char)(url[i] >= 'A' && url[i] <= 'Z' ? url[i] - 'A' + 'a'
                                                      : url[i]);
  scheme[n] = '\0';
  if (strcmp(scheme, "env") && strcmp(scheme, "tcp") && strcmp(scheme, "file")) {
    seterr(err, errlen, "URL '%s': unsupported scheme '%.*s' (expected "
                        "env://, tcp://HOST:PORT or file://PATH)",
           url, (int)(sep - url), url);
    scheme[0] = '\0';
    return UV_EINVAL;
  }
  rest = sep + 3;
  q = strchr(rest, '?');
  end = q ? q : rest + strlen(rest);
  if (q && (r = parse_query(url, q + 1, rank, size, err, errlen)) != 0)
    return r;

  if (strcmp(scheme, "env") == 0) {
    if (end > rest && !(end - rest == 1 && rest[0] == '/')) {
      seterr(err, errlen,
             "URL '%s': env:// takes no host or path (it reads MASTER_ADDR "
             "and MASTER_PORT; use tcp://HOST:PORT to name the store)", url);
      return UV_EINVAL;
    }
    return 0;
  }

  if (strcmp(scheme, "file") == 0) {
    p = rest;
    if (end - p >= 10 && strncasecmp(p, "localhost/", 10) == 0) p += 9;
    if (end == p) {
      seterr(err, errlen, "URL '%s': file:// needs a path (file:///abs/path)",
             url);
      return UV_EINVAL;
    }
    if (copy_str(path, UVCCL__URL_PATH_MAX, p, (size_t)(end - p)) != 0) {
      seterr(err, errlen, "URL '%.64s...': path longer than %d bytes", url,
             UVCCL__URL_PATH_MAX - 1);
      return UV_EINVAL;
    }
    return 0;
  }

  /* tcp://HOST:PORT[/] */
  {
    const char *auth_end = memchr(rest, '/', (size_t)(end - rest));
    const char *h, *h_end, *colon;
    long long v;
    if (auth_end == NULL) auth_end = end;
    if (auth_end != end && !(end - auth_end == 1)) {
      seterr(err, errlen, "URL '%s': tcp:// takes no path (tcp://HOST:PORT)",
             url);
      return UV_EINVAL;
    }
    if (memchr(rest, '@', (size_t)(auth_end - rest))) {
      seterr(err, errlen, "URL '%s': user names are not supported", url);
      return UV_EINVAL;
    }
    if (rest < auth_end && rest[0] == '[') {
      const char *rb = memchr(rest, ']', (size_t)(auth_end - rest));
      const char *pct;
      if (rb == NULL) {
        seterr(err, errlen, "URL '%s': missing ']' after the IPv6 address",
               url);
        return UV_EINVAL;
      }
      h = rest + 1;
      h_end = rb;
      pct = memchr(h, '%', (size_t)(h_end - h));
      for (p = h; p < (pct ? pct : h_end); p++)
        if (!v6_char(*p)) break;
      if (h == h_end || p < (pct ? pct : h_end) || memchr(h, ':', (size_t)(h_end - h)) == NULL) {
        seterr(err, errlen, "URL '%s': '%.*s' is not an IPv6 address", url,
               (int)(h_end - h), h);
        return UV_EINVAL;
      }
      for (p = pct ? pct + 1 : h_end; p < h_end; p++)
        if (!host_char(*p)) break;
      if (p < h_end || (pct && pct + 1 == h_end)) {
        seterr(err, errlen, "URL '%s': bad IPv6 zone", url);
        return UV_EINVAL;
      }
      colon = rb + 1 < auth_end ? rb + 1 : NULL;
      if (colon && *colon != ':') {
        seterr(err, errlen, "URL '%s': expected ':PORT' after ']'", url);
        return UV_EINVAL;
      }
    } else {
      h = rest;
      colon = NULL;
      for (p = rest; p < auth_end; p++)
        if (*p == ':') {
          if (colon) {
            seterr(err, errlen, "URL '%s': an IPv6 address must be in "
                                "brackets (tcp://[::1]:29500)", url);
            return UV_EINVAL;
          }
          colon = p;
        }
      h_end = colon ? colon : auth_end;
      if (h == h_end) {
        seterr(err, errlen, "URL '%s': tcp:// needs a host (tcp://HOST:PORT)",
               url);
        return UV_EINVAL;
      }
      for (p = h; p < h_end; p++)
        if (!host_char(*p)) {
          seterr(err, errlen, "URL '%s': '%.*s' is not a host name or "
                              "address", url, (int)(h_end - h), h);
          return UV_EINVAL;
        }
    }
    if (colon == NULL || colon + 1 == auth_end) {
      seterr(err, errlen, "URL '%s': tcp:// needs a port (tcp://HOST:PORT)",
             url);
      return UV_EINVAL;
    }
    if (parse_num(colon + 1, (size_t)(auth_end - colon - 1), 1, 65535, &v) !=
        NUM_OK) {
      seterr(err, errlen, "URL '%s': port '%.*s' is not a port number "
                          "(1 to 65535)", url, (int)(auth_end - colon - 1),
             colon + 1);
      return UV_EINVAL;
    }
    if (copy_str(host, UVCCL__URL_HOST_MAX, h, (size_t)(h_end - h)) != 0) {
      seterr(err, errlen, "URL '%.64s...': host longer than %d bytes", url,
             UVCCL__URL_HOST_MAX - 1);
      return UV_EINVAL;
    }
    *port = (int)v;
  }
  return 0;
}

/* ---- Addresses -------------------------------------------------------------- */

static socklen_t sa_len(int family) {
  return family == AF_INET6 ? (socklen_t)sizeof(struct sockaddr_in6)
                            : (socklen_t)sizeof(struct sockaddr_in);
}

static const char *family_name(int family) {
  return family == AF_INET ? "IPv4" : family == AF_INET6 ? "IPv6" : "any";
}

static int sa_is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) ==
           127;
  if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) ||
           (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return 0;
}

static int sa_is_any(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET)
    return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == INADDR_ANY;
  if (sa->sa_family == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(
        &((const struct sockaddr_in6 *)sa)->sin6_addr);
  return 0;
}

static int sa_is_linklocal6(const struct sockaddr *sa) {
  return sa->sa_family == AF_INET6 &&
         IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* Same address (ports ignored). */
static int sa_same_addr(const struct sockaddr *a, const struct sockaddr *b) {
  if (a->sa_family != b->sa_family) return 0;
  if (a->sa_family == AF_INET)
    return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
           ((const struct sockaddr_in *)b)->sin_addr.s_addr;
  if (a->sa_family == AF_INET6)
    return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                  &((const struct sockaddr_in6 *)b)->sin6_addr,
                  sizeof(struct in6_addr)) == 0;
  return 0;
}

static void set_port(struct sockaddr_storage *ss, int port) {
  if (ss->ss_family == AF_INET)
    ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
  else if (ss->ss_family == AF_INET6)
    ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
}

static void store_addr(struct sockaddr_storage *out, const struct sockaddr *sa) {
  memset(out, 0, sizeof(*out));
  memcpy(out, sa, sa_len(sa->sa_family));
  set_port(out, 0);
}

const char *uvccl__addr_str(const struct sockaddr *sa, char *buf, size_t len) {
  char a[INET6_ADDRSTRLEN + 1 + IF_NAMESIZE + 16];
  if (buf == NULL || len == 0) return buf;
  if (sa == NULL) {
    snprintf(buf, len, "(null)");
  } else if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    if (inet_ntop(AF_INET, &s4->sin_addr, a, sizeof(a)) == NULL)
      snprintf(a, sizeof(a), "?");
    snprintf(buf, len, "%s:%d", a, ntohs(s4->sin_port));
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    if (inet_ntop(AF_INET6, &s6->sin6_addr, a, INET6_ADDRSTRLEN) == NULL)
      snprintf(a, sizeof(a), "?");
    if (s6->sin6_scope_id != 0) {
      char ifn[IF_NAMESIZE];
      size_t l = strlen(a);
      if (if_indextoname(s6->sin6_scope_id, ifn))
        snprintf(a + l, sizeof(a) - l, "%%%s", ifn);
      else
        snprintf(a + l, sizeof(a) - l, "%%%u", (unsigned)s6->sin6_scope_id);
    }
    snprintf(buf, len, "[%s]:%d", a, ntohs(s6->sin6_port));
  } else {
    snprintf(buf, len, "(address family %d)", (int)sa->sa_family);
  }
  return buf;
}

static const char *addr_only(const struct sockaddr *sa, char *buf, size_t len) {
  char *c;
  uvccl__addr_str(sa, buf, len);
  if (sa && sa->sa_family == AF_INET6 && buf[0] == '[') {
    c = strrchr(buf, ']');
    if (c) {
      *c = '\0';
      memmove(buf, buf + 1, strlen(buf + 1) + 1);
    }
  } else if (sa && sa->sa_family == AF_INET) {
    c = strrchr(buf, ':');
    if (c) *c = '\0';
  }
  return buf;
}

static int gai_to_uv(int rc) {
  switch (rc) {
#ifdef EAI_ADDRFAMILY
  case EAI_ADDRFAMILY: return UV_EAI_ADDRFAMILY;
#endif
  case EAI_AGAIN: return UV_EAI_AGAIN;
  case EAI_BADFLAGS: return UV_EAI_BADFLAGS;
  case EAI_FAIL: return UV_EAI_FAIL;
  case EAI_FAMILY: return UV_EAI_FAMILY;
  case EAI_MEMORY: return UV_EAI_MEMORY;
#ifdef EAI_NODATA
  case EAI_NODATA: return UV_EAI_NODATA;
#endif
  case EAI_NONAME: return UV_EAI_NONAME;
  case EAI_SERVICE: return UV_EAI_SERVICE;
  case EAI_SOCKTYPE: return UV_EAI_SOCKTYPE;
  case EAI_SYSTEM: return errno ? -errno : UV_EAI_FAIL;
  default: return UV_EAI_FAIL;
  }
}

/* Resolves host ("[v6]" allowed) with any family. */
static int resolve(const char *host, struct addrinfo **res, char *err,
                   size_t errlen, const char *what) {
  struct addrinfo hints;
  char name[UVCCL__URL_HOST_MAX];
  const char *p;
  size_t len = strlen(host);
  int rc;
  if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
    host++;
    len -= 2;
  }
  if (len == 0 || copy_str(name, sizeof(name), host, len) != 0) {
    seterr(err, errlen, "%s '%.64s' is not a host name or address", what,
           host);
    return UV_EINVAL;
  }
  /* Names, IPv4 and IPv6 addresses (with a zone): nothing else is worth a
   * DNS query. */
  for (p = name; *p; p++)
    if (!host_char(*p) && *p != ':' && *p != '%') {
      seterr(err, errlen, "%s '%s' is not a host name or address", what, name);
      return UV_EINVAL;
    }
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  rc = getaddrinfo(name, NULL, &hints, res);
  if (rc != 0) {
    int uvr = gai_to_uv(rc);
    seterr(err, errlen, "%s '%s' does not resolve: %s", what, name,
           gai_strerror(rc));
    return uvr;
  }
  return 0;
}

/* The families to try, in order: the forced one, or IPv4 then IPv6. */
static int passes(int family, int out[2]) {
  if (family == AF_INET || family == AF_INET6) {
    out[0] = family;
    return 1;
  }
  out[0] = AF_INET;
  out[1] = AF_INET6;
  return 2;
}

static int bindable(const struct sockaddr *sa) {
  struct sockaddr_storage ss;
  int fd, ok;
  store_addr(&ss, sa);
  fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  ok = bind(fd, (struct sockaddr *)&ss, sa_len(sa->sa_family)) == 0 ? 0 : -errno;
  close(fd);
  return ok;
}

int uvccl__host_is_local(const char *host) {
  struct addrinfo *res = NULL, *ai;
  struct ifaddrs *ifs = NULL, *ifa;
  int local = 0;
  if (host == NULL || *host == '\0') return 0;
  if (resolve(host, &res, NULL, 0, "host") != 0) return 0;
  for (ai = res; ai && !local; ai = ai->ai_next)
    if (sa_is_loopback(ai->ai_addr) || sa_is_any(ai->ai_addr)) local = 1;
  if (!local && getifaddrs(&ifs) == 0) {
    for (ai = res; ai && !local; ai = ai->ai_next)
      for (ifa = ifs; ifa && !local; ifa = ifa->ifa_next)
        if (ifa->ifa_addr && sa_same_addr(ai->ai_addr, ifa->ifa_addr))
          local = 1;
    freeifaddrs(ifs);
  }
  freeaddrinfo(res);
  return local;
}

/* ---- Interface names --------------------------------------------------- */

int uvccl__ifname_match(const char *spec, const char *ifname) {
  int exclude = 0, exact = 0, any_entry = 0, hit = 0;
  const char *p;
  if (ifname == NULL) return 0;
  if (spec == NULL) return 1;
  while (*spec == ' ' || *spec == '\t') spec++;
  if (*spec == '^') {
    exclude = 1;
    spec++;
  }
  if (*spec == '=') {
    exact = 1;
    spec++;
  }
  p = spec;
  while (*p && !hit) {
    const char *e = strchr(p, ','), *b = p;
    size_t n;
    if (e == NULL) e = p + strlen(p);
    while (b < e && (*b == ' ' || *b == '\t')) b++;
    n = (size_t)(e - b);
    while (n > 0 && (b[n - 1] == ' ' || b[n - 1] == '\t')) n--;
    if (n > 0) {
      any_entry = 1;
      if (exact ? strlen(ifname) == n && memcmp(ifname, b, n) == 0
                : strncmp(ifname, b, n) == 0)
        hit = 1;
    }
    p = *e ? e + 1 : e;
  }
  if (!any_entry) return 1; /* "" and "^": no constraint */
  return exclude ? !hit : hit;
}

/* Appends name to a ", "-separated list in buf unless already there. */
static void list_add(char *buf, size_t len, const char *name) {
  size_t l = strlen(buf), n = strlen(name);
  const char *p = buf;
  while ((p = strstr(p, name)) != NULL) {
    if ((p == buf || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0')) return;
    p += n;
  }
  if (l + n + 3 >= len) return;
  snprintf(buf + l, len - l, "%s%s", l ? ", " : "", name);
}

/* The first usable address of an UP interface that spec selects (spec NULL:
 * any), in pass order; non-loopback interfaces first unless only_loopback
 * (1: loopback only, 0: both in that order, -1: non-loopback only). Only
 * interface only_if when not NULL. 0 or UV_ENODEV. */
static int pick_iface(struct ifaddrs *ifs, const char *spec, int family,
                      int loopback_mode, const char *only_if,
                      struct sockaddr_storage *out, char *ifname_out) {
  int fams[2], nf = passes(family, fams), f, lb;
  struct ifaddrs *ifa;
  for (f = 0; f < nf; f++)
    for (lb = 0; lb < 2; lb++) {
      if (loopback_mode < 0 && lb) continue;
      if (loopback_mode > 0 && !lb) continue;
      for (ifa = ifs; ifa; ifa = ifa->ifa_next) {
        if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != fams[f])
          continue;
        if (!(ifa->ifa_flags & IFF_UP)) continue;
        if (!!(ifa->ifa_flags & IFF_LOOPBACK) != lb) continue;
        if (only_if && strcmp(only_if, ifa->ifa_name) != 0) continue;
        if (spec && !uvccl__ifname_match(spec, ifa->ifa_name)) continue;
        if (sa_is_linklocal6(ifa->ifa_addr)) continue;
        store_addr(out, ifa->ifa_addr);
        if (ifname_out) snprintf(ifname_out, IF_NAMESIZE, "%s", ifa->ifa_name);
        return 0;
      }
    }
  return UV_ENODEV;
}

static int pick_by_ifname(const char *spec, const char *src, int family,
                          struct sockaddr_storage *out, char *err,
                          size_t errlen) {
  struct ifaddrs *ifs = NULL, *ifa;
  char all[512] = "", matched[256] = "", up[256] = "", ifn[IF_NAMESIZE];
  char a[INET6_ADDRSTRLEN + 64];
  int r;
  if (getifaddrs(&ifs) != 0) {
    r = -errno;
    seterr(err, errlen, "getifaddrs: %s", uv_strerror(r));
    return r;
  }
  r = pick_iface(ifs, spec, family, 0, NULL, out, ifn);
  if (r == 0) {
    LOG_DEBUG(COMP, "%s='%s': %s on %s", src, spec,
              addr_only((struct sockaddr *)out, a, sizeof(a)), ifn);
    freeifaddrs(ifs);
    return 0;
  }
  for (ifa = ifs; ifa; ifa = ifa->ifa_next) {
    list_add(all, sizeof(all), ifa->ifa_name);
    if (uvccl__ifname_match(spec, ifa->ifa_name)) {
      list_add(matched, sizeof(matched), ifa->ifa_name);
      if (ifa->ifa_flags & IFF_UP) list_add(up, sizeof(up), ifa->ifa_name);
    }
  }
  freeifaddrs(ifs);
  if (matched[0] == '\0')
    seterr(err, errlen, "no network interface matches %s='%s' (this host "
                        "has: %s)", src, spec, all[0] ? all : "none");
  else if (up[0] == '\0')
    seterr(err, errlen, "the interfaces that match %s='%s' (%s) are down",
           src, spec, matched);
  else
    seterr(err, errlen, "the interfaces that match %s='%s' (%s) have no "
                        "usable %s address", src, spec, up,
           family == AF_UNSPEC ? "IPv4 or IPv6" : family_name(family));
  return UV_ENODEV;
}

static int pick_by_host(const char *host, int family, const char *peer_host,
                        struct sockaddr_storage *out, char *err,
                        size_t errlen) {
  struct addrinfo *res = NULL, *ai;
  int fams[2], nf = passes(family, fams), f, r, seen = 0, last = 0;
  char a[INET6_ADDRSTRLEN + 64];
  if ((r = resolve(host, &res, err, errlen, "host")) != 0) return r;
  for (f = 0; f < nf; f++)
    for (ai = res; ai; ai = ai->ai_next) {
      if (ai->ai_family != fams[f]) continue;
      seen++;
      if (sa_is_any(ai->ai_addr)) {
        freeaddrinfo(res);
        seterr(err, errlen, "host '%s' is the wildcard address: give an "
                            "address the other ranks can reach", host);
        return UV_EINVAL;
      }
      if ((r = bindable(ai->ai_addr)) != 0) {
        last = r;
        continue;
      }
      store_addr(out, ai->ai_addr);
      freeaddrinfo(res);
      if (sa_is_loopback((struct sockaddr *)out) && peer_host &&
          !uvccl__host_is_local(peer_host))
        LOG_WARN(COMP, "host '%s' is loopback (%s) but the store is on '%s': "
                       "ranks on other hosts cannot reach this one",
                 host, addr_only((struct sockaddr *)out, a, sizeof(a)),
                 peer_host);
      return 0;
    }
  freeaddrinfo(res);
  if (seen == 0) {
    seterr(err, errlen, "host '%s' has no %s address (family forced to %s)",
           host, family_name(family), family_name(family));
    return UV_EAI_ADDRFAMILY;
  }
  seterr(err, errlen, "host '%s' is not an address of this machine (%s)",
         host, uv_strerror(last));
  return UV_EADDRNOTAVAIL;
}

/* The local address the kernel would use to reach peer (nothing sent). */
static int route_to(const struct sockaddr *peer, struct sockaddr_storage *out) {
  struct sockaddr_storage dst, me;
  socklen_t len = sizeof(me);
  int fd, r = 0;
  memset(&dst, 0, sizeof(dst));
  memcpy(&dst, peer, sa_len(peer->sa_family));
  set_port(&dst, 9); /* any non-zero port: connect() on UDP sends nothing */
  fd = socket(peer->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (connect(fd, (struct sockaddr *)&dst, sa_len(peer->sa_family)) != 0 ||
      getsockname(fd, (struct sockaddr *)&me, &len) != 0)
    r = -errno;
  close(fd);
  if (r == 0) {
    if (sa_is_any((struct sockaddr *)&me)) return UV_ENETUNREACH;
    store_addr(out, (struct sockaddr *)&me);
  }
  return r;
}

static int pick_by_route(const char *peer_host, int family,
                         struct sockaddr_storage *out, char *err,
                         size_t errlen) {
  struct addrinfo *res = NULL, *ai;
  struct ifaddrs *ifs = NULL, *ifa;
  struct sockaddr_storage me;
  int fams[2] = {AF_INET, AF_INET6}, f, r, last = UV_EAI_NODATA;
  char a[INET6_ADDRSTRLEN + 64], ifn[IF_NAMESIZE] = "";
  int found = 0;

  if ((r = resolve(peer_host, &res, err, errlen, "store host")) != 0)
    return r;
  /* The forced family first, then the other one (crossed below). */
  if (family == AF_INET6) {
    fams[0] = AF_INET6;
    fams[1] = AF_INET;
  }
  for (f = 0; f < 2 && !found; f++)
    for (ai = res; ai && !found; ai = ai->ai_next) {
      if (ai->ai_family != fams[f]) continue;
      if ((r = route_to(ai->ai_addr, &me)) == 0) found = 1;
      else last = r;
    }
  freeaddrinfo(res);
  if (!found) {
    seterr(err, errlen, "no route to the store host '%s': %s", peer_host,
           uv_strerror(last));
    return last;
  }
  if (family == AF_UNSPEC || me.ss_family == family) {
    *out = me;
    return 0;
  }
  /* The route is IPv4 and IPv6 is forced, or the reverse: an address of
   * the forced family on the interface that carries the route. */
  if (getifaddrs(&ifs) != 0) {
    r = -errno;
    seterr(err, errlen, "getifaddrs: %s", uv_strerror(r));
    return r;
  }
  for (ifa = ifs; ifa; ifa = ifa->ifa_next)
    if (ifa->ifa_addr && sa_same_addr(ifa->ifa_addr, (struct sockaddr *)&me)) {
      snprintf(ifn, sizeof(ifn), "%s", ifa->ifa_name);
      break;
    }
  if (ifn[0] == '\0' && sa_is_loopback((struct sockaddr *)&me))
    for (ifa = ifs; ifa; ifa = ifa->ifa_next)
      if (ifa->ifa_flags & IFF_LOOPBACK) {
        snprintf(ifn, sizeof(ifn), "%s", ifa->ifa_name);
        break;
      }
  r = ifn[0] ? pick_iface(ifs, NULL, family, 0, ifn, out, NULL) : UV_ENODEV;
  freeifaddrs(ifs);
  if (r != 0) {
    seterr(err, errlen, "the store host '%s' is reached over %s (from %s%s%s),"
                        " and that interface has no %s address; set host or "
                        "ifname, or leave the family unforced",
           peer_host, family_name(me.ss_family),
           addr_only((struct sockaddr *)&me, a, sizeof(a)),
           ifn[0] ? " on " : "", ifn, family_name(family));
    return UV_EAI_ADDRFAMILY;
  }
  return 0;
}

int uvccl__pick_address(const char *host, const char *ifname_spec,
                        int family, const char *peer_host,
                        struct sockaddr_storage *out, char *err,
                        size_t errlen) {
  const char *src = "ifname";
  char a[INET6_ADDRSTRLEN + 64];
  int r;

  if (err && errlen) err[0] = '\0';
  if (out == NULL) {
    seterr(err, errlen, "no output address");
    return UV_EINVAL;
  }
  memset(out, 0, sizeof(*out));
  if (family != AF_UNSPEC && family != AF_INET && family != AF_INET6) {
    seterr(err, errlen, "address family %d is not AF_UNSPEC, AF_INET or "
                        "AF_INET6", family);
    return UV_EINVAL;
  }
  if (host && *host) {
    r = pick_by_host(host, family, peer_host, out, err, errlen);
  } else {
    if (ifname_spec == NULL || *ifname_spec == '\0') {
      ifname_spec = uvccl__config_text(UVCCL__CFG_SOCKET_IFNAME);
      src = "UVCCL_SOCKET_IFNAME";
      if (ifname_spec && *ifname_spec == '\0') ifname_spec = NULL;
    }
    if (ifname_spec) {
      r = pick_by_ifname(ifname_spec, src, family, out, err, errlen);
    } else if (peer_host && *peer_host) {
      r = pick_by_route(peer_host, family, out, err, errlen);
    } else {
      struct ifaddrs *ifs = NULL;
      if (getifaddrs(&ifs) != 0) {
        r = -errno;
        seterr(err, errlen, "getifaddrs: %s", uv_strerror(r));
        return r;
      }
      r = pick_iface(ifs, NULL, family, -1, NULL, out, NULL);
      if (r != 0) {
        r = pick_iface(ifs, NULL, family, 1, NULL, out, NULL);
        if (r == 0)
          LOG_WARN(COMP, "no non-loopback %s interface is up: using %s, which "
                         "only processes on this host can reach",
                   family == AF_UNSPEC ? "network" : family_name(family),
                   addr_only((struct sockaddr *)out, a, sizeof(a)));
        else
          seterr(err, errlen, "no network interface with an %s address is up",
                 family == AF_UNSPEC ? "IPv4 or IPv6" : family_name(family));
      }
      freeifaddrs(ifs);
    }
  }
  if (r != 0) {
    memset(out, 0, sizeof(*out));
    return r;
  }
  /* Belt and braces: the promise about the family. */
  if (family != AF_UNSPEC && out->ss_family != family) {
    memset(out, 0, sizeof(*out));
    seterr(err, errlen, "internal error: picked an address of the wrong "
                        "family");
    return UV_EAI_ADDRFAMILY;
  }
  set_port(out, 0);
  LOG_DEBUG(COMP, "advertising %s", addr_only((struct sockaddr *)out, a,
                                              sizeof(a)));
  return 0;
}
