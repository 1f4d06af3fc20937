/* uvccl-store: the command-line front end of uvccl's TCP store.
 *
 *   uvccl-store serve [options]             run a store server
 *   uvccl-store HOST:PORT [options] CMD ... one client operation
 *
 * Both use only the public API in uvccl.h, so they double as its first
 * user. The load generator is a program of its own in bench/store
 * (uvccl-store-bench).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "uvccl.h"

#define PROG "uvccl-store"

/* The PyTorch default (MASTER_PORT). */
#define DEFAULT_PORT 29500
/* A command-line client should not sit for PyTorch's 300 s by default. */
#define CLIENT_DEFAULT_TIMEOUT_MS 30000

static const char usage_text[] =
"usage:\n"
"  " PROG " serve [options]                    run a TCPStore server\n"
"  " PROG " HOST:PORT [options] COMMAND [ARGS] one client operation\n"
"  " PROG " --help | --version\n"
"\n"
"serve options:\n"
"  --host H            address to bind (default: \"::\" dual-stack, falling\n"
"                      back to 0.0.0.0)\n"
"  --port P            port (default 29500; 0 picks a free one)\n"
"  --listen-fd FD      adopt an already bound socket instead of binding\n"
"  --backlog N         listen backlog (default: somaxconn)\n"
"  --max-memory BYTES  keys + values held (default 1G; suffixes K M G)\n"
"  --max-key-len BYTES, --max-value-len BYTES, --max-keys N,\n"
"  --max-output BYTES  per-request and per-connection limits\n"
"  --auth-file F       clients must prove they hold the secret in F (a file\n"
"                      readable by its owner only); default: the secret in\n"
"                      $UVCCL_AUTH_TOKEN or the file $UVCCL_AUTH_FILE, if\n"
"                      any; --no-auth: none (open to anyone, as PyTorch's)\n"
"  --tls-cert F --tls-key F --tls-ca F\n"
"                      TLS: the server's certificate and key, and the CA\n"
"                      clients' certificates must verify against (default:\n"
"                      $UVCCL_TLS_CERT, $UVCCL_TLS_KEY, $UVCCL_TLS_CA, if\n"
"                      set); --no-tls: none\n"
"  --quiet             library log at error level only, no shutdown notice\n"
"  --print-cpu         print the process CPU time to stderr at exit\n"
"  Prints \"listening on HOST:PORT\" to stdout once bound. SIGINT/SIGTERM\n"
"  shut down gracefully (a second one exits at once); SIGUSR1 prints\n"
"  statistics to stderr.\n"
"\n"
"client options (before COMMAND):\n"
"  --legacy            speak PyTorch 1.13's dialect only (default: the newer\n"
"                      one, or 1.13's when the server knows only that)\n"
"  --modern            speak the newer dialect only\n"
"  --auth-file F       prove to the server that we hold the secret in F\n"
"                      (default: $UVCCL_AUTH_TOKEN, $UVCCL_AUTH_FILE);\n"
"                      --no-auth: prove nothing\n"
"  --tls-cert F --tls-key F --tls-ca F, --no-tls\n"
"                      TLS, as the server's (the CA the server's\n"
"                      certificate must verify against)\n"
"  --timeout MS        store timeout, also for connecting (default 30000)\n"
"  --raw               print values as exact bytes, without a newline\n"
"  --block             queue-pop waits for an item (up to the timeout)\n"
"  HOST may be a name, an IPv4 address or a bracketed IPv6 address\n"
"  ([::1]:29500). Keys are sent as \"/\" + KEY, as PyTorch's client does.\n"
"\n"
"commands:\n"
"  set KEY VALUE                       append KEY VALUE\n"
"  get KEY                             waits for KEY, prints its value\n"
"  add KEY DELTA                       prints the new value\n"
"  wait KEY...                         waits until every KEY exists\n"
"  check KEY...                        prints ready / not ready (exit 0 / 1)\n"
"  delete KEY                          prints 1 if it existed, else 0\n"
"  num-keys                            list (one key per line)\n"
"  compare-set KEY EXPECTED DESIRED    prints the value after the call\n"
"  queue-push KEY VALUE                queue-pop KEY\n"
"  queue-len KEY\n"
"  set, append and queue-push are fire-and-forget on the wire; they are\n"
"  followed by a num-keys round trip so that a server that rejects them is\n"
"  noticed. Errors: \"" PROG ": <cmd> '<key>': <why>\", exit 1.\n";

