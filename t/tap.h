/* A small TAP helper for uvccl's C tests (in the spirit of picotest and
 * git's test-lib): plan, ok, is_int with both values printed (a failure's
 * details on stderr, which prove shows), skip_all, done_testing. Every test arms an alarm so a hang fails instead of
 * blocking CI. Header-only: each test is one C file. */
#ifndef UVCCL_TAP_H
#define UVCCL_TAP_H

#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int tap__n;
static int tap__failed;
static int tap__planned = -1;

static void tap__vprint(int okv, const char *fmt, va_list ap) {
  ++tap__n;
  printf("%sok %d - ", okv ? "" : "not ", tap__n);
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  if (!okv) ++tap__failed;
}

static inline int tap_ok_(int cond, const char *file, int line,
                          const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tap__vprint(cond, fmt, ap);
  va_end(ap);
  fflush(stdout);
  if (!cond) fprintf(stderr, "#   failed at %s:%d\n", file, line);
  return cond;
}
#define ok(cond, ...) tap_ok_(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

static inline int tap_is_int_(long long got, long long want, const char *file,
                              int line, const char *fmt, ...) {
  va_list ap;
  int c = got == want;
  va_start(ap, fmt);
  tap__vprint(c, fmt, ap);
  va_end(ap);
  fflush(stdout);
  if (!c)
    fprintf(stderr, "#   failed at %s:%d\n#          got: %lld\n"
            "#     expected: %lld\n", file, line, got, want);
  return c;
}
#define is_int(got, want, ...)                                               \
  tap_is_int_((long long)(got), (long long)(want), __FILE__, __LINE__,       \
              __VA_ARGS__)

static inline int tap_is_str_(const char *got, const char *want,
                              const char *file, int line, const char *fmt,
                              ...) {
  va_list ap;
  int c = got && want ? strcmp(got, want) == 0 : got == want;
  va_start(ap, fmt);
  tap__vprint(c, fmt, ap);
  va_end(ap);
  fflush(stdout);
  if (!c)
    fprintf(stderr, "#   failed at %s:%d\n#          got: '%s'\n"
            "#     expected: '%s'\n", file, line, got ? got : "(null)",
            want ? want : "(null)");
  return c;
}
#define is_str(got, want, ...)                                               \
  tap_is_str_((got), (want), __FILE__, __LINE__, __VA_ARGS__)

/* Compares a byte string with a C string. */
static inline int tap_is_mem_(const void *got, size_t glen, const char *want,
                              const char *file, int line, const char *fmt,
                              ...) {
  va_list ap;
  size_t wlen = strlen(want);
  int c = got && glen == wlen && memcmp(got, want, wlen) == 0;
  va_start(ap, fmt);
  tap__vprint(c, fmt, ap);
  va_end(ap);
  fflush(stdout);
  if (!c)
    fprintf(stderr, "#   failed at %s:%d\n#          got: '%.*s' (%zu bytes)\n"
            "#     expected: '%s'\n",
            file, line, got ? (int)(glen > 200 ? 200 : glen) : 6,
            got ? (const char *)got : "(null)", glen, want);
  return c;
}
#define is_mem(got, glen, want, ...)                                         \
  tap_is_mem_((got), (glen), (want), __FILE__, __LINE__, __VA_ARGS__)

static inline void note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("# ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
}

/* Failure details go to stderr: prove shows it, so a red CI log explains
 * itself. */
static inline void diag(const char *fmt, ...) {
  va_list ap;
  fflush(stdout);
  va_start(ap, fmt);
  fprintf(stderr, "# ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  fflush(stderr);
}

static inline void skip_all(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("1..0 # SKIP ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
  exit(0);
}

/* n passing checks marked as skipped, with the reason. */
static inline void skip(int n, const char *fmt, ...) {
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof(why), fmt, ap);
  va_end(ap);
  while (n-- > 0) printf("ok %d # skip %s\n", ++tap__n, why);
  fflush(stdout);
}

static inline void plan(int n) {
  tap__planned = n;
  printf("1..%d\n", n);
  fflush(stdout);
}

static void tap__alarm(int sig) {
  (void)sig;
  static const char m[] = "not ok - test timed out (alarm)\n";
  if (write(1, m, sizeof(m) - 1) < 0) { /* nothing to do */ }
  _exit(3);
}

/* Fails the test if it runs longer than seconds. */
static inline void tap_alarm(unsigned seconds) {
  signal(SIGALRM, tap__alarm);
  alarm(seconds);
}

static inline int done_testing(void) {
  if (tap__planned < 0) printf("1..%d\n", tap__n);
  else if (tap__planned != tap__n)
    printf("# planned %d tests but ran %d\n", tap__planned, tap__n);
  fflush(stdout);
  return tap__failed || (tap__planned >= 0 && tap__planned != tap__n) ? 1 : 0;
}

/* A fatal assertion for setup steps: reports and exits. */
#define tap_require(cond, ...)                                               \
  do {                                                                       \
    if (!tap_ok_(!!(cond), __FILE__, __LINE__, __VA_ARGS__)) {               \
      printf("# required step failed; stopping\n");                          \
      printf("1..%d\n", tap__n);                                             \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

#endif
