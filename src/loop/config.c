/* The table of UVCCL_* variables and their parsing (config.h). */
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define NOMAX UINT64_MAX
#define UINTV(id, n, lo, hi, d, dt, doc)                                       \
  [id] = {n, UVCCL__CFG_UINT, lo, hi, d, NULL, dt, doc}
#define CHOICE(id, n, ch, d, dt, doc)                                          \
  [id] = {n, UVCCL__CFG_CHOICE, 0, 0, d, ch, dt, doc}
#define TEXT(id, n, dt, doc) [id] = {n, UVCCL__CFG_TEXT, 0, 0, 0, NULL, dt, doc}
#define SECRET(id, n, doc)                                                     \
  [id] = {n, UVCCL__CFG_SECRET, 0, 0, 0, NULL, "unset", doc}

static const uvccl__cfg_var_t vars[UVCCL__CFG_COUNT] = {
    /* logging and diagnosis */
    CHOICE(UVCCL__CFG_LOG, "UVCCL_LOG", "off|error|warn|info|debug|trace", 2,
           "warn", "what is logged to stderr (also 0-5, or warning)"),
    CHOICE(UVCCL__CFG_DEBUG, "UVCCL_DEBUG", "off|info|detail", 0, "off",
           "detail: every collective checks the members' fingerprints first "
           "(a mismatch fails with UVCCL_EMISMATCH)"),
    TEXT(UVCCL__CFG_TRACE_DIR, "UVCCL_TRACE_DIR", "unset",
         "directory for flight recorder dumps; set, a timeout makes every "
         "rank dump there"),
    UINTV(UVCCL__CFG_TRACE_BUFFER_SIZE, "UVCCL_TRACE_BUFFER_SIZE", 0, 1u << 20,
          2000, "2000", "flight recorder entries kept per group (0: off)"),
    UINTV(UVCCL__CFG_TRACE_POLL_MS, "UVCCL_TRACE_POLL_MS", 0, 86400000, 1000,
          "1000", "how often a rank looks in the store for dump requests, "
          "ms (0: never)"),
    /* store, secrets, addresses */
    TEXT(UVCCL__CFG_STORE_BIND, "UVCCL_STORE_BIND",
         "the address the ranks are told",
         "address the store server a world embeds binds (any: every "
         "interface)"),
    SECRET(UVCCL__CFG_AUTH_TOKEN, "UVCCL_AUTH_TOKEN",
           "the secret store clients and the mesh prove"),
    TEXT(UVCCL__CFG_AUTH_FILE, "UVCCL_AUTH_FILE", "unset",
         "a file (readable by its owner only) holding the secret"),
    TEXT(UVCCL__CFG_TLS_CERT, "UVCCL_TLS_CERT", "unset",
         "this rank's certificate (PEM); with UVCCL_TLS_KEY and UVCCL_TLS_CA, "
         "connections use TLS"),
    TEXT(UVCCL__CFG_TLS_KEY, "UVCCL_TLS_KEY", "unset",
         "the certificate's private key (PEM)"),
    TEXT(UVCCL__CFG_TLS_CA, "UVCCL_TLS_CA", "unset",
         "the job's certificate authority (PEM)"),
    TEXT(UVCCL__CFG_SOCKET_IFNAME, "UVCCL_SOCKET_IFNAME",
         "the interface that routes to the store's host",
         "the interface to use, in NCCL's syntax (eth0, ^lo,docker, =eth0)"),
    /* process groups */
    CHOICE(UVCCL__CFG_TRANSPORT, "UVCCL_TRANSPORT", "auto|shm|tcp", 0, "auto",
           "tcp: no shared memory for this rank (its peers reach it through "
           "TCP); auto and shm: shared memory with the ranks of this host; "
           "another value fails group creation"),
    TEXT(UVCCL__CFG_HOST_ID, "UVCCL_HOST_ID", "unset",
         "this rank's host, for ranks of one kernel that stand for different "
         "hosts (network namespaces, containers): ranks whose values differ "
         "never share memory and count as different hosts"),
    CHOICE(UVCCL__CFG_RING_ORDER, "UVCCL_RING_ORDER", "host|ring|rank", 0,
           "host",
           "ring: rings and chains of large collectives visit each host's "
           "ranks one after another (each host's link carries each byte "
           "once however the ranks are placed); host: that, and where every "
           "host has as many ranks (two or more), allreduces, allgathers, "
           "reduce_scatters, barriers, broadcasts and small reduces go "
           "within each host and across the hosts in two levels (hosts of "
           "different sizes: allreduces and barriers through each host's "
           "leader, and allgathers and reduce_scatters too where every host "
           "has two ranks or more); rank: one ring in rank order, small "
           "collectives over all ranks"),
    UINTV(UVCCL__CFG_HEARTBEAT_TIMEOUT_MS, "UVCCL_HEARTBEAT_TIMEOUT_MS", 0,
          NOMAX, 15000, "15000",
          "how long a silent rank or store server has before it is declared "
          "failed, ms (0: no heartbeats)"),
    CHOICE(UVCCL__CFG_SHRINK_QUORUM, "UVCCL_SHRINK_QUORUM", "0|1", 1, "1",
           "1: a shrink that leaves out ranks of other hosts gone silent "
           "(who may be alive, cut off) goes on only on the side of a "
           "majority, or of a half holding the lowest rank; 0: every side "
           "shrinks to what it sees (split brain possible)"),
    CHOICE(UVCCL__CFG_GROW, "UVCCL_GROW", "keep|anew", 0, "keep",
           "keep: a grow of a CPU world keeps the members' connections (the "
           "joiners connect to them), unless its failed ranks would then "
           "outnumber its live ones; anew: every grow makes all connections "
           "anew (rank 0 of the members decides)"),
    UINTV(UVCCL__CFG_MESH_MAX, "UVCCL_MESH_MAX", 0, 1u << 30, 16, "16",
          "the largest world that connects its full mesh at creation (larger "
          "ones connect lazily)"),
    UINTV(UVCCL__CFG_BUSY_POLL_US, "UVCCL_BUSY_POLL_US", 0, 10000000, 0, "0",
          "how long the loop spins before it sleeps while collectives are in "
          "flight, us"),
    CHOICE(UVCCL__CFG_BUSY_POLL_FORCE, "UVCCL_BUSY_POLL_FORCE", "0|1", 0, "0",
           "1: busy polling stays on with more ranks than CPUs"),
    UINTV(UVCCL__CFG_TCP_SPIN_US, "UVCCL_TCP_SPIN_US", 0, 1000000, 100, "100",
          "how long a loop with collectives in flight over TCP keeps "
          "polling, yielding the CPU each turn, before it sleeps (with 3 "
          "or 4 ranks a CPU on this host: only while every collective in "
          "flight moves at most 128 KiB a transfer; more: it sleeps at "
          "once), us (0: sleep at once)"),
    UINTV(UVCCL__CFG_TCP_STRIPES, "UVCCL_TCP_STRIPES", 1, 16, 1, "1",
          "TCP connections to each rank of another host; a large frame is "
          "cut across them (4 where links lose packets and are long: 3-4x "
          "one connection there; every rank must have the same)"),
    UINTV(UVCCL__CFG_TCP_STRIPE_MIN, "UVCCL_TCP_STRIPE_MIN", 8192, NOMAX,
          262144, "262144",
          "the smallest frame, bytes, cut across a rank's TCP connections"),
    TEXT(UVCCL__CFG_TCP_LOCAL_CC, "UVCCL_TCP_LOCAL_CC", "cubic",
         "the congestion control of TCP connections between ranks within "
         "one host (both ends on one address): one that does not pace, "
         "since the loopback has no queue to spare (a pacing one, bbr, "
         "costs the loop a timer interrupt every few packets); system: "
         "the system's default, as for connections between hosts"),
    UINTV(UVCCL__CFG_SMALL_MAX, "UVCCL_SMALL_MAX", 0, NOMAX, 65536, "65536",
          "the largest collective, in bytes, that takes the small-message "
          "algorithms"),
    CHOICE(UVCCL__CFG_SMALL_TREE, "UVCCL_SMALL_TREE", "0|1", 0, "0",
           "1: small allreduces and barriers go through a tree"),
    UINTV(UVCCL__CFG_SCRATCH_KEEP_MS, "UVCCL_SCRATCH_KEEP_MS", 0, 86400000,
          5000, "5000",
          "how long a collective's large scratch buffer (1 MiB or more) is "
          "kept for the next collective that needs one, ms (0: unmapped at "
          "once)"),
    UINTV(UVCCL__CFG_SEGMENT, "UVCCL_SEGMENT", 1, 1u << 30, 524288, "524288",
          "the pipelining segment of large collectives, bytes"),
    UINTV(UVCCL__CFG_STREAM_MIN, "UVCCL_STREAM_MIN", 0, NOMAX, 8388608,
          "8388608",
          "outputs this large (bytes) or larger are written with "
          "non-temporal stores (0: never)"),
    CHOICE(UVCCL__CFG_REDUCE_ISA, "UVCCL_REDUCE_ISA",
           "auto|generic|avx2|avx512", 0, "auto",
           "the widest reduction kernels used (never more than the CPU has)"),
    UINTV(UVCCL__CFG_TURN_BYTES, "UVCCL_TURN_BYTES", 1, NOMAX, 524288,
          "524288",
          "bytes one uvccl callback on the loop moves at most (at least "
          "65536)"),
    UINTV(UVCCL__CFG_TURN_US, "UVCCL_TURN_US", 1, NOMAX, 500, "500",
          "time one uvccl callback on the loop runs at most, us (4294967295 "
          "or more: no limit)"),
    CHOICE(UVCCL__CFG_LOOP_STATS, "UVCCL_LOOP_STATS", "0|1", 0, "0",
           "1: uvccl_pg_loop_stats() also times each callback"),
    /* shared memory */
    UINTV(UVCCL__CFG_SHM_RING_KB, "UVCCL_SHM_RING_KB", 1, 4194304, 1024,
          "1024 (256 in worlds over 64 ranks)",
          "each shared-memory ring's size, KiB"),
    UINTV(UVCCL__CFG_SHM_SPIN_US, "UVCCL_SHM_SPIN_US", 0, 1000000, 100, "100",
          "how long a loop with shared-memory collectives in flight looks at "
          "its rings before it sleeps (with more ranks than CPUs on this "
          "host, yielding the CPU each turn; with 3 or 4 ranks a CPU, only "
          "while every collective in flight on the host moves at most 128 "
          "KiB a transfer; more: it sleeps at once), us (0: sleep at once)"),
    CHOICE(UVCCL__CFG_SHM_CMA, "UVCCL_SHM_CMA", "auto|0|1", 0, "auto",
           "single copy (process_vm_readv) for large frames: auto measures "
           "whether it pays"),
    UINTV(UVCCL__CFG_SHM_CMA_MIN, "UVCCL_SHM_CMA_MIN", 1, NOMAX, 262144,
          "262144", "the smallest frame, bytes, that goes with a single copy"),
    CHOICE(UVCCL__CFG_SHM_BOXES, "UVCCL_SHM_BOXES", "0|1", 1, "1",
           "0 on any rank: small collectives of worlds up to 8 ranks do not "
           "go through boxes"),
    CHOICE(UVCCL__CFG_SHM_HELPER, "UVCCL_SHM_HELPER", "auto|0|1", 0,
           "auto (on with twice the host's ranks in CPUs)",
           "the helper thread that takes half of large copies and "
           "reductions"),
    /* GPUs */
    TEXT(UVCCL__CFG_CUDART, "UVCCL_CUDART", "libcudart.so.13, then older",
         "the CUDA runtime library to load"),
    TEXT(UVCCL__CFG_NCCL, "UVCCL_NCCL", "libnccl.so.2",
         "the NCCL library to load"),
    UINTV(UVCCL__CFG_GPU_HEARTBEAT_MS, "UVCCL_GPU_HEARTBEAT_MS", 1, NOMAX,
          60000, "60000",
          "how long a device thread may sit in one CUDA call before its "
          "pending work fails, ms"),
    UINTV(UVCCL__CFG_NCCL_WATCHDOG_MS, "UVCCL_NCCL_WATCHDOG_MS", 1, NOMAX, 100,
          "100", "how often an NCCL group checks its operations' timeouts, "
          "ms"),
    UINTV(UVCCL__CFG_STAGE_CHUNK, "UVCCL_STAGE_CHUNK", 0, NOMAX, 1048576,
          "1048576",
          "GPU buffers in TCP groups: a collective staged through pinned "
          "memory goes in chunks of this many bytes or more (at most 64 "
          "chunks), each chunk's copies overlapping the others' transfers "
          "(0: whole; every rank alike)"),
    CHOICE(UVCCL__CFG_TORCH_CUDA, "UVCCL_TORCH_CUDA", "auto|nccl|staged", 0,
           "auto",
           "the PyTorch backend's CUDA tensors: through NCCL, or staged over "
           "TCP (read by the backend)"),
    UINTV(UVCCL__CFG_TORCH_SPIN_US, "UVCCL_TORCH_SPIN_US", 0, 1000000, 50,
          "50",
          "the PyTorch backend: how long its loop thread looks for the next "
          "call, and a caller in wait() for the end, before sleeping, us "
          "(off with more ranks than CPUs on the host, yielding with more "
          "than half as many; read by the backend)"),
    /* launchers */
    CHOICE(UVCCL__CFG_JOIN, "UVCCL_JOIN", "0|1", 0, "0",
           "1: this process replaces a rank of a running world and joins it "
           "(uvccl_pg_join) rather than making one; set by uvccl-run "
           "--respawn, read by uvccl-bench --elastic"),
    UINTV(UVCCL__CFG_RESPAWN_COUNT, "UVCCL_RESPAWN_COUNT", 0, NOMAX, 0, "0",
          "how many times uvccl-run --respawn started this rank again (set "
          "by it)"),
};