#include "cli.h"

/* ------------------------------------------------------------------------ */
/* Addresses and CPU time                                                   */


/* "[v6]:port", "host:port" or "v4:port". */
static int parse_hostport(const char *s, char *host, size_t hostsz,
                          int *port)
{
  const char *colon;
  const char *h = s;
  size_t hlen;
  char *end;
  long p;

  if (s[0] == '[') {
    const char *rb = strchr(s, ']');
    if (rb == NULL || rb[1] != ':')
      return -1;
    h = s + 1;
    hlen = (size_t) (rb - h);
    colon = rb + 1;
  } else {
    colon = strrchr(s, ':');
    if (colon == NULL || memchr(s, ':', (size_t) (colon - s)) != NULL)
      return -1;  /* no port, or an IPv6 literal without brackets */
    hlen = (size_t) (colon - s);
  }
  if (hlen == 0 || hlen >= hostsz)
    return -1;
  errno = 0;
  p = strtol(colon + 1, &end, 10);
  if (errno != 0 || end == colon + 1 || *end != '\0' || p < 1 || p > 65535)
    return -1;
  memcpy(host, h, hlen);
  host[hlen] = '\0';
  *port = (int) p;
  return 0;
}


/* Prints host:port, bracketing IPv6 literals so the output can be pasted
 * back as a client address. */
static void print_hostport(FILE *f, const char *host, int port)
{
  if (strchr(host, ':') != NULL)
    fprintf(f, "[%s]:%d", host, port);
  else
    fprintf(f, "%s:%d", host, port);
}


