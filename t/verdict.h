/* Helpers for the tests that run uvccl-trace (t/4002, t/4003): a scratch
 * directory of dumps, running a command for its output and exit status,
 * and reading the verdict (uvccl-trace --json). Header-only; include after
 * tap.h and diag/json.h. */
#ifndef UVCCL_T_VERDICT_H
#define UVCCL_T_VERDICT_H

#include <dirent.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TRACE UVCCL_BUILD_DIR "/bin/uvccl-trace"

/* Rank side (after ranks.h): joins the env:// world of 4 (RANK,
 * WORLD_SIZE), runs 3 allreduces and reports "good" with their results
 * checked, so every rank has history in its flight recorder. */
static inline void rank_join_and_warm_up(unsigned alarm_s) {
  const char *v;
  float f[4], out[4];
  uvccl_work_t w;
  cbres_t cb;
  int i, k, rc, bad = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(alarm_s);
  unsetenv("UVCCL_SOCKET_IFNAME");
  v = getenv("RANK");
  R = v != NULL && *v ? atoi(v) : -1;
  v = getenv("WORLD_SIZE");
  P = v != NULL && *v ? atoi(v) : 0;
  rank_init(20000);
  for (k = 0; k < 3; k++) {
    for (i = 0; i < 4; i++) f[i] = (float)(R + i);
    memset(&w, 0, sizeof(w));
    memset(&cb, 0, sizeof(cb));
    w.data = &cb;
    rc = finish_work(&cb, uvccl_allreduce(&pg, &w, f, out, 4, UVCCL_FLOAT32,
                                          UVCCL_SUM, on_work), 10000);
    for (i = 0; i < 4; i++) bad += out[i] != (float)(6 + 4 * i);
    if (rc != 0) bad++;
  }
  rep(bad == 0, "good", "3 allreduces: %d wrong", bad);
}

/* The dumps' directory (mkdtemp'ed by the test). */
static char dir[256];

/* Empties dir (its files; no subdirectories are made there). */
static inline void clean_dir(void) {
  DIR *d = opendir(dir);
  struct dirent *de;
  char p[600];
  if (d == NULL) return;
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.') continue;
    snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
    unlink(p);
  }
  closedir(d);
}

/* Runs cmd, returns its exit status; its stdout in out. */
static inline int run_cmd(const char *cmd, char *out, size_t len) {
  FILE *f = popen(cmd, "r");
  size_t n = 0, got;
  int st;
  out[0] = '\0';
  if (f == NULL) return -1;
  while (n + 1 < len && (got = fread(out + n, 1, len - 1 - n, f)) > 0)
    n += got;
  out[n] = '\0';
  st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* arr is exactly want[0..n). */
static inline int ranks_are(const uvccl__json_t *arr, const int *want,
                            int n) {
  int i;
  if ((int)uvccl__json_len(arr) != n) return 0;
  for (i = 0; i < n; i++)
    if (uvccl__json_int(uvccl__json_at(arr, (size_t)i), -1) != want[i])
      return 0;
  return 1;
}

/* The world group's verdict (gid 1). */
static inline const uvccl__json_t *world_group(const uvccl__json_t *v) {
  const uvccl__json_t *gs = uvccl__json_get(v, "groups");
  size_t i;
  for (i = 0; i < uvccl__json_len(gs); i++)
    if (uvccl__json_get_int(uvccl__json_at(gs, i), "gid", 0) == 1)
      return uvccl__json_at(gs, i);
  return NULL;
}

#endif
