/* Error codes: every uvccl code has a distinct name and message; libuv's
 * and errno codes pass through. Logging levels come from UVCCL_LOG. */
#include "tap.h"
#include "uvccl.h"

#include <errno.h>

static int sunk;
static char last_line[256];
static void sink(uvccl_log_level_t level, const char *component,
                 const char *line, void *arg) {
  sunk++;
  snprintf(last_line, sizeof(last_line), "%s|%s", component, line);
}

int main(void) {
  static const int codes[] = {
#define X(name, code, msg) UVCCL_##name,
      UVCCL_ERRNO_MAP(X)
#undef X
  };
  size_t i, j;
  tap_alarm(10);
  for (i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
    ok(codes[i] >= UVCCL_ERRNO_MIN && codes[i] <= UVCCL_ERRNO_MAX,
       "%s in the reserved range", uvccl_err_name(codes[i]));
    ok(strncmp(uvccl_err_name(codes[i]), "UVCCL_E", 7) == 0 &&
           strlen(uvccl_strerror(codes[i])) > 3,
       "%s: '%s'", uvccl_err_name(codes[i]), uvccl_strerror(codes[i]));
    for (j = 0; j < i; j++)
      if (codes[j] == codes[i] ||
          strcmp(uvccl_strerror(codes[j]), uvccl_strerror(codes[i])) == 0)
        break;
    ok(j == i, "%s is distinct", uvccl_err_name(codes[i]));
  }
  is_str(uvccl_err_name(UV_ECONNREFUSED), "ECONNREFUSED", "libuv names pass");
  is_str(uvccl_strerror(UV_ETIMEDOUT), uv_strerror(UV_ETIMEDOUT),
         "libuv messages pass");
  ok(UV_EPIPE == -EPIPE, "libuv codes are -errno");
  is_str(uvccl_strerror(-ENOENT), uv_strerror(-ENOENT), "-errno messages");
  is_str(uvccl_err_name(0), "OK", "zero has a name");
  is_str(uvccl_err_name(-20999), "UVCCL_EUNKNOWN", "unassigned uvccl code");
  ok(strlen(uvccl_strerror(-20999)) > 0, "unassigned code has a message");
  is_str(uvccl_version_string(), UVCCL_VERSION_STRING, "version");

  setenv("UVCCL_LOG", "debug", 1);
  is_int(uvccl_log_get_level(), UVCCL_LOG_DEBUG, "UVCCL_LOG=debug read");
  uvccl_log_set_sink(sink, NULL);
  uvccl_log_set_level(UVCCL_LOG_ERROR);
  is_int(uvccl_log_get_level(), UVCCL_LOG_ERROR, "level set");
  uvccl_log_set_sink(NULL, NULL);
  return done_testing();
}