static void print_cpu(const char *who)
{
  struct rusage ru;

  if (getrusage(RUSAGE_SELF, &ru) != 0)
    return;
  fprintf(stderr, PROG ": %s cpu: user %.3f s, system %.3f s\n", who,
          ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
          ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
}

/* ------------------------------------------------------------------------ */
/* serve                                                                    */

typedef struct {
  uv_loop_t loop;
  uvccl_store_server_t server;
  uv_signal_t sig[3];
  int closing;
  int quiet;
} serve_t;

static const int serve_signums[3] = { SIGINT, SIGTERM, SIGUSR1 };

static void serve_print_stats(const uvccl_store_server_t *server)
{
  uvccl_store_server_stats_t st;

  uvccl_store_server_stats(server, &st);
  fprintf(stderr,
          PROG ": stats: connections %" PRIu64 ", accepted %" PRIu64
          ", requests %" PRIu64 ", keys %" PRIu64 ", memory %" PRIu64
          " B, waiting %" PRIu64 ", protocol errors %" PRIu64 "\n",
          st.connections, st.accepted, st.requests, st.keys, st.memory,
          st.waiting, st.protocol_errors);
}

/* The signal handles live until the server is gone, so that SIGUSR1 keeps
 * working (and cannot kill us) while clients drain. */
static void serve_closed_cb(uvccl_store_server_t *server)
{
  serve_t *s = server->data;
  int i;

  for (i = 0; i < 3; i++)
    uv_close((uv_handle_t *) &s->sig[i], NULL);
}

static void serve_signal_cb(uv_signal_t *handle, int signum)
{
  serve_t *s = handle->data;

  if (signum == SIGUSR1) {
    serve_print_stats(&s->server);
    return;
  }
  if (s->closing) {
    /* A graceful close that does not finish must not trap the user. */
    fprintf(stderr, PROG ": %s again, exiting now\n", strsignal(signum));
    _exit(1);
  }
  s->closing = 1;
  if (!s->quiet)
    fprintf(stderr, PROG ": %s, shutting down\n", strsignal(signum));
  uvccl_store_server_close(&s->server, serve_closed_cb);
}

static void serve_walk_cb(uv_handle_t *handle, void *arg)
{
  fprintf(stderr, PROG ": serve: handle still open at exit: %s%s\n",
          uv_handle_type_name(uv_handle_get_type(handle)),
          uv_is_closing(handle) ? " (closing)" : "");
}

/* What "::" or nothing bound to: the library tries "::" dual-stack and
 * falls back to 0.0.0.0 where IPv6 is unavailable; probe the same way. */
static const char *serve_default_host(void)
{
  struct sockaddr_in6 a;
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int ok;

  if (fd < 0)
    return "0.0.0.0";
  memset(&a, 0, sizeof(a));
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_any;
  ok = bind(fd, (struct sockaddr *) &a, sizeof(a)) == 0;
  close(fd);
  return ok ? "::" : "0.0.0.0";
}

static int cmd_serve(int argc, char **argv)
{
  uvccl_store_server_options_t o;
  serve_t s;
  const char *v;
  const char *shown;
  char fdhost[NI_MAXHOST];
  int print_cpu_at_exit = 0;
  int rc;
  int i;

  memset(&o, 0, sizeof(o));
  memset(&s, 0, sizeof(s));
  o.port = DEFAULT_PORT;
  o.listen_fd = -1;
  for (i = 1; i < argc; i++) {
    if (opt_value(argc, argv, &i, "--host", &v))
      o.host = v;
    else if (opt_value(argc, argv, &i, "--auth-file", &v))
      o.auth_file = v;
    else if (strcmp(argv[i], "--no-auth") == 0)
      o.auth_none = 1;
    else if (opt_value(argc, argv, &i, "--tls-cert", &v))
      o.tls_cert = v;
    else if (opt_value(argc, argv, &i, "--tls-key", &v))
      o.tls_key = v;
    else if (opt_value(argc, argv, &i, "--tls-ca", &v))
      o.tls_ca = v;
    else if (strcmp(argv[i], "--no-tls") == 0)
      o.tls_none = 1;
    else if (opt_value(argc, argv, &i, "--port", &v))
      o.port = (int) arg_int("port", v, 0, 65535);
    else if (opt_value(argc, argv, &i, "--listen-fd", &v))
      o.listen_fd = (int) arg_int("file descriptor", v, 0, INT_MAX);
    else if (opt_value(argc, argv, &i, "--backlog", &v))
      o.backlog = (int) arg_int("backlog", v, 1, INT_MAX);
    else if (opt_value(argc, argv, &i, "--max-memory", &v))
      o.max_memory = arg_size("memory limit", v, SIZE_MAX);
    else if (opt_value(argc, argv, &i, "--max-key-len", &v))
      o.max_key_len = arg_size("key length limit", v, SIZE_MAX);
    else if (opt_value(argc, argv, &i, "--max-value-len", &v))
      o.max_value_len = arg_size("value length limit", v, SIZE_MAX);
    else if (opt_value(argc, argv, &i, "--max-keys", &v))
      o.max_keys = arg_size("key count limit", v, SIZE_MAX);
    else if (opt_value(argc, argv, &i, "--max-output", &v))
      o.max_output = arg_size("output limit", v, SIZE_MAX);
    else if (strcmp(argv[i], "--quiet") == 0 || strcmp(argv[i], "-q") == 0)
      s.quiet = 1;
    else if (strcmp(argv[i], "--print-cpu") == 0)
      print_cpu_at_exit = 1;
    else
      usage_error("serve: unknown argument '%s'", argv[i]);
  }

  raise_nofile();
  /* A client that vanishes mid-reply must cost a write error, not us. */
  signal(SIGPIPE, SIG_IGN);
  if (s.quiet)
    uvccl_log_set_level(UVCCL_LOG_ERROR);

  rc = uv_loop_init(&s.loop);
  if (rc != 0)
    fatal("serve: uv_loop_init: %s", uv_strerror(rc));
  /* The handlers go in before we bind: whoever reads "listening on" may
   * signal us at once, and the default action would skip the shutdown. */
  for (i = 0; i < 3; i++) {
    uv_signal_init(&s.loop, &s.sig[i]);
    s.sig[i].data = &s;
    rc = uv_signal_start(&s.sig[i], serve_signal_cb, serve_signums[i]);
    if (rc != 0)
      fatal("serve: uv_signal_start: %s", uv_strerror(rc));
  }
  s.server.data = &s;
  rc = uvccl_store_server_init(&s.loop, &s.server, &o);
  if (rc != 0) {
    fprintf(stderr, PROG ": serve: cannot listen on ");
    if (o.listen_fd >= 0)
      fprintf(stderr, "fd %d", o.listen_fd);
    else
      print_hostport(stderr, o.host ? o.host : "::", o.port);
    fprintf(stderr, ": %s (%s)\n", uvccl_strerror(rc), uvccl_err_name(rc));
    for (i = 0; i < 3; i++)
      uv_close((uv_handle_t *) &s.sig[i], NULL);
    uv_run(&s.loop, UV_RUN_DEFAULT);
    uv_loop_close(&s.loop);
    return 1;
  }

  shown = o.host;
  if (o.listen_fd >= 0) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(o.listen_fd, (struct sockaddr *) &ss, &len) == 0 &&
        getnameinfo((struct sockaddr *) &ss, len, fdhost, sizeof(fdhost),
                    NULL, 0, NI_NUMERICHOST) == 0)
      shown = fdhost;
  }
  if (shown == NULL)
    shown = serve_default_host();
  printf("listening on ");
  print_hostport(stdout, shown, s.server.port);
  printf("\n");
  fflush(stdout);

  uv_run(&s.loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&s.loop);
  if (rc != 0) {
    /* Something was left open: a leak in the server's close path. */
    uv_walk(&s.loop, serve_walk_cb, NULL);
    fprintf(stderr, PROG ": serve: loop not empty at exit: %s\n",
            uv_strerror(rc));
  }
  if (print_cpu_at_exit)
    print_cpu("server");
  return rc != 0 ? 1 : 0;
}

