/* Helpers shared by the command-line programs (tools/uvccl-store.c,
 * tools/uvccl-bench.c, bench/store/store_bench.c): messages, errors,
 * option parsing. Include after defining PROG (the program's name). A
 * program whose copies all parse the same command line (the ranks of a
 * world) defines CLI_USAGE_SPEAKS() to let only one of them complain. Not
 * every program uses every helper. */
#ifndef UVCCL_TOOLS_CLI_H
#define UVCCL_TOOLS_CLI_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "size_arg.h"

#if defined(__GNUC__)
#define CLI_UNUSED __attribute__((unused))
#else
#define CLI_UNUSED
#endif

#ifndef CLI_USAGE_SPEAKS
#define CLI_USAGE_SPEAKS() 1
#endif

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */

static void usage_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

static void usage_error(const char *fmt, ...)
{
  va_list ap;

  if (CLI_USAGE_SPEAKS()) {
    fprintf(stderr, PROG ": ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '" PROG " --help' for more information.\n");
  }
  exit(2);
}


static void fatal(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

static void fatal(const char *fmt, ...)
{
  va_list ap;

  fprintf(stderr, PROG ": ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(1);
}


static CLI_UNUSED void *xcalloc(size_t n, size_t size)
{
  void *p = calloc(n ? n : 1, size ? size : 1);

  if (p == NULL)
    fatal("out of memory");
  return p;
}


static CLI_UNUSED uint64_t now_ns(void)
{
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}


/* Thousands of connections (server or bench) need more than the usual
 * soft limit of 1024 descriptors; the hard limit is ours to take. */
static CLI_UNUSED void raise_nofile(void)
{
  struct rlimit rl;

  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}


/* Matches "--name VALUE" and "--name=VALUE" at argv[*i]. */
static CLI_UNUSED int opt_value(int argc, char **argv, int *i, const char *name,
                     const char **val)
{
  const char *a = argv[*i];
  size_t n = strlen(name);

  if (strncmp(a, name, n) != 0)
    return 0;
  if (a[n] == '=') {
    *val = a + n + 1;
    return 1;
  }
  if (a[n] != '\0')
    return 0;
  if (*i + 1 >= argc)
    usage_error("option '%s' needs a value", name);
  *val = argv[++*i];
  return 1;
}


static CLI_UNUSED int64_t arg_int(const char *what, const char *s, int64_t min,
                       int64_t max)
{
  char *end;
  long long v;

  errno = 0;
  v = strtoll(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
    usage_error("invalid %s '%s' (an integer in [%" PRId64 ", %" PRId64
                "])", what, s, min, max);
  return v;
}


/* A byte count with an optional binary suffix: 64K, 512M, 1G. */
static CLI_UNUSED uint64_t arg_size(const char *what, const char *s, uint64_t max)
{
  uint64_t v;

  static const char suffix[] = "KMGT";
  char most[32];
  int k = 0;

  if (parse_size_arg(s, max, &v) != 0) {
    /* say the limit the way it would be typed: 1T, not 1099511627776 */
    v = max;
    while (k < 4 && v >= 1024 && v % 1024 == 0) {
      v /= 1024;
      k++;
    }
    if (k > 0)
      snprintf(most, sizeof(most), "%" PRIu64 "%c", v, suffix[k - 1]);
    else
      snprintf(most, sizeof(most), "%" PRIu64, v);
    usage_error("invalid %s '%s' (at most %s)", what, s, most);
  }
  return v;
}


/* A number in [min, max]; unit names it in the complaint ("a number",
 * "seconds"). */
static CLI_UNUSED double arg_number(const char *what, const char *s,
                                    double min, double max, const char *unit)
{
  char *end;
  double v;

  errno = 0;
  v = strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !(v >= min && v <= max))
    usage_error("invalid %s '%s' (%s in [%g, %g])", what, s, unit, min, max);
  return v;
}


static CLI_UNUSED double arg_seconds(const char *what, const char *s,
                                     double min, double max)
{
  return arg_number(what, s, min, max, "seconds");
}

#endif
