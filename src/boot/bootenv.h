/* Group bootstrap helpers: the launcher's environment (torchrun, mpirun,
 * PMI, srun), init URLs (env://, tcp://, file://), and which local address
 * a rank listens on and advertises (NCCL-style interface lists, or the
 * route to the store). Not installed.
 *
 * Every function is synchronous (getaddrinfo may block on a name lookup)
 * and returns 0 or a negative libuv error code; where it takes err/errlen,
 * a failure leaves a one-line message there that names the culprit (the
 * variable, the URL, the interface spec). */
#ifndef UVCCL_BOOT_BOOTENV_H
#define UVCCL_BOOT_BOOTENV_H

#include <stddef.h>
#include <sys/socket.h>

/* ---- Launcher environment ------------------------------------------------ */

typedef struct {
  int rank, size;            /* 0 <= rank < size */
  int local_rank, local_size; /* on this host; -1 when the launcher does not
                                 say (then local_rank < local_size is not
                                 checked) */
  char master_addr[256];     /* MASTER_ADDR ("[v6]" brackets removed) */
  int master_port;           /* MASTER_PORT, 1..65535 */
  const char *source;        /* "torchrun", "openmpi", "pmi" or "slurm" */
} uvccl__env_t;

/* Reads, in this order of precedence (the first family with its rank or
 * size variable set wins):
 *   torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
 *   openmpi:  OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
 *   pmi:      PMI_RANK, PMI_SIZE (local: MPI_LOCALRANKID, MPI_LOCALNRANKS)
 *   slurm:    SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS), SLURM_LOCALID;
 *             local size from SLURM_NTASKS_PER_NODE when a plain number,
 *             else SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE
 *             ("2(x3),1": this node's entry by SLURM_NODEID, or the common
 *             value when all nodes have the same)
 * plus MASTER_ADDR and MASTER_PORT, needed in every case. Under srun
 * without MASTER_ADDR, a SLURM_STEP_NODELIST that is one plain host name is
 * used; a list or a range ("node[01-04]") is an error that says what to
 * export. Numbers are strict: decimal digits only, no blanks, no sign, no
 * overflow. Returns 0 or UV_EINVAL with the reason in err ("RANK=abc is
 * not a number", "WORLD_SIZE is not set (env:// needs ...)"). */
int uvccl__env_read(uvccl__env_t *e, char *err, size_t errlen);

/* ---- Init URLs --------------------------------------------------------- */

#define UVCCL__URL_SCHEME_MAX 16
#define UVCCL__URL_HOST_MAX 256
#define UVCCL__URL_PATH_MAX 4096

/* Parses an init URL, as torch.distributed.init_process_group takes them:
 *   env://                   scheme "env"
 *   tcp://HOST:PORT          HOST a name or IPv4 address, PORT 1..65535
 *   tcp://[V6ADDR]:PORT      host without the brackets
 *   file:///abs/path         path "/abs/path"
 *   file://localhost/abs     path "/abs"
 *   file://rel/path          path "rel/path" (relative to the working
 *                            directory, as people write it)
 * each optionally followed by "?rank=R&world_size=N" (other parameters are
 * ignored, as torch does). A trailing "/" after tcp://HOST:PORT or env://
 * is accepted. The scheme is case-insensitive and returned in lower case.
 * Outputs: scheme (UVCCL__URL_SCHEME_MAX bytes), host
 * (UVCCL__URL_HOST_MAX; "" when none), *port (0 when none), path
 * (UVCCL__URL_PATH_MAX; "" when none), *rank and *size (-1 when absent;
 * rank and size may be NULL). Returns 0 or UV_EINVAL. */
int uvccl__url_parse(const char *url, char *scheme, char *host, int *port,
                     char *path, int *rank, int *size, char *err,
                     size_t errlen);

/* 1 if host (a name or address, "[v6]" brackets allowed) resolves to an
 * address of this machine: loopback, the wildcard address, or an address
 * of a local interface. 0 otherwise, or when it does not resolve. */
int uvccl__host_is_local(const char *host);

/* ---- Interfaces and addresses ------------------------------------------ */

/* NCCL_SOCKET_IFNAME syntax: a comma-separated list of name prefixes
 * ("eth,ib"); a leading '^' makes it an exclude list ("^lo,docker"); a
 * leading '=' (after the '^', if any) makes the entries exact names
 * ("=eth0", "^=lo"). Blanks around entries are ignored. An empty list
 * matches every interface ("" and "^" alike). 1 if ifname is selected. */
int uvccl__ifname_match(const char *spec, const char *ifname);

/* The address this rank listens on and advertises (port 0 in *out):
 *  - host != NULL: host resolved (IPv4 first under AF_UNSPEC), the first
 *    address of the family that can be bound here. Errors: no address of
 *    that family (UV_EAI_ADDRFAMILY), not an address of this machine
 *    (UV_EADDRNOTAVAIL), the wildcard address (UV_EINVAL).
 *  - else ifname_spec, or $UVCCL_SOCKET_IFNAME when ifname_spec is NULL or
 *    empty: the first address of an UP interface that the spec selects,
 *    IPv4 before IPv6 under AF_UNSPEC, non-loopback interfaces before
 *    loopback ones, IPv6 link-local addresses skipped. UV_ENODEV when none,
 *    with a message that names the spec and lists the interfaces.
 *  - else the local address the kernel routes peer_host through (a UDP
 *    socket connected to it: nothing is sent). A loopback peer gives
 *    127.0.0.1 or ::1. If the route is of the other family than the one
 *    forced, an address of that family on the same interface.
 *  - peer_host NULL too: the first address of an UP non-loopback
 *    interface, else loopback with a warning.
 * With family AF_INET or AF_INET6 the result is always of that family. */
int uvccl__pick_address(const char *host, const char *ifname_spec,
                        int family, const char *peer_host,
                        struct sockaddr_storage *out, char *err,
                        size_t errlen);

/* "1.2.3.4:port" or "[::1]:port" ("[fe80::1%eth0]:port" with a scope).
 * Returns buf. */
const char *uvccl__addr_str(const struct sockaddr *sa, char *buf, size_t len);

/* ---- The store of an init URL (url_store.c) -------------------------------- */

#include "uvccl.h"

/* Opens the store url names on loop: *o = opts with rank and size filled
 * from the URL or the launcher's environment (*local_rank: the launcher's,
 * or -1); rank 0 starts an embedded server (*server) for env:// and local
 * tcp://. 0, or an error logged under component (nothing left open). */
int uvccl__url_open(uv_loop_t *loop, const char *url,
                    const uvccl_pg_options_t *opts, const char *component,
                    uvccl_pg_options_t *o, int *local_rank,
                    uvccl_store_t **store, uvccl_store_server_t **server);
/* Closes and frees what uvccl__url_open made (either may be NULL). */
void uvccl__url_close(uvccl_store_t *store, uvccl_store_server_t *server);

#endif