/* ------------------------------------------------------------------------ */
/* Client commands                                                          */

typedef struct {
  uv_loop_t loop;
  uvccl_store_t store;
  const char *cmd;
  int raw;
  int block;
} client_t;

typedef int (*client_fn)(client_t *c, uvccl_work_t *w, int argc,
                         char **argv);

/* Waits for w (if it started) and reports a failure as
 * "uvccl-store: <cmd> '<key>'[, '<key>'...]: <why>". Returns 0 or 1. */
static int cl_finish(client_t *c, uvccl_work_t *w, int rc, char **keys,
                     int nkeys)
{
  const char *why;
  int i;

  if (rc == 0)
    rc = uvccl_work_wait(w);
  if (rc == 0)
    return 0;
  /* A call that failed synchronously never touched the work. */
  if (w->state >= UVCCL_WORK_FAILED && w->msg[0] != '\0')
    why = w->msg;
  else
    why = uvccl_strerror(rc);
  fprintf(stderr, PROG ": %s", c->cmd);
  for (i = 0; i < nkeys; i++)
    fprintf(stderr, "%s'%s'", i ? ", " : " ", keys[i]);
  fprintf(stderr, ": %s\n", why);
  return 1;
}

/* SET, APPEND and QUEUE_PUSH get no reply on the wire; a round trip after
 * them makes sure the server took them (it closes the connection on a value
 * over its limits) before we report success and close. */
static int cl_confirm(client_t *c, uvccl_work_t *w, char **keys)
{
  uvccl_work_cleanup(w);
  return cl_finish(c, w, uvccl_store_num_keys(&c->store, w, NULL), keys, 1);
}

static void cl_print_value(client_t *c, const void *p, size_t len)
{
  if (len > 0)
    fwrite(p, 1, len, stdout);
  if (!c->raw)
    fputc('\n', stdout);
}

static int cl_set(client_t *c, uvccl_work_t *w, int argc, char **argv)
{
  int rc = uvccl_store_set(&c->store, w, argv[0], argv[1], strlen(argv[1]),
                           NULL);
  return cl_finish(c, w, rc, argv, 1) || cl_confirm(c, w, argv);
}

static int cl_get(client_t *c, uvccl_work_t *w, int argc, char **argv)
{
  if (cl_finish(c, w, uvccl_store_get(&c->store, w, argv[0], NULL), argv, 1))
    return 1;
  cl_print_value(c, w->value, w->value_len);
  return 0;
}

static int cl_add(client_t *c, uvccl_work_t *w, int argc, char **argv)
{
  int64_t delta = arg_int("delta", argv[1], INT64_MIN, INT64_MAX);

  if (cl_finish(c, w, uvccl_store_add(&c->store, w, argv[0], delta, NULL),
                argv, 1))
    return 1;
  printf("%" PRId64 "\n", w->result);
  return 0;
}

static int cl_wait(client_t *c, uvccl_work_t *w, int argc, char **argv)
{
  int rc = uvccl_store_wait(&c->store, w, (const char *const *) argv,
                            (size_t) argc, UVCCL_DEFAULT_TIMEOUT, NULL);
  return cl_finish(c, w, rc, argv, argc);
}

static int cl_check(client_t *c, uvccl_work_t *w, int argc, char **argv)
{
  int rc = uvccl_store_check(&c->store, w, (const char *const *) argv,
                             (size_t) argc, NULL);
  if (cl_finish(c, w, rc, argv, argc))
    return 1;
  printf("%s\n", w->result ? "ready" : "not ready");
  return w->result ? 0 : 1;
}