const uvccl__cfg_var_t *uvccl__config_var(int id) {
  return id >= 0 && id < UVCCL__CFG_COUNT ? &vars[id] : NULL;
}

int uvccl__config_find(const char *name) {
  int i;
  for (i = 0; i < UVCCL__CFG_COUNT; i++)
    if (strcmp(vars[i].name, name) == 0) return i;
  return -1;
}

const char *uvccl__config_text(uvccl__cfg_id_t id) {
  const char *v = getenv(vars[id].name);
  return v != NULL && *v != '\0' ? v : NULL;
}

/* The index of v among choices ("a|b|c"), any case; -1 if none. */
static int choice_index(const char *choices, const char *v) {
  const char *p = choices;
  size_t n = strlen(v);
  int i = 0;
  while (*p) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && strncasecmp(p, v, n) == 0) return i;
    if (bar == NULL) break;
    p = bar + 1;
    i++;
  }
  return -1;
}

/* Parses the variable's value: 0 unset, 1 valid (*out), UV_EINVAL. */
static int parse(int id, uint64_t *out, char *why, size_t whylen) {
  const uvccl__cfg_var_t *c = &vars[id];
  const char *v = uvccl__config_text((uvccl__cfg_id_t)id);
  if (v == NULL) return 0;
  if (c->type == UVCCL__CFG_UINT) {
    char *end;
    unsigned long long x;
    if (v[0] < '0' || v[0] > '9') goto bad_number;
    errno = 0;
    x = strtoull(v, &end, 10);
    if (*end != '\0' || errno == ERANGE) goto bad_number;
    if (x < c->min || x > c->max) {
      if (c->max == NOMAX)
        snprintf(why, whylen, "below %llu", (unsigned long long)c->min);
      else
        snprintf(why, whylen, "not within %llu-%llu",
                 (unsigned long long)c->min, (unsigned long long)c->max);
      return UV_EINVAL;
    }
    *out = x;
    return 1;
  bad_number:
    snprintf(why, whylen, "not a whole number");
    return UV_EINVAL;
  }
  if (c->type == UVCCL__CFG_CHOICE) {
    int i = choice_index(c->choices, v);
    /* the log level's numbers and its old spelling */
    if (i < 0 && id == UVCCL__CFG_LOG) {
      if (v[0] >= '0' && v[0] <= '5' && v[1] == '\0') i = v[0] - '0';
      else if (strcasecmp(v, "warning") == 0) i = 2;
    }
    if (i < 0) {
      snprintf(why, whylen, "not one of %s", c->choices);
      return UV_EINVAL;
    }
    *out = (uint64_t)i;
    return 1;
  }
  return 1;
}

