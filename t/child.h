/* Child processes for the tests that drive real Python (PyTorch) peers:
 * spawn with output (and optionally stdin) on pipes, read what they print,
 * pick "name=value" lines, and make sure no child outlives the test.
 * Header-only, like tap.h; include after tap.h, with PY defined or the
 * default /usr/bin/python3 (Debian's python3-torch is only visible there). */
#ifndef UVCCL_T_CHILD_H
#define UVCCL_T_CHILD_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#ifndef PY
#define PY "/usr/bin/python3"
#endif

/* ---- child processes ----------------------------------------------------- */

typedef struct {
  pid_t pid;
  int fd;       /* its stdout and stderr */
  int in;       /* its stdin, or -1 */
  char *buf;    /* everything it printed */
  size_t len, cap;
  int status;   /* exit code, or 128 + signal */
} child_t;

#define MAX_CHILDREN 32
static pid_t live[MAX_CHILDREN];

static inline void live_add(pid_t p) {
  int i;
  for (i = 0; i < MAX_CHILDREN; i++)
    if (live[i] == 0) {
      live[i] = p;
      return;
    }
}

static inline void live_del(pid_t p) {
  int i;
  for (i = 0; i < MAX_CHILDREN; i++)
    if (live[i] == p) live[i] = 0;
}

/* No child outlives the test: killed at exit (a failed tap_require
 * included), SIGKILLed by the kernel if the test dies (PR_SET_PDEATHSIG),
 * and the scripts have alarms of their own. */
static inline void kill_children(void) {
  int i;
  for (i = 0; i < MAX_CHILDREN; i++)
    if (live[i] > 0) {
      kill(live[i], SIGKILL);
      waitpid(live[i], NULL, 0);
      live[i] = 0;
    }
}

/* Starts argv[0] (a path) with argv; with_stdin: its stdin is a pipe
 * (else /dev/null). Its stdout and stderr come back on one pipe. */
static inline int spawn_argv(child_t *ch, const char *const *argv,
                             int with_stdin) {
  int out[2], in[2] = {-1, -1};
  pid_t parent = getpid(), p;

  memset(ch, 0, sizeof(*ch));
  ch->fd = ch->in = -1;
  if (pipe2(out, O_CLOEXEC) != 0) return -errno;
  if (with_stdin && pipe2(in, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return -errno;
  }
  fflush(stdout);
  p = fork();
  if (p < 0) return -errno;
  if (p == 0) {
    int fd0 = with_stdin ? in[0] : open("/dev/null", O_RDONLY);
    if (fd0 >= 0) dup2(fd0, 0);
    dup2(out[1], 1);
    dup2(out[1], 2);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(out[1]);
  if (with_stdin) {
    close(in[0]);
    ch->in = in[1];
  }
  ch->pid = p;
  ch->fd = out[0];
  live_add(p);
  return 0;
}

/* Starts python3 script args...; with_stdin: its stdin is a pipe (else
 * /dev/null). */
static inline int spawn_py(child_t *ch, const char *script,
                           const char *const *args, int with_stdin) {
  const char *argv[16];
  int n = 0;

  argv[n++] = PY;
  argv[n++] = script;
  while (args && *args && n < 15) argv[n++] = *args++;
  argv[n] = NULL;
  return spawn_argv(ch, argv, with_stdin);
}

/* Reads what the child printed so far (or until EOF if block). Returns 0
 * at EOF. */
static inline int child_drain(child_t *ch, int block) {
  ssize_t r;
  for (;;) {
    if (ch->cap - ch->len < 4096) {
      ch->cap = ch->cap ? ch->cap * 2 : 8192;
      ch->buf = realloc(ch->buf, ch->cap);
      ch->buf[ch->len] = '\0'; /* a string even before the first read */
    }
    if (!block) {
      struct pollfd pf = {ch->fd, POLLIN, 0};
      if (poll(&pf, 1, 0) <= 0) return 1;
    }
    r = read(ch->fd, ch->buf + ch->len, ch->cap - ch->len - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ch->buf[ch->len] = '\0';
      return 0;
    }
    ch->len += (size_t)r;
    ch->buf[ch->len] = '\0';
  }
}

/* Reads the child's output to the end and reaps it. */
static inline int child_finish(child_t *ch) {
  int st = 0;
  child_drain(ch, 1);
  close(ch->fd);
  ch->fd = -1;
  while (waitpid(ch->pid, &st, 0) < 0 && errno == EINTR) {
  }
  live_del(ch->pid);
  ch->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return ch->status;
}

/* The value of the line "name=value", or NULL. */
static inline const char *field(const child_t *ch, const char *name) {
  size_t nl = strlen(name);
  const char *p = ch->buf, *end = ch->buf + ch->len;
  static char val[4096];
  while (p && p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    size_t ll = eol ? (size_t)(eol - p) : (size_t)(end - p);
    if (ll > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
      size_t vl = ll - nl - 1;
      if (vl >= sizeof(val)) vl = sizeof(val) - 1;
      memcpy(val, p + nl + 1, vl);
      val[vl] = '\0';
      return val;
    }
    p += ll + 1;
  }
  return NULL;
}

static inline void dump(const child_t *ch, const char *what) {
  const char *p = ch->buf, *end = ch->buf + ch->len;
  note("output of %s (exit %d):", what, ch->status);
  while (p && p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    size_t ll = eol ? (size_t)(eol - p) : (size_t)(end - p);
    note("  %.*s", (int)(ll > 300 ? 300 : ll), p);
    p += ll + 1;
  }
}

static inline void child_free(child_t *ch) {
  free(ch->buf);
  ch->buf = NULL;
}

static inline void hex(char *dst, const void *src, size_t n) {
  static const char d[] = "0123456789abcdef";
  const unsigned char *s = src;
  size_t i;
  for (i = 0; i < n; i++) {
    dst[2 * i] = d[s[i] >> 4];
    dst[2 * i + 1] = d[s[i] & 15];
  }
  dst[2 * n] = '\0';
}

static inline void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* For a child that serves until its stdin reaches EOF: closes its stdin
 * and reaps it, SIGKILLing it after timeout_ms. Returns its exit status,
 * or -1 if it had to be killed. */
static inline int stop_by_eof(child_t *ch, int timeout_ms) {
  int i, st = 0;
  pid_t r = 0;
  close(ch->in);
  ch->in = -1;
  for (i = 0; i < timeout_ms / 20; i++) {
    child_drain(ch, 0);
    r = waitpid(ch->pid, &st, WNOHANG);
    if (r == ch->pid) break;
    sleep_ms(20);
  }
  if (r != ch->pid) {
    kill(ch->pid, SIGKILL);
    waitpid(ch->pid, &st, 0);
  }
  live_del(ch->pid);
  child_drain(ch, 1);
  close(ch->fd);
  ch->fd = -1;
  ch->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r == ch->pid ? ch->status : -1;
}

#endif