static int cl_delete(client_t *c, uvccl_work_t *w, int argc, char **argv)
{
  if (cl_finish(c, w, uvccl_store_delete_key(&c->store, w, argv[0], NULL),
                argv, 1))
    return 1;
  printf("%" PRId64 "\n", w->result);
  return 0;
}

static int cl_num_keys(client_t *c, uvccl_work_t *w, int argc, char **argv)
{
  if (cl_finish(c, w, uvccl_store_num_keys(&c->store, w, NULL), NULL, 0))
    return 1;
  printf("%" PRId64 "\n", w->result);
  return 0;
}

static int cl_list(client_t *c, uvccl_work_t *w, int argc, char **argv)
{
  size_t i;

  if (cl_finish(c, w, uvccl_store_list_keys(&c->store, w, NULL), NULL, 0))
    return 1;
  for (i = 0; i < w->nvalues; i++) {
    fwrite(w->values[i].base, 1, w->values[i].len, stdout);
    fputc('\n', stdout);
  }
  return 0;
}

static int cl_compare_set(client_t *c, uvccl_work_t *w, int argc,
                          char **argv)
{
  int rc = uvccl_store_compare_set(&c->store, w, argv[0], argv[1],
                                   strlen(argv[1]), argv[2], strlen(argv[2]),
                                   NULL);
  if (cl_finish(c, w, rc, argv, 1))
    return 1;
  cl_print_value(c, w->value, w->value_len);
  return 0;
}

static int cl_append(client_t *c, uvccl_work_t *w, int argc, char **argv)
{
  int rc = uvccl_store_append(&c->store, w, argv[0], argv[1],
                              strlen(argv[1]), NULL);
  return cl_finish(c, w, rc, argv, 1) || cl_confirm(c, w, argv);
}

static int cl_queue_push(client_t *c, uvccl_work_t *w, int argc, char **argv)
{
  int rc = uvccl_store_queue_push(&c->store, w, argv[0], argv[1],
                                  strlen(argv[1]), NULL);
  return cl_finish(c, w, rc, argv, 1) || cl_confirm(c, w, argv);
}

static int cl_queue_pop(client_t *c, uvccl_work_t *w, int argc, char **argv)
{
  int rc = uvccl_store_queue_pop(&c->store, w, argv[0], c->block, NULL);

  if (cl_finish(c, w, rc, argv, 1))
    return 1;
  cl_print_value(c, w->value, w->value_len);
  return 0;
}

static int cl_queue_len(client_t *c, uvccl_work_t *w, int argc, char **argv)
{
  if (cl_finish(c, w, uvccl_store_queue_len(&c->store, w, argv[0], NULL),
                argv, 1))
    return 1;
  printf("%" PRId64 "\n", w->result);
  return 0;
}

static const struct {
  const char *name;
  int min_args;
  int max_args;  /* -1: no limit */
  client_fn fn;
  const char *args;
} client_cmds[] = {
  { "set", 2, 2, cl_set, "KEY VALUE" },
  { "get", 1, 1, cl_get, "KEY" },
  { "add", 2, 2, cl_add, "KEY DELTA" },
  { "wait", 1, -1, cl_wait, "KEY..." },
  { "check", 1, -1, cl_check, "KEY..." },
  { "delete", 1, 1, cl_delete, "KEY" },
  { "num-keys", 0, 0, cl_num_keys, "" },
  { "list", 0, 0, cl_list, "" },
  { "compare-set", 3, 3, cl_compare_set, "KEY EXPECTED DESIRED" },
  { "append", 2, 2, cl_append, "KEY VALUE" },
  { "queue-push", 2, 2, cl_queue_push, "KEY VALUE" },
  { "queue-pop", 1, 1, cl_queue_pop, "KEY" },
  { "queue-len", 1, 1, cl_queue_len, "KEY" },
};