int uvccl__config_check(int id, char *why, size_t whylen) {
  uint64_t x;
  if (id < 0 || id >= UVCCL__CFG_COUNT) return UV_EINVAL;
  why[0] = '\0';
  return parse(id, &x, why, whylen);
}

/* One warning for each malformed value a variable takes in a process. */
static pthread_mutex_t warned_mu = PTHREAD_MUTEX_INITIALIZER;
static char warned[UVCCL__CFG_COUNT][64];

static int value(uvccl__cfg_id_t id, uint64_t *out) {
  char why[96];
  int rc = parse((int)id, out, why, sizeof(why));
  if (rc == UV_EINVAL) {
    const char *v = getenv(vars[id].name);
    int first;
    pthread_mutex_lock(&warned_mu);
    first = strncmp(warned[id], v, sizeof(warned[id]) - 1) != 0;
    if (first) snprintf(warned[id], sizeof(warned[id]), "%s", v);
    pthread_mutex_unlock(&warned_mu);
    /* The log level's own reader cannot log (it decides the level). */
    if (first && id != UVCCL__CFG_LOG)
      LOG_WARN("config", "%s=%s is %s: the default, %s, holds",
               vars[id].name, v, why, vars[id].dflt_text);
  }
  if (rc != 1) *out = vars[id].dflt;
  return rc;
}

int uvccl__config_uint(uvccl__cfg_id_t id, uint64_t *out) {
  return value(id, out);
}

int uvccl__config_choice(uvccl__cfg_id_t id, int *out) {
  uint64_t x;
  int rc = value(id, &x);
  *out = (int)x;
  return rc;
}
