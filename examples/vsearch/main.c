/* uvccl-vsearch: nearest-neighbour search over a table sharded across the
 * ranks of a uvccl world, served over HTTP by rank 0 on the loop that runs
 * the collectives. docs/embedding.md says how the pieces fit; --help lists
 * the options.
 *
 *   uvccl-run -n 4 [--keep-going] uvccl-vsearch --port P [--dim 64]
 *             [--rows 100000] [--seed 1] [options]
 */
#define PROG "uvccl-vsearch"
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"
#include "service.h"

static const char usage_text[] =
"usage: uvccl-run -n N " PROG " --port P [options]\n"
"Serves nearest-neighbour search (L2) over a synthetic table sharded across\n"
"the ranks of a uvccl world (env://: MASTER_ADDR, MASTER_PORT, RANK,\n"
"WORLD_SIZE, as torchrun and uvccl-run set them). Rank 0 serves HTTP:\n"
"  POST /search {\"vector\": [dim numbers], \"k\": 10}\n"
"  GET /rows/ID, GET /healthz, GET /stats\n"
"options:\n"
"  --port P               HTTP port (0: any free one; rank 0 prints\n"
"                         'listening on HOST:P' once it serves)\n"
"  --host H               address to serve on (default 127.0.0.1)\n"
"  --dim D                values per row (default 64)\n"
"  --rows N               rows in the table (default 100000)\n"
"  --seed S               the table's seed (default 1)\n"
"  --max-k K              largest k a search may ask (default 100)\n"
"  --batch B              queries per batch at most (default 32)\n"
"  --pipeline D           batches in flight at most (default 4)\n"
"  --request-timeout MS   a search is answered (503) within this (10000)\n"
"  --client-timeout MS    a request must arrive within this (10000)\n"
"  --max-body BYTES       larger request bodies get 413 (default 1048576)\n"
"  --heartbeat MS         a silent rank is failed after this (default 5000)\n"
"  --refresh-mb MB        a periodic allreduce of MB MiB of float32 beside\n"
"                         the searches (default 0: none)\n"
"  --refresh-ms MS        its period (default 1000)\n"
"When a rank other than 0 fails, in-flight searches get 503 naming it, the\n"
"survivors shrink the world and share the lost rows, and the service goes\n"
"on (run it under uvccl-run --keep-going). SIGINT or SIGTERM stop it.\n";

static svc_t *svc;
static http_t *http;
static uv_signal_t sigint_h, sigterm_h;
static int exit_status;

static void usage_error(const char *msg, const char *arg)
{
  fprintf(stderr, PROG ": %s%s%s\nTry '" PROG " --help'.\n", msg,
          arg ? ": " : "", arg ? arg : "");
  exit(2);
}

static long long num(const char *opt, const char *v, long long lo,
                     long long hi)
{
  char *end;
  long long x = strtoll(v, &end, 10);
  if (*v == '\0' || *end != '\0' || x < lo || x > hi) {
    fprintf(stderr, PROG ": %s: '%s' is not a number from %lld to %lld\n",
            opt, v, lo, hi);
    exit(2);
  }
  return x;
}

static void on_exit_done(svc_t *s, int status, const char *msg)
{
  if (msg)
    fprintf(stderr, PROG ": rank %d: %s\n", svc_rank(s), msg);
  exit_status = status;
  /* the process ends here: open HTTP connections go with it */
  fflush(stdout);
  exit(exit_status);
}

static void on_ready(svc_t *s, int status, const char *msg)
{
  http_options_t *ho = svc_data(s);

  if (status != 0)
    return; /* on_exit_done says why */
  if (svc_rank(s) == 0) {
    http = http_start(uv_default_loop(), s, ho);
    if (http == NULL || !http_listening(http)) {
      exit_status = 1;
      svc_stop(s, "cannot listen");
      svc_stop(s, "cannot listen");
    }
  }
}

static void on_signal(uv_signal_t *h, int signum)
{
  if (http != NULL) {
    http_stop(http);
    http = NULL;
  }
  svc_stop(svc, signum == SIGINT ? "interrupted" : "terminated");
}