static int cmd_client(int argc, char **argv)
{
  uvccl_tcp_store_options_t o;
  client_t c;
  uvccl_work_t w;
  const char *addr = NULL;
  const char *v;
  char host[256];
  size_t k;
  int port;
  int nargs;
  int status;
  int rc;
  int i;

  memset(&o, 0, sizeof(o));
  memset(&c, 0, sizeof(c));
  o.dialect = UVCCL_DIALECT_MODERN;
  o.timeout_ms = CLIENT_DEFAULT_TIMEOUT_MS;
  /* Options go before COMMAND: after it, "-1" is a DELTA, not an option. */
  for (i = 1; i < argc && c.cmd == NULL; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      if (addr == NULL && i + 1 < argc)
        addr = argv[++i];
      if (i + 1 < argc)
        c.cmd = argv[++i];
    } else if (a[0] == '-' && a[1] != '\0') {
      if (strcmp(a, "--legacy") == 0)
        o.dialect = UVCCL_DIALECT_LEGACY;
      else if (strcmp(a, "--modern") == 0)
        o.dialect = UVCCL_DIALECT_MODERN;
      else if (strcmp(a, "--raw") == 0)
        c.raw = 1;
      else if (strcmp(a, "--block") == 0)
        c.block = 1;
      else if (opt_value(argc, argv, &i, "--auth-file", &v))
        o.auth_file = v;
      else if (strcmp(a, "--no-auth") == 0)
        o.auth_none = 1;
      else if (opt_value(argc, argv, &i, "--tls-cert", &v))
        o.tls_cert = v;
      else if (opt_value(argc, argv, &i, "--tls-key", &v))
        o.tls_key = v;
      else if (opt_value(argc, argv, &i, "--tls-ca", &v))
        o.tls_ca = v;
      else if (strcmp(a, "--no-tls") == 0)
        o.tls_none = 1;
      else if (opt_value(argc, argv, &i, "--timeout", &v))
        o.timeout_ms = (uint64_t) arg_int("timeout", v, 1, INT64_MAX);
      else
        usage_error("unknown option '%s'", a);
    } else if (addr == NULL) {
      addr = a;
    } else {
      c.cmd = a;
    }
  }
  if (addr == NULL)
    usage_error("missing HOST:PORT or command");
  if (parse_hostport(addr, host, sizeof(host), &port) != 0)
    usage_error("'%s' is not HOST:PORT (IPv6: [ADDR]:PORT)", addr);
  if (c.cmd == NULL)
    usage_error("missing COMMAND after %s", addr);
  for (k = 0; k < sizeof(client_cmds) / sizeof(client_cmds[0]); k++)
    if (strcmp(client_cmds[k].name, c.cmd) == 0)
      break;
  if (k == sizeof(client_cmds) / sizeof(client_cmds[0]))
    usage_error("unknown command '%s'", c.cmd);
  nargs = argc - i;
  if (nargs < client_cmds[k].min_args ||
      (client_cmds[k].max_args >= 0 && nargs > client_cmds[k].max_args))
    usage_error("usage: %s HOST:PORT %s %s", PROG, client_cmds[k].name,
                client_cmds[k].args);

  signal(SIGPIPE, SIG_IGN);
  o.host = host;
  o.port = port;
  rc = uv_loop_init(&c.loop);
  if (rc != 0)
    fatal("uv_loop_init: %s", uv_strerror(rc));
  rc = uvccl_tcp_store_init(&c.loop, &c.store, &o);
  if (rc != 0) {
    fprintf(stderr, PROG ": %s: cannot create a client for %s: %s\n", c.cmd,
            addr, uvccl_strerror(rc));
    uv_loop_close(&c.loop);
    return 1;
  }

  memset(&w, 0, sizeof(w));
  status = client_cmds[k].fn(&c, &w, nargs, argv + i);
  uvccl_work_cleanup(&w);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, PROG ": %s: writing to stdout: %s\n", c.cmd,
            strerror(errno));
    status = 1;
  }

  uvccl_store_close(&c.store, NULL);
  uv_run(&c.loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&c.loop);
  if (rc != 0) {
    fprintf(stderr, PROG ": %s: loop not empty at exit: %s\n", c.cmd,
            uv_strerror(rc));
    status = 1;
  }
  return status;
}

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
  if (argc < 2)
    usage_error("missing command");
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
      strcmp(argv[1], "help") == 0) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0) {
    printf(PROG " %s (libuv %s)\n", uvccl_version_string(),
           uv_version_string());
    return 0;
  }
  if (strcmp(argv[1], "serve") == 0)
    return cmd_serve(argc - 1, argv + 1);
  if (strcmp(argv[1], "bench") == 0)
    usage_error("the load generator is its own program now: "
                "build/bench/uvccl-store-bench");
  return cmd_client(argc, argv);
}
