/* Run-time loading of libnccl, see nccl_api.h. */
#include "nccl_api.h"

#include "loop/internal.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uvccl__nccl_api_t uvccl__nccl;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_status;
static char load_err[256];

void uvccl__nccl_config_init(uvccl__nccl_config_t *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->size = sizeof(*cfg);
  cfg->magic = 0xcafebeef;
  cfg->version = 22800; /* NCCL_VERSION(2, 28, 0): the layout we copied */
  cfg->blocking = 0;
  cfg->cgaClusterSize = INT_MIN; /* NCCL_CONFIG_UNDEF_INT: NCCL's default */
  cfg->minCTAs = INT_MIN;
  cfg->maxCTAs = INT_MIN;
  cfg->netName = NULL;
  cfg->splitShare = INT_MIN;
  cfg->trafficClass = INT_MIN;
  cfg->commName = NULL;
  cfg->collnetEnable = INT_MIN;
  cfg->CTAPolicy = INT_MIN;
  cfg->shrinkShare = INT_MIN;
  cfg->nvlsCTAs = INT_MIN;
  cfg->nChannelsPerNetPeer = INT_MIN;
  cfg->nvlinkCentricSched = INT_MIN;
}

static void *open_first(uvccl__cfg_id_t var, const char *soname,
                        const char *fallback, char *err, size_t errlen) {
  const char *env = uvccl__config_var(var)->name;
  const char *path = uvccl__config_text(var);
  void *h;
  if (path != NULL && path[0] != '\0') {
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) snprintf(err, errlen, "%s (from $%s): %s", path, env,
                            dlerror());
    return h;
  }
  h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    snprintf(err, errlen, "%s", dlerror());
    h = dlopen(fallback, RTLD_NOW | RTLD_LOCAL);
  }
  return h;
}

#define SYM(h, table, field, name)                                          \
  do {                                                                      \
    *(void **)&(table).field = dlsym((h), (name));                          \
    if ((table).field == NULL) {                                            \
      snprintf(load_err, sizeof(load_err), "%s: no symbol %s", lib, (name)); \
      return UVCCL_ENOGPU;                                                  \
    }                                                                       \
  } while (0)

static int load_nccl(void) {
  const char *lib = "libnccl.so.2";
  void *h = open_first(UVCCL__CFG_NCCL, "libnccl.so.2",
                       "/usr/local/cuda/lib64/libnccl.so.2", load_err,
                       sizeof(load_err));
  if (h == NULL) return UVCCL_ENOGPU;
  SYM(h, uvccl__nccl, GetVersion, "ncclGetVersion");
  SYM(h, uvccl__nccl, GetUniqueId, "ncclGetUniqueId");
  SYM(h, uvccl__nccl, CommInitRankConfig, "ncclCommInitRankConfig");
  SYM(h, uvccl__nccl, CommGetAsyncError, "ncclCommGetAsyncError");
  SYM(h, uvccl__nccl, CommFinalize, "ncclCommFinalize");
  SYM(h, uvccl__nccl, CommDestroy, "ncclCommDestroy");
  SYM(h, uvccl__nccl, CommAbort, "ncclCommAbort");
  SYM(h, uvccl__nccl, CommSplit, "ncclCommSplit");
  SYM(h, uvccl__nccl, CommCount, "ncclCommCount");
  SYM(h, uvccl__nccl, CommUserRank, "ncclCommUserRank");
  SYM(h, uvccl__nccl, GetErrorString, "ncclGetErrorString");
  SYM(h, uvccl__nccl, GetLastError, "ncclGetLastError");
  SYM(h, uvccl__nccl, GroupStart, "ncclGroupStart");
  SYM(h, uvccl__nccl, GroupEnd, "ncclGroupEnd");
  SYM(h, uvccl__nccl, AllReduce, "ncclAllReduce");
  SYM(h, uvccl__nccl, Broadcast, "ncclBroadcast");
  SYM(h, uvccl__nccl, Reduce, "ncclReduce");
  SYM(h, uvccl__nccl, AllGather, "ncclAllGather");
  SYM(h, uvccl__nccl, ReduceScatter, "ncclReduceScatter");
  SYM(h, uvccl__nccl, Send, "ncclSend");
  SYM(h, uvccl__nccl, Recv, "ncclRecv");
  SYM(h, uvccl__nccl, RedOpCreatePreMulSum, "ncclRedOpCreatePreMulSum");
  SYM(h, uvccl__nccl, RedOpDestroy, "ncclRedOpDestroy");
  *(void **)&uvccl__nccl.CommRevoke = dlsym(h, "ncclCommRevoke");
  *(void **)&uvccl__nccl.CommShrink = dlsym(h, "ncclCommShrink");
  *(void **)&uvccl__nccl.CommGetUniqueId = dlsym(h, "ncclCommGetUniqueId");
  *(void **)&uvccl__nccl.CommGrow = dlsym(h, "ncclCommGrow");
  if (uvccl__nccl.CommGetUniqueId == NULL) uvccl__nccl.CommGrow = NULL;
  if (uvccl__nccl.GetVersion(&uvccl__nccl.version) != 0 ||
      uvccl__nccl.version < 21800) {
    /* ncclCommSplit and the nonblocking config need 2.18 */
    snprintf(load_err, sizeof(load_err),
             "%s: NCCL version %d is too old (2.18 or newer needed)", lib,
             uvccl__nccl.version);
    return UVCCL_ENOGPU;
  }
  return 0;
}

static void load(void) {
  load_status = load_nccl();
  if (load_status != 0)
    LOG_DEBUG("nccl", "loading NCCL failed: %s", load_err);
}

int uvccl__nccl_api_load(char *err, size_t errlen) {
  pthread_once(&load_once, load);
  if (load_status != 0 && err != NULL && errlen > 0)
    snprintf(err, errlen, "%s", load_err);
  return load_status;
}

void uvccl__nccl_describe(int result, uvccl__nccl_comm_t comm, char *buf,
                          size_t len) {
  const char *s = uvccl__nccl.GetErrorString
                      ? uvccl__nccl.GetErrorString(result)
                      : "unknown NCCL error";
  const char *last = uvccl__nccl.GetLastError
                         ? uvccl__nccl.GetLastError(comm)
                         : NULL;
  if (last != NULL && last[0] != '\0')
    snprintf(buf, len, "%s (%d): %s", s ? s : "?", result, last);
  else
    snprintf(buf, len, "%s (%d)", s ? s : "?", result);
}