int main(int argc, char **argv)
{
  static http_options_t ho = {.dim = 64, .rows = 100000, .seed = 1,
                              .max_k = 100, .host = "127.0.0.1", .port = -1,
                              .max_body = 1 << 20,
                              .client_timeout_ms = 10000,
                              .request_timeout_ms = 10000};
  svc_options_t so;
  enum { O_PORT = 256, O_HOST, O_DIM, O_ROWS, O_SEED, O_MAXK, O_BATCH,
         O_PIPE, O_REQTO, O_CLITO, O_BODY, O_HB, O_RMB, O_RMS };
  static const struct option longopts[] = {
    {"port", required_argument, NULL, O_PORT},
    {"host", required_argument, NULL, O_HOST},
    {"dim", required_argument, NULL, O_DIM},
    {"rows", required_argument, NULL, O_ROWS},
    {"seed", required_argument, NULL, O_SEED},
    {"max-k", required_argument, NULL, O_MAXK},
    {"batch", required_argument, NULL, O_BATCH},
    {"pipeline", required_argument, NULL, O_PIPE},
    {"request-timeout", required_argument, NULL, O_REQTO},
    {"client-timeout", required_argument, NULL, O_CLITO},
    {"max-body", required_argument, NULL, O_BODY},
    {"heartbeat", required_argument, NULL, O_HB},
    {"refresh-mb", required_argument, NULL, O_RMB},
    {"refresh-ms", required_argument, NULL, O_RMS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};
  int c;

  memset(&so, 0, sizeof(so));
  so.batch = 32;
  so.pipeline = 4;
  so.heartbeat_ms = 5000;
  so.op_timeout_ms = 60000;
  so.refresh_ms = 1000;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case O_PORT: ho.port = (int) num("--port", optarg, 0, 65535); break;
    case O_HOST: ho.host = optarg; break;
    case O_DIM: ho.dim = (int) num("--dim", optarg, 1, 65536); break;
    case O_ROWS: ho.rows = num("--rows", optarg, 1, 1LL << 40); break;
    case O_SEED: ho.seed = (uint64_t) num("--seed", optarg, 0, 1LL << 62); break;
    case O_MAXK: ho.max_k = (uint32_t) num("--max-k", optarg, 1, 10000); break;
    case O_BATCH: so.batch = (int) num("--batch", optarg, 1, 256); break;
    case O_PIPE: so.pipeline = (int) num("--pipeline", optarg, 1, 64); break;
    case O_REQTO: ho.request_timeout_ms = (uint64_t) num("--request-timeout", optarg, 1, 86400000); break;
    case O_CLITO: ho.client_timeout_ms = (uint64_t) num("--client-timeout", optarg, 1, 86400000); break;
    case O_BODY: ho.max_body = (size_t) num("--max-body", optarg, 64, 1LL << 30); break;
    case O_HB: so.heartbeat_ms = (uint64_t) num("--heartbeat", optarg, 100, 86400000); break;
    case O_RMB: so.refresh_bytes = (size_t) num("--refresh-mb", optarg, 0, 4096) << 20; break;
    case O_RMS: so.refresh_ms = (uint64_t) num("--refresh-ms", optarg, 1, 86400000); break;
    case 'h': fputs(usage_text, stdout); return 0;
    default: usage_error("bad option", NULL);
    }
  }
  if (optind < argc)
    usage_error("unexpected argument", argv[optind]);
  if (ho.port < 0)
    usage_error("--port is required", NULL);
  if ((int64_t) ho.max_k > ho.rows)
    ho.max_k = (uint32_t) ho.rows;
  so.dim = ho.dim;
  so.rows = ho.rows;
  so.seed = ho.seed;
  so.max_k = ho.max_k;

  /* The application's choice (a library never makes it): a client that
   * goes away mid-reply must not kill the server with SIGPIPE. */
  signal(SIGPIPE, SIG_IGN);
  uv_signal_init(uv_default_loop(), &sigint_h);
  uv_signal_init(uv_default_loop(), &sigterm_h);
  uv_signal_start(&sigint_h, on_signal, SIGINT);
  uv_signal_start(&sigterm_h, on_signal, SIGTERM);
  uv_unref((uv_handle_t *) &sigint_h);
  uv_unref((uv_handle_t *) &sigterm_h);

  svc = svc_start(uv_default_loop(), &so, on_ready, on_exit_done, &ho);
  if (svc == NULL)
    return 1;
  uv_run(uv_default_loop(), UV_RUN_DEFAULT);
  return exit_status;
}
