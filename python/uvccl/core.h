/* uvccl._core's shared parts (core.h): the objects, the operation that a
 * future stands for, and what one file of the extension calls in another.
 * _core.c: the module and the Loop; op.c: errors, operations, buffers and
 * dtypes; group.c: the ProcessGroup; store.c: the stores and the server. */
#ifndef UVCCL_PY_CORE_H
#define UVCCL_PY_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "uvccl.h"

extern PyObject *core_error_factory;
extern PyObject *core_str_set_result, *core_str_set_exception, *core_str_done;
extern uint64_t core_resolved;

typedef struct {
  PyObject_HEAD
  uv_loop_t *loop;
  int host_arms; /* the host calls before_block() itself when it blocks */
} LoopObject;

/* The group's memory outlives the Python object until uvccl_pg_destroy's
 * callback (the future of destroy(), if any, resolves there). */
typedef struct {
  uvccl_pg_t pg;
  PyObject *fut;
} pg_box_t;

enum { GROUP_CREATING, GROUP_READY, GROUP_GONE };

typedef struct {
  PyObject_HEAD
  LoopObject *owner;
  pg_box_t *box;
  int state;
} GroupObject;

typedef struct {
  uvccl_store_t store;
  PyObject *fut;
  char *host;
} store_box_t;

typedef struct {
  PyObject_HEAD
  LoopObject *owner;
  store_box_t *box;
} StoreObject;

typedef struct {
  uvccl_store_server_t server;
  PyObject *fut;
} server_box_t;

typedef struct {
  PyObject_HEAD
  LoopObject *owner;
  server_box_t *box;
} ServerObject;

extern PyTypeObject LoopType, GroupType, StoreType, ServerType;

/* What a completed operation returns to Python. */
enum {
  RES_NONE,
  RES_VALUE,  /* bytes of work->value */
  RES_RESULT, /* int work->result */
  RES_BOOL,   /* work->result != 0 */
  RES_RECV,   /* (sender rank, length) */
  RES_GROUP,  /* the group made (op->made) */
  RES_VALUES, /* [bytes] of work->values, or None where none came */
  RES_KEYS,   /* [str] of work->values */
  RES_BATCH,  /* per p2p op (op->mem, op->nitems): None, or (source, length) */
};

typedef struct {
  uvccl_work_t work; /* first: the callback casts */
  PyObject *fut;
  PyObject *owner;   /* the group or store: alive until completion */
  GroupObject *made; /* init, split, shrink: the new group */
  Py_buffer *view;   /* the buffers held: view_inline, or malloc'ed */
  int nview;
  int cap;
  Py_buffer view_inline[2];
  int result;
  void *mem;         /* counts, keys: freed at completion */
  size_t nitems;     /* RES_BATCH: the p2p ops in mem */
} op_t;

int core_turn(uv_loop_t *loop, int host_arms);
PyObject *core_failure_of(const uvccl_pg_t *pg);
PyObject *core_raise_status(int status, const char *op, const char *msg,
                              const uvccl_pg_t *pg);
op_t *core_op_new(PyObject *fut, PyObject *owner, int result);
void core_op_free(op_t *op);
void core_resolve(PyObject *fut, int status, const char *msg,
                    PyObject *value, const uvccl_pg_t *pg);
int core_close_begin(PyObject *fut, int open, PyObject **slot);
void core_closed(PyObject *fut);
void core_op_done(uvccl_work_t *w, int status);
PyObject *core_started(LoopObject *lo, op_t *op, int rc, const char *name);
void core_set_timeout(op_t *op, double timeout_s);
int core_hold(op_t *op, PyObject *obj, int writable, const char *opname,
                const char *what);
int core_dtype_of(const Py_buffer *v, const char *dtname, int moving,
                    const char *opname, uvccl_dtype_t *dt, size_t *count);
int core_redop_of(PyObject *v, const char *opname, uvccl_redop_t *op);
GroupObject *core_group_alloc(LoopObject *owner);
void core_pg_closed(uvccl_pg_t *pg);

#endif
