/* The examples a user copies build as a user builds them: `make install`
 * into a fresh prefix, then each single-file example (examples/NAME/
 * NAME.c) compiled against the installed library through pkg-config
 * alone, and run as its comment says. examples/allreduce: a world of 3
 * (uvccl-run, installed), every rank prints the right sum of 16 MiB of
 * floats, computed while its loop's timer kept ticking. */
#define _GNU_SOURCE
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char out[1 << 16];

/* Runs cmd through the shell: exit status, output (both streams) in out. */
static int run(const char *cmd) {
  FILE *p = popen(cmd, "r");
  size_t n = 0, r;
  int st;
  if (p == NULL) return -1;
  while (n + 1 < sizeof(out) && (r = fread(out + n, 1, sizeof(out) - 1 - n, p)) > 0)
    n += r;
  out[n] = '\0';
  st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void) {
  const char *build = UVCCL_BUILD_DIR;
  char prefix[] = "/tmp/uvccl-t6002.XXXXXX", cmd[4096], env[1024];
  int rc, r, good;
  size_t bl = strlen(build);
  if (bl >= 4 && strcmp(build + bl - 4, "-san") == 0)
    skip_all("a sanitizer build: the examples link the plain library, "
             "installed (the plain make check runs this)");
  if (system("command -v pkg-config >/dev/null 2>&1") != 0)
    skip_all("no pkg-config");
  if (mkdtemp(prefix) == NULL) skip_all("mkdtemp failed");
  plan(4);

  /* the parent make's job server is not ours */
  snprintf(cmd, sizeof(cmd),
           "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C %s install "
           "PREFIX=%s 2>&1", UVCCL_SRC_DIR, prefix);
  rc = run(cmd);
  snprintf(cmd, sizeof(cmd), "test -f %s/include/uvccl.h && test -f "
           "%s/lib/pkgconfig/uvccl.pc && test -x %s/bin/uvccl-run", prefix,
           prefix, prefix);
  if (!ok(rc == 0 && system(cmd) == 0, "make install PREFIX=%s: the header, "
          "the libraries, uvccl.pc and the tools", prefix))
    diag("exit %d: %s", rc, out);

  snprintf(env, sizeof(env), "export PKG_CONFIG_PATH=%s/lib/pkgconfig "
           "LD_LIBRARY_PATH=%s/lib;", prefix, prefix);
  snprintf(cmd, sizeof(cmd),
           "cd %s && %s cc -Wall -Wextra -Werror -Wno-unused-parameter "
           "%s/examples/allreduce/allreduce.c $(pkg-config --cflags --libs "
           "uvccl) -o allreduce 2>&1", prefix, env, UVCCL_SRC_DIR);
  rc = run(cmd);
  if (!ok(rc == 0, "examples/allreduce builds with `cc allreduce.c "
          "$(pkg-config --cflags --libs uvccl)` alone, no warnings"))
    diag("exit %d: %s", rc, out);

  snprintf(cmd, sizeof(cmd),
           "cd %s && %s timeout 120 %s/bin/uvccl-run -n 3 ./allreduce 2>&1",
           prefix, env, prefix);
  rc = run(cmd);
  for (good = 1, r = 0; r < 3; r++) {
    char want[96];
    snprintf(want, sizeof(want), "rank %d of 3: sum 6 (want 6), 0 wrong", r);
    good &= strstr(out, want) != NULL;
  }
  if (!ok(rc == 0 && good, "uvccl-run -n 3 ./allreduce: every rank has the "
          "sum, exit 0"))
    diag("exit %d: %s", rc, out);
  else
    note("%s", out);
  ok(good && strstr(out, "ticked 0 times") == NULL,
     "and each loop's timer ticked while its allreduce ran");

  snprintf(cmd, sizeof(cmd), "rm -rf %s", prefix);
  if (system(cmd) != 0) diag("could not remove %s", prefix);
  return done_testing();
}
