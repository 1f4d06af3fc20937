/* Error codes: uvccl's own range and pass-through of libuv/errno codes. */
#include "internal.h"

#include <string.h>

const char *uvccl_version_string(void) { return UVCCL_VERSION_STRING; }

const char *uvccl_strerror(int err) {
  switch (err) {
#define UVCCL__STRERROR(name, code, msg) case UVCCL_##name: return msg;
    UVCCL_ERRNO_MAP(UVCCL__STRERROR)
#undef UVCCL__STRERROR
  case 0:
    return "success";
  default:
    break;
  }
  if (err >= UVCCL_ERRNO_MIN && err <= UVCCL_ERRNO_MAX)
    return "unknown uvccl error";
  /* libuv knows its own codes and every -errno; it returns a generic text
   * for the rest, so there is always a message. */
  return uv_strerror(err);
}

const char *uvccl_err_name(int err) {
  switch (err) {
#define UVCCL__ERRNAME(name, code, msg) case UVCCL_##name: return "UVCCL_" #name;
    UVCCL_ERRNO_MAP(UVCCL__ERRNAME)
#undef UVCCL__ERRNAME
  case 0:
    return "OK";
  default:
    break;
  }
  if (err >= UVCCL_ERRNO_MIN && err <= UVCCL_ERRNO_MAX)
    return "UVCCL_EUNKNOWN";
  return uv_err_name(err);
}

const char *uvccl_fail_cause_name(uvccl_fail_cause_t cause) {
  switch (cause) {
  case UVCCL_FAIL_NONE: return "none";
  case UVCCL_FAIL_EXITED: return "exited";
  case UVCCL_FAIL_RESET: return "reset";
  case UVCCL_FAIL_HEARTBEAT: return "heartbeat";
  case UVCCL_FAIL_UNREACHABLE: return "unreachable";
  case UVCCL_FAIL_ABORTED: return "aborted";
  case UVCCL_FAIL_PROTOCOL: return "protocol";
  case UVCCL_FAIL_TIMEOUT: return "timeout";
  case UVCCL_FAIL_REVOKED: return "revoked";
  case UVCCL_FAIL_LEFT: return "left";
  }
  return "unknown";
}
