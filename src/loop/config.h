/* Configuration from the environment: every UVCCL_* variable uvccl reads,
 * in one table (config.c) that knows its type, default, range and what it
 * does. Modules read their variables through it, never with getenv(): a
 * malformed value is then the same clear warning everywhere, naming the
 * variable and the default that holds, never a silent 0. docs/env.md is
 * the table as `uvccl-run --print-config=markdown` writes it (t/0003
 * checks both, and that no variable is read that the table lacks). */
#ifndef UVCCL_LOOP_CONFIG_H
#define UVCCL_LOOP_CONFIG_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  /* logging and diagnosis */
  UVCCL__CFG_LOG,
  UVCCL__CFG_DEBUG,
  UVCCL__CFG_TRACE_DIR,
  UVCCL__CFG_TRACE_BUFFER_SIZE,
  UVCCL__CFG_TRACE_POLL_MS,
  /* store, secrets, addresses */
  UVCCL__CFG_STORE_BIND,
  UVCCL__CFG_AUTH_TOKEN,
  UVCCL__CFG_AUTH_FILE,
  UVCCL__CFG_TLS_CERT,
  UVCCL__CFG_TLS_KEY,
  UVCCL__CFG_TLS_CA,
  UVCCL__CFG_SOCKET_IFNAME,
  /* process groups */
  UVCCL__CFG_TRANSPORT,
  UVCCL__CFG_HOST_ID,
  UVCCL__CFG_RING_ORDER,
  UVCCL__CFG_HEARTBEAT_TIMEOUT_MS,
  UVCCL__CFG_SHRINK_QUORUM,
  UVCCL__CFG_GROW,
  UVCCL__CFG_MESH_MAX,
  UVCCL__CFG_BUSY_POLL_US,
  UVCCL__CFG_BUSY_POLL_FORCE,
  UVCCL__CFG_TCP_SPIN_US,
  UVCCL__CFG_TCP_STRIPES,
  UVCCL__CFG_TCP_STRIPE_MIN,
  UVCCL__CFG_TCP_LOCAL_CC,
  UVCCL__CFG_SMALL_MAX,
  UVCCL__CFG_SMALL_TREE,
  UVCCL__CFG_SCRATCH_KEEP_MS,
  UVCCL__CFG_SEGMENT,
  UVCCL__CFG_STREAM_MIN,
  UVCCL__CFG_REDUCE_ISA,
  UVCCL__CFG_TURN_BYTES,
  UVCCL__CFG_TURN_US,
  UVCCL__CFG_LOOP_STATS,
  /* shared memory */
  UVCCL__CFG_SHM_RING_KB,
  UVCCL__CFG_SHM_SPIN_US,
  UVCCL__CFG_SHM_CMA,
  UVCCL__CFG_SHM_CMA_MIN,
  UVCCL__CFG_SHM_BOXES,
  UVCCL__CFG_SHM_HELPER,
  /* GPUs */
  UVCCL__CFG_CUDART,
  UVCCL__CFG_NCCL,
  UVCCL__CFG_GPU_HEARTBEAT_MS,
  UVCCL__CFG_NCCL_WATCHDOG_MS,
  UVCCL__CFG_STAGE_CHUNK,
  UVCCL__CFG_TORCH_CUDA,
  UVCCL__CFG_TORCH_SPIN_US,
  /* launchers */
  UVCCL__CFG_JOIN,
  UVCCL__CFG_RESPAWN_COUNT,
  UVCCL__CFG_COUNT
} uvccl__cfg_id_t;

typedef enum {
  UVCCL__CFG_UINT,   /* a whole number in [min, max] */
  UVCCL__CFG_CHOICE, /* one of choices ("a|b|c"), any case; 0|1 for a switch */
  UVCCL__CFG_TEXT,   /* a path, an address, a name: taken as it is */
  UVCCL__CFG_SECRET  /* text never shown */
} uvccl__cfg_type_t;

typedef struct {
  const char *name;      /* "UVCCL_TURN_BYTES" */
  uvccl__cfg_type_t type;
  uint64_t min, max;     /* UINT */
  uint64_t dflt;         /* UINT: the value; CHOICE: its index */
  const char *choices;   /* CHOICE */
  const char *dflt_text; /* the default as the manual says it */
  const char *doc;       /* one line */
} uvccl__cfg_var_t;

/* The table's entry (NULL for an id out of range), and the id of a name
 * (-1 when the table lacks it). */
const uvccl__cfg_var_t *uvccl__config_var(int id);
int uvccl__config_find(const char *name);

/* The variable's text: NULL when unset or empty. */
const char *uvccl__config_text(uvccl__cfg_id_t id);

/* A UINT variable in *out: returns 1 when set and valid, 0 when unset
 * (the default in *out), UV_EINVAL when malformed or out of range (the
 * default in *out, and a warning naming the variable, once a value). */
int uvccl__config_uint(uvccl__cfg_id_t id, uint64_t *out);

/* A CHOICE variable: the index of its value in choices, as above. */
int uvccl__config_choice(uvccl__cfg_id_t id, int *out);

/* What the value would give, without logging: 0 unset, 1 valid,
 * UV_EINVAL malformed (why, then, says so). For --print-config. */
int uvccl__config_check(int id, char *why, size_t whylen);

#endif
