/* uvccl._core: the C side of the asyncio binding.
 *
 * A Loop is a uv_loop_t that Python's event loop drives (uvccl/__init__.py
 * watches its backend fd and timeout and calls run(), which is
 * uv_run(UV_RUN_NOWAIT)), so every uvccl callback runs on the thread that
 * runs asyncio, with the GIL held, and resolves the asyncio.Future the call
 * was given. Each call takes that future first. The buffers of an
 * operation stay held (their exporter's memory pinned) until it completes.
 * Nothing here waits: uvccl_work_wait is never called. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "uvccl.h"

/* uvccl._error(status, message, failure) -> exception instance: the Python
 * side knows its exception classes. */
static PyObject *error_factory;
static PyObject *str_set_result, *str_set_exception, *str_done;
/* Futures resolved so far: a turn that resolved one hands back to asyncio
 * at once. */
static uint64_t resolved;

/* How long one call may keep turning a uv loop that has more to do at
 * once (a busy-polling group waiting on its peers' rings) before it hands
 * back to asyncio. A turn of asyncio costs microseconds; spinning here for
 * this long at most saves those turns when the peers answer within it,
 * and keeps asyncio's loop as responsive as uvccl's turn budget does. */
#define SPIN_NS 50000

/* Turns the loop without waiting until something resolved a future, the
 * loop has nothing more to do at once, or SPIN_NS passed. Returns how long
 * asyncio may block (uvccl_loop_before_block). */
static int turn(uv_loop_t *loop, int host_arms) {
  uint64_t before = resolved, deadline = uv_hrtime() + SPIN_NS;
  int t;
  for (;;) {
    uv_run(loop, UV_RUN_NOWAIT);
    t = uv_backend_timeout(loop);
    /* Where the host does not say when it blocks, it may block after any
     * turn: arm the wake-ups now. */
    if (t != 0 && !host_arms) t = uvccl_loop_before_block(loop);
    if (t != 0 || resolved != before || PyErr_Occurred()) return t;
    if (uv_hrtime() > deadline) return t;
  }
}

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

static PyTypeObject LoopType, GroupType, StoreType, ServerType;

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

/* ---- errors ------------------------------------------------------------ */

static PyObject *failure_of(const uvccl_pg_t *pg) {
  uvccl_pg_failure_t f;
  int ranks[64], n, i;
  PyObject *failed;
  if (pg == NULL || uvccl_pg_get_failure(pg, &f) != 1) Py_RETURN_NONE;
  n = uvccl_pg_failed_ranks(pg, ranks, 64);
  if (n > 64) n = 64;
  failed = PyList_New(0);
  if (failed == NULL) return NULL;
  for (i = 0; i < n; i++) {
    PyObject *r = PyLong_FromLong(ranks[i]);
    if (r == NULL || PyList_Append(failed, r) < 0) {
      Py_XDECREF(r);
      Py_DECREF(failed);
      return NULL;
    }
    Py_DECREF(r);
  }
  return Py_BuildValue("{s:s,s:i,s:i,s:i,s:i,s:s,s:s,s:i,s:N}",
                       "cause", uvccl_fail_cause_name(f.cause),
                       "rank", f.rank, "global_rank", f.global_rank,
                       "reporter", f.reporter, "err", f.err,
                       "address", f.address, "message", f.msg,
                       "host_lost", f.host_lost, "failed_ranks", failed);
}

static PyObject *make_error(int status, const char *msg, const uvccl_pg_t *pg) {
  PyObject *failure, *exc;
  failure = status == UVCCL_EPEER || status == UVCCL_EREVOKED
                ? failure_of(pg)
                : (Py_INCREF(Py_None), Py_None);
  if (failure == NULL) return NULL;
  if (error_factory == NULL) { /* _core imported on its own */
    Py_DECREF(failure);
    return PyObject_CallFunction(PyExc_RuntimeError, "s", msg);
  }
  exc = PyObject_CallFunction(error_factory, "isN", status, msg, failure);
  return exc;
}

/* Raises for an error returned by the call itself. */
static PyObject *raise_status(int status, const char *op, const char *msg,
                              const uvccl_pg_t *pg) {
  char line[UVCCL_WORK_MSG_LEN + 64];
  PyObject *exc;
  if (msg != NULL && msg[0] != '\0')
    snprintf(line, sizeof(line), "%s", msg);
  else
    snprintf(line, sizeof(line), "%s: %s", op, uvccl_strerror(status));
  exc = make_error(status, line, pg);
  if (exc == NULL) return NULL;
  PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
  Py_DECREF(exc);
  return NULL;
}

/* ---- operations -------------------------------------------------------- */

static op_t *op_new(PyObject *fut, PyObject *owner, int result) {
  op_t *op = PyMem_RawCalloc(1, sizeof(*op));
  if (op == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  Py_INCREF(fut);
  op->fut = fut;
  Py_XINCREF(owner);
  op->owner = owner;
  op->result = result;
  op->view = op->view_inline;
  op->cap = 2;
  return op;
}

static void op_free(op_t *op) {
  int i;
  for (i = 0; i < op->nview; i++) PyBuffer_Release(&op->view[i]);
  if (op->view != op->view_inline) PyMem_RawFree(op->view);
  uvccl_work_cleanup(&op->work);
  Py_XDECREF(op->made);
  Py_XDECREF(op->owner);
  Py_DECREF(op->fut);
  free(op->mem);
  PyMem_RawFree(op);
}

static void pg_closed(uvccl_pg_t *pg);

static void resolve(PyObject *fut, int status, const char *msg,
                    PyObject *value, const uvccl_pg_t *pg) {
  PyObject *done, *r;
  resolved++;
  done = PyObject_CallMethodNoArgs(fut, str_done);
  if (done == NULL) goto unraisable;
  if (PyObject_IsTrue(done)) { /* cancelled by its awaiter */
    Py_DECREF(done);
    return;
  }
  Py_DECREF(done);
  if (status == 0) {
    r = PyObject_CallMethodOneArg(fut, str_set_result,
                                  value ? value : Py_None);
  } else {
    PyObject *exc = make_error(status, msg, pg);
    if (exc == NULL) goto unraisable;
    r = PyObject_CallMethodOneArg(fut, str_set_exception, exc);
    Py_DECREF(exc);
  }
  if (r == NULL) goto unraisable;
  Py_DECREF(r);
  return;
unraisable:
  PyErr_WriteUnraisable(fut);
}

/* Closing a group, store or server: the future of the close call (if
 * any) is kept in *slot and resolves, with None, in the close callback
 * (closed()); with nothing left to close it resolves now. Returns 1 when
 * the caller is to close. */
static int close_begin(PyObject *fut, int open, PyObject **slot) {
  if (!open) {
    if (fut != Py_None) resolve(fut, 0, "", Py_None, NULL);
    return 0;
  }
  if (fut != Py_None) {
    Py_INCREF(fut);
    *slot = fut;
  }
  return 1;
}

static void closed(PyObject *fut) {
  if (fut != NULL) {
    resolve(fut, 0, "", Py_None, NULL);
    Py_DECREF(fut);
  }
}

static const uvccl_pg_t *owner_pg(PyObject *owner) {
  if (owner != NULL && Py_TYPE(owner) == &GroupType) {
    GroupObject *g = (GroupObject *)owner;
    if (g->state == GROUP_READY) return &g->box->pg;
  }
  return NULL;
}

static void op_done(uvccl_work_t *w, int status) {
  op_t *op = (op_t *)w;
  PyObject *value = NULL;
  const uvccl_pg_t *pg = owner_pg(op->owner);
  if (status == 0) {
    switch (op->result) {
    case RES_VALUE:
      value = PyBytes_FromStringAndSize(w->value, (Py_ssize_t)w->value_len);
      break;
    case RES_RESULT:
      value = PyLong_FromLongLong(w->result);
      break;
    case RES_BOOL:
      value = PyBool_FromLong(w->result != 0);
      break;
    case RES_RECV:
      value = Py_BuildValue("(Ln)", (long long)w->result,
                            (Py_ssize_t)w->value_len);
      break;
    case RES_VALUES:
      if (w->nvalues == 0) {
        value = Py_None;
        Py_INCREF(value);
        break;
      }
      value = PyList_New((Py_ssize_t)w->nvalues);
      for (size_t i = 0; value != NULL && i < w->nvalues; i++) {
        PyObject *b = PyBytes_FromStringAndSize(w->values[i].base,
                                                (Py_ssize_t)w->values[i].len);
        if (b == NULL) Py_CLEAR(value);
        else PyList_SET_ITEM(value, (Py_ssize_t)i, b);
      }
      break;
    case RES_KEYS:
      value = PyList_New((Py_ssize_t)w->nvalues);
      for (size_t i = 0; value != NULL && i < w->nvalues; i++) {
        PyObject *k = PyUnicode_DecodeUTF8(w->values[i].base,
                                           (Py_ssize_t)strlen(w->values[i].base),
                                           "replace");
        if (k == NULL) Py_CLEAR(value);
        else PyList_SET_ITEM(value, (Py_ssize_t)i, k);
      }
      break;
    case RES_BATCH: {
      const uvccl_p2p_op_t *p = op->mem;
      value = PyList_New((Py_ssize_t)op->nitems);
      for (size_t i = 0; value != NULL && i < op->nitems; i++) {
        PyObject *e = p[i].is_send
                          ? (Py_INCREF(Py_None), Py_None)
                          : Py_BuildValue("(in)", p[i].source,
                                          (Py_ssize_t)p[i].received);
        if (e == NULL) Py_CLEAR(value);
        else PyList_SET_ITEM(value, (Py_ssize_t)i, e);
      }
      break;
    }
    case RES_GROUP:
      op->made->state = GROUP_READY;
      value = (PyObject *)op->made;
      Py_INCREF(value);
      break;
    default:
      value = Py_None;
      Py_INCREF(value);
    }
    if (value == NULL) {
      PyErr_WriteUnraisable(op->fut);
      value = Py_None;
      Py_INCREF(value);
    }
  } else if (op->made != NULL) {
    GroupObject *g = op->made;
    /* A failed creation still holds resources: destroy it. A split that
     * leaves this rank out made nothing. */
    g->state = GROUP_GONE;
    if (status == UVCCL_ENOTMEMBER) {
      free(g->box);
    } else {
      uvccl_pg_destroy(&g->box->pg, pg_closed);
    }
    g->box = NULL;
  }
  resolve(op->fut, status, w->msg, value, pg);
  Py_XDECREF(value);
  op_free(op);
}

/* A started operation's fate: on a call-time error the op is freed and
 * the exception raised. On success the loop turns once, without waiting,
 * before the call returns: the operation's handles reach the kernel, and
 * when the peers were there first it may complete now, so that awaiting
 * its future costs asyncio no turn of its own (the callbacks resolve
 * futures only: no Python code of the application runs inside). Returns
 * the loop's backend timeout after that turn (ms; 0: more to do now), for
 * the driver. */
static PyObject *started(LoopObject *lo, op_t *op, int rc, const char *name) {
  if (rc < 0) {
    PyObject *owner = op->owner;
    Py_XINCREF(owner);
    if (op->made != NULL) { /* never started: nothing to destroy */
      free(op->made->box);
      op->made->box = NULL;
      op->made->state = GROUP_GONE;
    }
    op->work.state = UVCCL_WORK_IDLE;
    raise_status(rc, name, op->work.msg, owner_pg(owner));
    Py_XDECREF(owner);
    op_free(op);
    return NULL;
  }
  {
    int t = turn(lo->loop, lo->host_arms);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLong(t);
  }
}

static void set_timeout(op_t *op, double timeout_s) {
  if (timeout_s > 0) op->work.timeout_ms = (uint64_t)(timeout_s * 1000.0 + 0.5);
}

/* ---- buffers and dtypes ------------------------------------------------ */

/* The dtype a buffer's struct format names, or -1. */
static int dtype_of_format(const Py_buffer *v) {
  const char *f = v->format ? v->format : "B";
  if (*f == '@' || *f == '=' || *f == '<') f++;
  else if (*f == '>' || *f == '!') return -1; /* big-endian */
  if (f[0] == 'Z' && f[2] == '\0') {
    if (f[1] == 'f') return UVCCL_COMPLEX64;
    if (f[1] == 'd') return UVCCL_COMPLEX128;
    return -1;
  }
  if (f[0] == '\0' || f[1] != '\0') return -1;
  switch (f[0]) {
  case 'b': return UVCCL_INT8;
  case 'B': case 'c': return UVCCL_UINT8;
  case '?': return UVCCL_BOOL;
  case 'e': return UVCCL_FLOAT16;
  case 'f': return UVCCL_FLOAT32;
  case 'd': return UVCCL_FLOAT64;
  case 'i': case 'l': case 'q': case 'n':
    if (v->itemsize == 4) return UVCCL_INT32;
    if (v->itemsize == 8) return UVCCL_INT64;
    return -1;
  default: return -1;
  }
}

/* Holds obj's buffer in op (writable when asked), C-contiguous. */
static int hold(op_t *op, PyObject *obj, int writable, const char *opname,
                const char *what) {
  Py_buffer *v;
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (op->nview == op->cap) {
    int cap = op->cap * 2;
    Py_buffer *m = PyMem_RawMalloc(sizeof(Py_buffer) * (size_t)cap);
    if (m == NULL) {
      PyErr_NoMemory();
      return -1;
    }
    memcpy(m, op->view, sizeof(Py_buffer) * (size_t)op->nview);
    if (op->view != op->view_inline) PyMem_RawFree(op->view);
    op->view = m;
    op->cap = cap;
  }
  v = &op->view[op->nview];
  if (PyObject_GetBuffer(obj, v, flags) < 0) {
    PyObject *type, *val, *tb;
    PyErr_Fetch(&type, &val, &tb);
    if (!PyObject_CheckBuffer(obj))
      PyErr_Format(PyExc_TypeError,
                   "%s: %s must support the buffer protocol (bytearray, "
                   "array.array, numpy array, memoryview), not %.100s",
                   opname, what, Py_TYPE(obj)->tp_name);
    else if (writable)
      PyErr_Format(PyExc_TypeError,
                   "%s: %s must be a writable, C-contiguous buffer (%S)",
                   opname, what, val ? val : Py_None);
    else
      PyErr_Format(PyExc_TypeError, "%s: %s must be C-contiguous (%S)",
                   opname, what, val ? val : Py_None);
    Py_XDECREF(type);
    Py_XDECREF(val);
    Py_XDECREF(tb);
    return -1;
  }
  op->nview++;
  return 0;
}

/* The dtype of a held buffer: dtname if given (its element size must
 * divide the buffer), else its format's; `moving` (no reduction) takes an
 * unknown format as bytes. Fills *count. */
static int dtype_of(const Py_buffer *v, const char *dtname, int moving,
                    const char *opname, uvccl_dtype_t *dt, size_t *count) {
  int d;
  size_t es;
  if (dtname != NULL) {
    if (uvccl_dtype_from_name(dtname, dt) < 0) {
      PyErr_Format(PyExc_ValueError, "%s: unknown dtype '%s'", opname, dtname);
      return -1;
    }
  } else {
    d = dtype_of_format(v);
    if (d < 0) {
      if (!moving) {
        PyErr_Format(PyExc_TypeError,
                     "%s: buffers of format '%s' (item size %zd) cannot be "
                     "reduced; uvccl reduces int8, uint8, bool, int32, "
                     "int64, float16, bfloat16 (dtype='bfloat16'), float32, "
                     "float64, complex64, complex128",
                     opname, v->format ? v->format : "B", v->itemsize);
        return -1;
      }
      d = UVCCL_UINT8;
    }
    *dt = (uvccl_dtype_t)d;
  }
  es = uvccl_dtype_size(*dt);
  if ((size_t)v->len % es != 0) {
    PyErr_Format(PyExc_ValueError,
                 "%s: a buffer of %zd bytes is not a whole number of %s "
                 "elements", opname, v->len, uvccl_dtype_name(*dt));
    return -1;
  }
  *count = (size_t)v->len / es;
  return 0;
}

/* A reduce op: its name, or an int (an op of the group's, from
 * premul_sum()). */
static int redop_of(PyObject *v, const char *opname, uvccl_redop_t *op) {
  const char *name;
  if (PyLong_Check(v)) {
    long id = PyLong_AsLong(v);
    if (id == -1 && PyErr_Occurred()) return -1;
    *op = (uvccl_redop_t)id;
    return 0;
  }
  if ((name = PyUnicode_AsUTF8(v)) == NULL) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "%s: op must be a name or premul_sum()'s "
                 "op", opname);
    return -1;
  }
  if (uvccl_redop_from_name(name, op) < 0 || *op == UVCCL_PREMUL_SUM) {
    PyErr_Format(PyExc_ValueError,
                 "%s: unknown reduce op '%s' (sum, avg, product, min, max, "
                 "band, bor, bxor, or premul_sum(factor)'s)", opname, name);
    return -1;
  }
  return 0;
}

/* ---- Loop -------------------------------------------------------------- */

static PyObject *Loop_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  LoopObject *self = (LoopObject *)type->tp_alloc(type, 0);
  int rc;
  if (self == NULL) return NULL;
  self->loop = PyMem_RawMalloc(sizeof(uv_loop_t));
  if (self->loop == NULL) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  rc = uv_loop_init(self->loop);
  if (rc < 0) {
    PyMem_RawFree(self->loop);
    self->loop = NULL;
    Py_DECREF(self);
    return raise_status(rc, "uv_loop_init", NULL, NULL);
  }
  return (PyObject *)self;
}

static void Loop_dealloc(LoopObject *self) {
  if (self->loop != NULL) {
    int i;
    /* Every group and store is gone (each holds its loop); what is left
     * are handles closing. A loop that will not close is left behind
     * rather than freed under its handles. */
    for (i = 0; i < 100 && uv_loop_close(self->loop) == UV_EBUSY; i++) {
      uv_run(self->loop, UV_RUN_NOWAIT);
    }
    if (i < 100) PyMem_RawFree(self->loop);
    self->loop = NULL;
  }
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Loop_fileno(LoopObject *self, PyObject *unused) {
  return PyLong_FromLong(uv_backend_fd(self->loop));
}

static PyObject *Loop_timeout(LoopObject *self, PyObject *unused) {
  return PyLong_FromLong(uv_backend_timeout(self->loop));
}

/* Turns of the uv loop without blocking (see turn()): returns its backend
 * timeout afterwards (ms; -1: nothing timed; 0: more to do now). */
static PyObject *Loop_run(LoopObject *self, PyObject *unused) {
  int t = turn(self->loop, self->host_arms);
  if (PyErr_Occurred()) return NULL;
  return PyLong_FromLong(t);
}

/* The host is about to block: how long it may (ms; -1 no limit). */
static PyObject *Loop_before_block(LoopObject *self, PyObject *unused) {
  return PyLong_FromLong(uvccl_loop_before_block(self->loop));
}

static PyObject *Loop_set_host_arms(LoopObject *self, PyObject *on) {
  self->host_arms = PyObject_IsTrue(on);
  Py_RETURN_NONE;
}

static PyObject *Loop_trace_json(LoopObject *self, PyObject *args) {
  const char *reason = NULL;
  char *json = NULL;
  size_t len = 0;
  int rc;
  PyObject *r;
  if (!PyArg_ParseTuple(args, "|z", &reason)) return NULL;
  rc = uvccl_trace_json(self->loop, reason, &json, &len);
  if (rc < 0) return raise_status(rc, "trace_json", NULL, NULL);
  r = PyUnicode_DecodeUTF8(json, (Py_ssize_t)len, "replace");
  free(json);
  return r;
}

static GroupObject *group_alloc(LoopObject *owner) {
  GroupObject *g = PyObject_New(GroupObject, &GroupType);
  if (g == NULL) return NULL;
  g->box = calloc(1, sizeof(pg_box_t));
  if (g->box == NULL) {
    g->owner = NULL;
    g->state = GROUP_GONE;
    Py_DECREF(g);
    PyErr_NoMemory();
    return NULL;
  }
  Py_INCREF(owner);
  g->owner = owner;
  g->state = GROUP_CREATING;
  return g;
}

/* init(fut, url_or_None, store_or_None, rank, size, timeout_s, prefix
 *      [, turn_bytes, turn_us]) */
static PyObject *Loop_init_group(LoopObject *self, PyObject *args) {
  PyObject *fut, *store;
  const char *url, *prefix;
  int rank, size, rc;
  double timeout_s;
  uvccl_pg_options_t o;
  GroupObject *g;
  op_t *op;
  Py_ssize_t turn_bytes = 0;
  unsigned int turn_us = 0;
  if (!PyArg_ParseTuple(args, "OzOiidz|nI", &fut, &url, &store, &rank, &size,
                        &timeout_s, &prefix, &turn_bytes, &turn_us))
    return NULL;
  if (turn_bytes < 0) {
    PyErr_SetString(PyExc_ValueError, "turn_bytes must not be negative");
    return NULL;
  }
  if (store != Py_None && Py_TYPE(store) != &StoreType) {
    PyErr_SetString(PyExc_TypeError, "init_process_group: store must be a "
                    "uvccl store");
    return NULL;
  }
  if (url == NULL && store == Py_None) {
    PyErr_SetString(PyExc_ValueError, "init_process_group: give a URL or a "
                    "store");
    return NULL;
  }
  if (store != Py_None && ((StoreObject *)store)->box == NULL) {
    PyErr_SetString(PyExc_ValueError, "init_process_group: the store is "
                    "closed");
    return NULL;
  }
  memset(&o, 0, sizeof(o));
  o.rank = rank;
  o.size = size;
  o.prefix = prefix;
  o.turn_bytes = (size_t)turn_bytes;
  o.turn_us = turn_us;
  if (timeout_s > 0) o.timeout_ms = (uint64_t)(timeout_s * 1000.0 + 0.5);
  g = group_alloc(self);
  if (g == NULL) return NULL;
  op = op_new(fut, store == Py_None ? NULL : store, RES_GROUP);
  if (op == NULL) {
    Py_DECREF(g);
    return NULL;
  }
  op->made = g; /* the op's reference */
  if (url != NULL)
    rc = uvccl_pg_init_url(self->loop, &g->box->pg, url, &o, &op->work,
                           op_done);
  else
    rc = uvccl_pg_init(self->loop, &g->box->pg,
                       &((StoreObject *)store)->box->store, &o, &op->work,
                       op_done);
  return started(self, op, rc, "init_process_group");
}

/* tcp_store(host, port, timeout_s, world_size) -> Store (connects lazily) */
static PyObject *Loop_tcp_store(LoopObject *self, PyObject *args) {
  const char *host;
  int port, world_size, rc;
  double timeout_s;
  uvccl_tcp_store_options_t o;
  StoreObject *s;
  if (!PyArg_ParseTuple(args, "sidi", &host, &port, &timeout_s, &world_size))
    return NULL;
  s = PyObject_New(StoreObject, &StoreType);
  if (s == NULL) return NULL;
  s->owner = NULL;
  s->box = calloc(1, sizeof(store_box_t));
  if (s->box == NULL || (s->box->host = strdup(host)) == NULL) {
    if (s->box) free(s->box);
    s->box = NULL;
    Py_DECREF(s);
    return PyErr_NoMemory();
  }
  memset(&o, 0, sizeof(o));
  o.host = s->box->host;
  o.port = port;
  o.world_size = world_size;
  if (timeout_s > 0) o.timeout_ms = (uint64_t)(timeout_s * 1000.0 + 0.5);
  rc = uvccl_tcp_store_init(self->loop, &s->box->store, &o);
  if (rc < 0) {
    free(s->box->host);
    free(s->box);
    s->box = NULL;
    Py_DECREF(s);
    return raise_status(rc, "TCPStore", NULL, NULL);
  }
  Py_INCREF(self);
  s->owner = self;
  return (PyObject *)s;
}

static PyObject *Loop_hash_store(LoopObject *self, PyObject *unused) {
  StoreObject *s = PyObject_New(StoreObject, &StoreType);
  int rc;
  if (s == NULL) return NULL;
  s->owner = NULL;
  s->box = calloc(1, sizeof(store_box_t));
  if (s->box == NULL) {
    Py_DECREF(s);
    return PyErr_NoMemory();
  }
  rc = uvccl_hash_store_init(self->loop, &s->box->store);
  if (rc < 0) {
    free(s->box);
    s->box = NULL;
    Py_DECREF(s);
    return raise_status(rc, "HashStore", NULL, NULL);
  }
  Py_INCREF(self);
  s->owner = self;
  return (PyObject *)s;
}

/* store_server(host_or_None, port) -> StoreServer, serving at once */
static PyObject *Loop_store_server(LoopObject *self, PyObject *args) {
  const char *host;
  int port, rc;
  uvccl_store_server_options_t o;
  ServerObject *s;
  if (!PyArg_ParseTuple(args, "zi", &host, &port)) return NULL;
  s = PyObject_New(ServerObject, &ServerType);
  if (s == NULL) return NULL;
  s->owner = NULL;
  s->box = calloc(1, sizeof(server_box_t));
  if (s->box == NULL) {
    Py_DECREF(s);
    return PyErr_NoMemory();
  }
  memset(&o, 0, sizeof(o));
  o.host = host;
  o.port = port;
  o.listen_fd = -1;
  rc = uvccl_store_server_init(self->loop, &s->box->server, &o);
  if (rc < 0) {
    free(s->box);
    s->box = NULL;
    Py_DECREF(s);
    return raise_status(rc, "StoreServer", NULL, NULL);
  }
  Py_INCREF(self);
  s->owner = self;
  return (PyObject *)s;
}

static PyMethodDef Loop_methods[] = {
  {"fileno", (PyCFunction)Loop_fileno, METH_NOARGS, "the backend fd"},
  {"timeout", (PyCFunction)Loop_timeout, METH_NOARGS,
   "ms until the next timer (-1 none, 0 now)"},
  {"run", (PyCFunction)Loop_run, METH_NOARGS,
   "uv_run(UV_RUN_NOWAIT); returns the backend timeout after it"},
  {"before_block", (PyCFunction)Loop_before_block, METH_NOARGS,
   "uvccl_loop_before_block: the ms the host may block"},
  {"set_host_arms", (PyCFunction)Loop_set_host_arms, METH_O,
   "true: the host calls before_block() whenever it blocks"},
  {"trace_json", (PyCFunction)Loop_trace_json, METH_VARARGS,
   "the flight recorder's dump"},
  {"init_group", (PyCFunction)Loop_init_group, METH_VARARGS, NULL},
  {"tcp_store", (PyCFunction)Loop_tcp_store, METH_VARARGS, NULL},
  {"hash_store", (PyCFunction)Loop_hash_store, METH_NOARGS, NULL},
  {"store_server", (PyCFunction)Loop_store_server, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL}
};

static PyTypeObject LoopType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "uvccl._core.Loop",
  .tp_basicsize = sizeof(LoopObject),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_new = Loop_new,
  .tp_dealloc = (destructor)Loop_dealloc,
  .tp_methods = Loop_methods,
};

/* ---- Group ------------------------------------------------------------- */

static void pg_closed(uvccl_pg_t *pg) {
  pg_box_t *box = (pg_box_t *)pg;
  closed(box->fut);
  free(box);
}

static void Group_dealloc(GroupObject *self) {
  if (self->box != NULL && self->state == GROUP_READY)
    uvccl_pg_destroy(&self->box->pg, pg_closed);
  else if (self->box != NULL)
    free(self->box);
  Py_XDECREF(self->owner);
  PyObject_Free(self);
}

static uvccl_pg_t *ready(GroupObject *self, const char *opname) {
  if (self->state != GROUP_READY) {
    char msg[96];
    snprintf(msg, sizeof(msg), "%s: the group %s", opname,
             self->state == GROUP_GONE ? "was destroyed" : "is not ready yet");
    raise_status(UVCCL_ECLOSING, opname, msg, NULL);
    return NULL;
  }
  return &self->box->pg;
}

static PyObject *Group_get_rank(GroupObject *self, void *c) {
  return PyLong_FromLong(self->state == GROUP_READY ? self->box->pg.rank : -1);
}

static PyObject *Group_get_size(GroupObject *self, void *c) {
  return PyLong_FromLong(self->state == GROUP_READY ? self->box->pg.size : 0);
}

static PyGetSetDef Group_getset[] = {
  {"rank", (getter)Group_get_rank, NULL, NULL, NULL},
  {"size", (getter)Group_get_size, NULL, NULL, NULL},
  {NULL, NULL, NULL, NULL, NULL}
};

/* Holds an (output, input) pair; checks their dtypes agree and the
 * output's length is `ratio` times the input's (or the input's `ratio`
 * times the output's when ratio < 0). out or in may be None where the op
 * ignores it on this rank, or ratio 0 (the uneven ops check their
 * counts): unchecked. */
static int hold_pair(op_t *op, PyObject *out, PyObject *in, const char *dtn,
                     int moving, int ratio, const char *opname,
                     uvccl_dtype_t *dt, size_t *nout, size_t *nin) {
  uvccl_dtype_t dout = UVCCL_UINT8, din = UVCCL_UINT8;
  Py_buffer *vo = NULL, *vi = NULL;
  *nout = *nin = 0;
  if (out != Py_None) {
    if (hold(op, out, 1, opname, "the output") < 0) return -1;
    vo = &op->view[op->nview - 1];
    if (dtype_of(vo, dtn, moving, opname, &dout, nout) < 0) return -1;
  }
  if (in != Py_None) {
    if (hold(op, in, 0, opname, "the input") < 0) return -1;
    vi = &op->view[op->nview - 1];
    if (dtype_of(vi, dtn, moving, opname, &din, nin) < 0) return -1;
  }
  if (vo != NULL && vi != NULL) {
    if (dout != din) {
      PyErr_Format(PyExc_TypeError, "%s: the output holds %s, the input %s",
                   opname, uvccl_dtype_name(dout), uvccl_dtype_name(din));
      return -1;
    }
    if ((ratio > 0 && *nout != *nin * (size_t)ratio) ||
        (ratio < 0 && *nin != *nout * (size_t)-ratio)) {
      PyErr_Format(PyExc_ValueError,
                   "%s: the output holds %zu elements and the input %zu; "
                   "with %d ranks the %s must hold %d times the %s's", opname,
                   *nout, *nin, ratio > 0 ? ratio : -ratio,
                   ratio > 0 ? "output" : "input", ratio > 0 ? ratio : -ratio,
                   ratio > 0 ? "input" : "output");
      return -1;
    }
  }
  *dt = vo != NULL ? dout : din;
  return 0;
}

/* ---- collectives --------------------------------------------------------
 * One entry point for the collectives of one buffer in place or of an
 * (output, input) pair, chosen by a table; every call comes as
 * (fut, out, in, root, op, dtype, timeout), the arguments an op has no use
 * for being None, 0 and "sum". */
typedef enum {
  COLL_ALLREDUCE,
  COLL_BROADCAST,
  COLL_REDUCE,
  COLL_ALLGATHER,
  COLL_REDUCE_SCATTER,
  COLL_ALLTOALL,
  COLL_GATHER,
  COLL_SCATTER,
} coll_t;

/* shape: 0 one buffer in place (out); 1 out = size x in; -1 in = size x
 * out; 2 out and in of one length. root_side: the output (1) or the input
 * (-1) exists at the root only. */
static const struct {
  const char *name;
  int reduces;
  int shape;
  int root_side;
} colls[] = {
  [COLL_ALLREDUCE] = {"allreduce", 1, 0, 0},
  [COLL_BROADCAST] = {"broadcast", 0, 0, 0},
  [COLL_REDUCE] = {"reduce", 1, 0, 0},
  [COLL_ALLGATHER] = {"allgather", 0, 1, 0},
  [COLL_REDUCE_SCATTER] = {"reduce_scatter", 1, -1, 0},
  [COLL_ALLTOALL] = {"alltoall", 0, 2, 0},
  [COLL_GATHER] = {"gather", 0, 1, 1},
  [COLL_SCATTER] = {"scatter", 0, -1, -1},
};

static PyObject *coll(GroupObject *self, PyObject *args, coll_t which) {
  const char *name = colls[which].name, *dtn;
  PyObject *fut, *out, *in, *opn;
  int root, rc;
  double to;
  uvccl_pg_t *pg;
  uvccl_dtype_t dt = UVCCL_UINT8;
  uvccl_redop_t rop = UVCCL_SUM;
  size_t no = 0, ni = 0;
  void *ob, *ib;
  op_t *op;
  if (!PyArg_ParseTuple(args, "OOOiOzd", &fut, &out, &in, &root, &opn, &dtn,
                        &to))
    return NULL;
  if ((pg = ready(self, name)) == NULL) return NULL;
  if (colls[which].reduces && redop_of(opn, name, &rop) < 0) return NULL;
  if (colls[which].root_side != 0) {
    PyObject **side = colls[which].root_side > 0 ? &out : &in;
    if (pg->rank == root && *side == Py_None) {
      PyErr_Format(PyExc_ValueError, "%s: the root needs an %s", name,
                   colls[which].root_side > 0 ? "output" : "input");
      return NULL;
    }
    if (pg->rank != root) *side = Py_None; /* unused there */
  }
  if ((op = op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  if (colls[which].shape == 0) {
    if (hold(op, out, 1, name, "the buffer") < 0 ||
        dtype_of(&op->view[0], dtn, !colls[which].reduces, name, &dt, &no) < 0)
      goto fail;
  } else {
    int ratio = colls[which].shape == 2 ? 1 : colls[which].shape * pg->size;
    if (hold_pair(op, out, in, dtn, !colls[which].reduces, ratio, name, &dt,
                  &no, &ni) < 0)
      goto fail;
  }
  /* held in order: the output (if any), then the input (if any) */
  ob = out != Py_None ? op->view[0].buf : NULL;
  ib = in != Py_None ? op->view[op->nview - 1].buf : NULL;
  if (which == COLL_ALLTOALL && ni % (size_t)pg->size != 0) {
    PyErr_Format(PyExc_ValueError, "alltoall: %zu elements do not split "
                 "into %d equal blocks", ni, pg->size);
    goto fail;
  }
  set_timeout(op, to);
  switch (which) {
  case COLL_ALLREDUCE:
    rc = uvccl_allreduce(pg, &op->work, ob, ob, no, dt, rop, op_done);
    break;
  case COLL_BROADCAST:
    rc = uvccl_broadcast(pg, &op->work, ob, no, dt, root, op_done);
    break;
  case COLL_REDUCE:
    rc = uvccl_reduce(pg, &op->work, ob, ob, no, dt, rop, root, op_done);
    break;
  case COLL_ALLGATHER:
    rc = uvccl_allgather(pg, &op->work, ib, ob, ni, dt, op_done);
    break;
  case COLL_REDUCE_SCATTER:
    rc = uvccl_reduce_scatter(pg, &op->work, ib, ob, no, dt, rop, op_done);
    break;
  case COLL_ALLTOALL:
    rc = uvccl_alltoall(pg, &op->work, ib, ob, ni / (size_t)pg->size, dt,
                        op_done);
    break;
  case COLL_GATHER:
    rc = uvccl_gather(pg, &op->work, ib, ob, ni, dt, root, op_done);
    break;
  default: /* COLL_SCATTER */
    rc = uvccl_scatter(pg, &op->work, ib, ob, no, dt, root, op_done);
  }
  return started(self->owner, op, rc, name);
fail:
  op_free(op);
  return NULL;
}

#define COLL_METHOD(fn, which)                                                \
  static PyObject *fn(GroupObject *self, PyObject *args) {                    \
    return coll(self, args, which);                                           \
  }
COLL_METHOD(Group_allreduce, COLL_ALLREDUCE)
COLL_METHOD(Group_broadcast, COLL_BROADCAST)
COLL_METHOD(Group_reduce, COLL_REDUCE)
COLL_METHOD(Group_allgather, COLL_ALLGATHER)
COLL_METHOD(Group_reduce_scatter, COLL_REDUCE_SCATTER)
COLL_METHOD(Group_alltoall, COLL_ALLTOALL)
COLL_METHOD(Group_gather, COLL_GATHER)
COLL_METHOD(Group_scatter, COLL_SCATTER)

/* A list of element counts (non-negative ints) of exactly n entries, into
 * a malloc'ed array. */
static size_t *counts_of(PyObject *list, int n, const char *opname,
                         const char *what) {
  PyObject *seq = PySequence_Fast(list, "counts must be a sequence of ints");
  size_t *c;
  Py_ssize_t i;
  if (seq == NULL) return NULL;
  if (PySequence_Fast_GET_SIZE(seq) != n) {
    PyErr_Format(PyExc_ValueError, "%s: %s has %zd entries, not one a rank "
                 "(%d)", opname, what, PySequence_Fast_GET_SIZE(seq), n);
    Py_DECREF(seq);
    return NULL;
  }
  c = malloc(sizeof(size_t) * (size_t)(n > 0 ? n : 1));
  if (c == NULL) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return NULL;
  }
  for (i = 0; i < n; i++) {
    Py_ssize_t v = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i),
                                      PyExc_OverflowError);
    if (v < 0) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "%s: %s[%zd] is negative", opname,
                     what, i);
      free(c);
      Py_DECREF(seq);
      return NULL;
    }
    c[i] = (size_t)v;
  }
  Py_DECREF(seq);
  return c;
}

static size_t sum_of(const size_t *c, int n) {
  size_t s = 0;
  int i;
  for (i = 0; i < n; i++) s += c[i];
  return s;
}

/* alltoallv(fut, out, in, send_counts, recv_counts, dtype, timeout) */
static PyObject *Group_alltoallv(GroupObject *self, PyObject *args) {
  PyObject *fut, *out, *in, *sc, *rcl;
  const char *dtn;
  double to;
  uvccl_pg_t *pg;
  uvccl_dtype_t dt;
  size_t no, ni, *counts;
  op_t *op;
  if (!PyArg_ParseTuple(args, "OOOOOzd", &fut, &out, &in, &sc, &rcl, &dtn,
                        &to))
    return NULL;
  if ((pg = ready(self, "alltoallv")) == NULL) return NULL;
  if ((op = op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  /* one block: send counts, then receive counts */
  if (hold_pair(op, out, in, dtn, 1, 0, "alltoallv", &dt, &no, &ni) < 0 ||
      (counts = malloc(sizeof(size_t) * 2 * (size_t)pg->size)) == NULL)
    goto fail;
  op->mem = counts;
  {
    size_t *s = counts_of(sc, pg->size, "alltoallv", "send_counts"), *r;
    if (s == NULL) goto fail;
    r = counts_of(rcl, pg->size, "alltoallv", "recv_counts");
    if (r == NULL) {
      free(s);
      goto fail;
    }
    memcpy(counts, s, sizeof(size_t) * (size_t)pg->size);
    memcpy(counts + pg->size, r, sizeof(size_t) * (size_t)pg->size);
    free(s);
    free(r);
  }
  if (sum_of(counts, pg->size) != ni || sum_of(counts + pg->size, pg->size) != no) {
    PyErr_Format(PyExc_ValueError, "alltoallv: the send counts add up to %zu "
                 "elements (the input holds %zu), the receive counts to %zu "
                 "(the output holds %zu)", sum_of(counts, pg->size), ni,
                 sum_of(counts + pg->size, pg->size), no);
    goto fail;
  }
  set_timeout(op, to);
  return started(self->owner, op,
                 uvccl_alltoallv(pg, &op->work, op->view[1].buf, counts,
                                 op->view[0].buf, counts + pg->size, dt,
                                 op_done),
                 "alltoallv");
fail:
  op_free(op);
  return NULL;
}

/* reduce_scatterv(fut, out, in, recv_counts, op, dtype, timeout) */
static PyObject *Group_reduce_scatterv(GroupObject *self, PyObject *args) {
  PyObject *fut, *out, *in, *rcl, *opn;
  const char *dtn;
  double to;
  uvccl_pg_t *pg;
  uvccl_dtype_t dt;
  uvccl_redop_t rop;
  size_t no, ni, *counts;
  op_t *op;
  if (!PyArg_ParseTuple(args, "OOOOOzd", &fut, &out, &in, &rcl, &opn, &dtn,
                        &to))
    return NULL;
  if ((pg = ready(self, "reduce_scatterv")) == NULL) return NULL;
  if (redop_of(opn, "reduce_scatterv", &rop) < 0) return NULL;
  if ((op = op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  if (hold_pair(op, out, in, dtn, 0, 0, "reduce_scatterv", &dt, &no, &ni) < 0 ||
      (counts = counts_of(rcl, pg->size, "reduce_scatterv", "recv_counts")) ==
          NULL)
    goto fail;
  op->mem = counts;
  if (sum_of(counts, pg->size) != ni || counts[pg->rank] != no) {
    PyErr_Format(PyExc_ValueError, "reduce_scatterv: the counts add up to %zu "
                 "elements (the input holds %zu) and this rank's is %zu (the "
                 "output holds %zu)", sum_of(counts, pg->size), ni,
                 counts[pg->rank], no);
    goto fail;
  }
  set_timeout(op, to);
  return started(self->owner, op,
                 uvccl_reduce_scatterv(pg, &op->work, op->view[1].buf,
                                       op->view[0].buf, counts, dt, rop,
                                       op_done),
                 "reduce_scatterv");
fail:
  op_free(op);
  return NULL;
}

/* allgatherv(fut, outputs, in, dtype, timeout): outputs[i] receives rank
 * i's input, whatever its length. */
static PyObject *Group_allgatherv(GroupObject *self, PyObject *args) {
  PyObject *fut, *outs, *in, *seq = NULL;
  const char *dtn;
  double to;
  uvccl_pg_t *pg;
  uvccl_dtype_t dt, d;
  size_t ni, n, *counts;
  void **bufs;
  op_t *op;
  int i;
  if (!PyArg_ParseTuple(args, "OOOzd", &fut, &outs, &in, &dtn, &to))
    return NULL;
  if ((pg = ready(self, "allgatherv")) == NULL) return NULL;
  seq = PySequence_Fast(outs, "allgatherv: outputs must be a list of buffers");
  if (seq == NULL) return NULL;
  if (PySequence_Fast_GET_SIZE(seq) != pg->size) {
    PyErr_Format(PyExc_ValueError, "allgatherv: %zd outputs, not one a rank "
                 "(%d)", PySequence_Fast_GET_SIZE(seq), pg->size);
    Py_DECREF(seq);
    return NULL;
  }
  if ((op = op_new(fut, (PyObject *)self, RES_NONE)) == NULL) goto fail_seq;
  /* counts, then the buffer pointers, in one block */
  op->mem = malloc((sizeof(size_t) + sizeof(void *)) * (size_t)pg->size);
  if (op->mem == NULL) {
    PyErr_NoMemory();
    goto fail;
  }
  counts = op->mem;
  bufs = (void **)(counts + pg->size);
  if (hold(op, in, 0, "allgatherv", "the input") < 0 ||
      dtype_of(&op->view[0], dtn, 1, "allgatherv", &dt, &ni) < 0)
    goto fail;
  for (i = 0; i < pg->size; i++) {
    if (hold(op, PySequence_Fast_GET_ITEM(seq, i), 1, "allgatherv",
             "each output") < 0 ||
        dtype_of(&op->view[op->nview - 1], dtn, 1, "allgatherv", &d, &n) < 0)
      goto fail;
    if (d != dt) {
      PyErr_Format(PyExc_TypeError, "allgatherv: output %d holds %s, the "
                   "input %s", i, uvccl_dtype_name(d), uvccl_dtype_name(dt));
      goto fail;
    }
    counts[i] = n;
    bufs[i] = op->view[op->nview - 1].buf;
  }
  if (counts[pg->rank] != ni) {
    PyErr_Format(PyExc_ValueError, "allgatherv: this rank's output holds %zu "
                 "elements, its input %zu", counts[pg->rank], ni);
    goto fail;
  }
  Py_DECREF(seq);
  set_timeout(op, to);
  return started(self->owner, op,
                 uvccl_allgatherv(pg, &op->work, op->view[0].buf, ni,
                                  (void *const *)bufs, counts, dt, op_done),
                 "allgatherv");
fail:
  op_free(op);
fail_seq:
  Py_DECREF(seq);
  return NULL;
}

/* allreduce_coalesced(fut, bufs, op, dtype, timeout): every buffer reduced
 * in place, one operation. */
static PyObject *Group_allreduce_coalesced(GroupObject *self, PyObject *args) {
  PyObject *fut, *list, *seq, *opn;
  const char *dtn;
  double to;
  uvccl_pg_t *pg;
  uvccl_dtype_t dt = UVCCL_FLOAT32, d;
  uvccl_redop_t rop;
  uvccl_buf_t *bufs;
  size_t n;
  Py_ssize_t i, nb;
  op_t *op;
  if (!PyArg_ParseTuple(args, "OOOzd", &fut, &list, &opn, &dtn, &to))
    return NULL;
  if ((pg = ready(self, "allreduce_coalesced")) == NULL) return NULL;
  if (redop_of(opn, "allreduce_coalesced", &rop) < 0) return NULL;
  seq = PySequence_Fast(list, "allreduce_coalesced: a list of buffers");
  if (seq == NULL) return NULL;
  nb = PySequence_Fast_GET_SIZE(seq);
  if ((op = op_new(fut, (PyObject *)self, RES_NONE)) == NULL) {
    Py_DECREF(seq);
    return NULL;
  }
  if ((op->mem = bufs = malloc(sizeof(*bufs) * (size_t)(nb > 0 ? nb : 1))) ==
      NULL) {
    PyErr_NoMemory();
    goto fail;
  }
  for (i = 0; i < nb; i++) {
    if (hold(op, PySequence_Fast_GET_ITEM(seq, i), 1, "allreduce_coalesced",
             "each buffer") < 0 ||
        dtype_of(&op->view[i], dtn, 0, "allreduce_coalesced", &d, &n) < 0)
      goto fail;
    if (i > 0 && d != dt) {
      PyErr_Format(PyExc_TypeError, "allreduce_coalesced: buffer %zd holds "
                   "%s, buffer 0 %s", i, uvccl_dtype_name(d),
                   uvccl_dtype_name(dt));
      goto fail;
    }
    dt = d;
    bufs[i].base = op->view[i].buf;
    bufs[i].len = (size_t)op->view[i].len;
  }
  Py_DECREF(seq);
  set_timeout(op, to);
  return started(self->owner, op,
                 uvccl_allreduce_coalesced(pg, &op->work, bufs, (size_t)nb, dt,
                                           rop, op_done),
                 "allreduce_coalesced");
fail:
  Py_DECREF(seq);
  op_free(op);
  return NULL;
}

/* monitored_barrier(fut, wait_all, timeout) */
static PyObject *Group_monitored_barrier(GroupObject *self, PyObject *args) {
  PyObject *fut;
  int wait_all;
  double to;
  uvccl_pg_t *pg;
  op_t *op;
  if (!PyArg_ParseTuple(args, "Opd", &fut, &wait_all, &to)) return NULL;
  if ((pg = ready(self, "monitored_barrier")) == NULL) return NULL;
  if ((op = op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  set_timeout(op, to);
  return started(self->owner, op,
                 uvccl_monitored_barrier(pg, &op->work, wait_all, op_done),
                 "monitored_barrier");
}

/* barrier(fut, timeout) */
static PyObject *Group_barrier(GroupObject *self, PyObject *args) {
  PyObject *fut;
  double to;
  uvccl_pg_t *pg;
  op_t *op;
  if (!PyArg_ParseTuple(args, "Od", &fut, &to)) return NULL;
  if ((pg = ready(self, "barrier")) == NULL) return NULL;
  if ((op = op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  set_timeout(op, to);
  return started(self->owner, op, uvccl_barrier(pg, &op->work, op_done), "barrier");
}

/* send(fut, buf, dst, tag, timeout) */
static PyObject *Group_send(GroupObject *self, PyObject *args) {
  PyObject *fut, *buf;
  int peer, tag;
  double to;
  uvccl_pg_t *pg;
  op_t *op;
  if (!PyArg_ParseTuple(args, "OOiid", &fut, &buf, &peer, &tag, &to))
    return NULL;
  if ((pg = ready(self, "send")) == NULL) return NULL;
  if ((op = op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  if (hold(op, buf, 0, "send", "the buffer") < 0) {
    op_free(op);
    return NULL;
  }
  set_timeout(op, to);
  return started(self->owner, op,
                 uvccl_send(pg, &op->work, op->view[0].buf,
                            (size_t)op->view[0].len, peer, tag, op_done),
                 "send");
}

/* recv(fut, buf, src, tag, timeout) -> (sender, length) */
static PyObject *Group_recv(GroupObject *self, PyObject *args) {
  PyObject *fut, *buf;
  int peer, tag;
  double to;
  uvccl_pg_t *pg;
  op_t *op;
  if (!PyArg_ParseTuple(args, "OOiid", &fut, &buf, &peer, &tag, &to))
    return NULL;
  if ((pg = ready(self, "recv")) == NULL) return NULL;
  if ((op = op_new(fut, (PyObject *)self, RES_RECV)) == NULL) return NULL;
  if (hold(op, buf, 1, "recv", "the buffer") < 0) {
    op_free(op);
    return NULL;
  }
  set_timeout(op, to);
  return started(self->owner, op,
                 uvccl_recv(pg, &op->work, op->view[0].buf,
                            (size_t)op->view[0].len, peer, tag, op_done),
                 "recv");
}

/* p2p_batch(fut, [(is_send, buf, peer, tag), ...], timeout): c10d's
 * batch_isend_irecv, every op at once */
static PyObject *Group_p2p_batch(GroupObject *self, PyObject *args) {
  PyObject *fut, *list, *seq;
  double to;
  uvccl_pg_t *pg;
  uvccl_p2p_op_t *p;
  Py_ssize_t i, n;
  op_t *op;
  if (!PyArg_ParseTuple(args, "OOd", &fut, &list, &to)) return NULL;
  if ((pg = ready(self, "batch_isend_irecv")) == NULL) return NULL;
  seq = PySequence_Fast(list, "batch_isend_irecv: a list of P2POp");
  if (seq == NULL) return NULL;
  n = PySequence_Fast_GET_SIZE(seq);
  if ((op = op_new(fut, (PyObject *)self, RES_BATCH)) == NULL) goto fail_seq;
  if ((op->mem = p = calloc((size_t)(n > 0 ? n : 1), sizeof(*p))) == NULL) {
    PyErr_NoMemory();
    goto fail;
  }
  op->nitems = (size_t)n;
  for (i = 0; i < n; i++) {
    PyObject *buf;
    int send, peer, tag;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "pOii;batch_isend_irecv: "
                          "each op is (is_send, buffer, peer, tag)", &send, &buf,
                          &peer, &tag) ||
        hold(op, buf, !send, "batch_isend_irecv", "each op's buffer") < 0)
      goto fail;
    p[i].is_send = send;
    p[i].buf = op->view[op->nview - 1].buf;
    p[i].len = (size_t)op->view[op->nview - 1].len;
    p[i].peer = peer;
    p[i].tag = tag;
  }
  Py_DECREF(seq);
  set_timeout(op, to);
  return started(self->owner, op,
                 uvccl_p2p_batch(pg, &op->work, p, (size_t)n, op_done),
                 "batch_isend_irecv");
fail:
  op_free(op);
fail_seq:
  Py_DECREF(seq);
  return NULL;
}

/* The byte payloads under c10d's object collectives, (fut, payload, root,
 * timeout): broadcast_bytes (payload: bytes at root, None elsewhere) ->
 * root's bytes; allgather_bytes -> [every rank's]; gather_bytes -> [every
 * rank's] at root, None elsewhere; scatter_bytes (payload: a list of one a
 * rank at root) -> this rank's. */
typedef enum { BYTES_BROADCAST, BYTES_ALLGATHER, BYTES_GATHER, BYTES_SCATTER } bytes_t;

static PyObject *bytes_coll(GroupObject *self, PyObject *args, bytes_t which) {
  static const char *const names[] = {"broadcast_bytes", "allgather_bytes",
                                      "gather_bytes", "scatter_bytes"};
  const char *name = names[which];
  PyObject *fut, *payload;
  int root, rc, at_root;
  double to;
  uvccl_pg_t *pg;
  op_t *op;
  if (!PyArg_ParseTuple(args, "OOid", &fut, &payload, &root, &to)) return NULL;
  if ((pg = ready(self, name)) == NULL) return NULL;
  at_root = pg->rank == root;
  op = op_new(fut, (PyObject *)self,
              which == BYTES_ALLGATHER || which == BYTES_GATHER ? RES_VALUES
                                                                : RES_VALUE);
  if (op == NULL) return NULL;
  set_timeout(op, to);
  if (which == BYTES_SCATTER) {
    uvccl_buf_t *bufs = NULL;
    Py_ssize_t i, n = 0;
    if (at_root) {
      PyObject *seq = PySequence_Fast(payload, "scatter_bytes: the root gives "
                                      "a list of one payload a rank");
      if (seq == NULL) goto fail;
      n = PySequence_Fast_GET_SIZE(seq);
      if (n != pg->size) {
        PyErr_Format(PyExc_ValueError, "scatter_bytes: %zd payloads, not one a "
                     "rank (%d)", n, pg->size);
        Py_DECREF(seq);
        goto fail;
      }
      if ((op->mem = bufs = malloc(sizeof(*bufs) * (size_t)n)) == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        goto fail;
      }
      for (i = 0; i < n; i++) {
        if (hold(op, PySequence_Fast_GET_ITEM(seq, i), 0, name, "each payload") < 0) {
          Py_DECREF(seq);
          goto fail;
        }
        bufs[i].base = op->view[i].buf;
        bufs[i].len = (size_t)op->view[i].len;
      }
      Py_DECREF(seq);
    }
    rc = uvccl_scatter_bytes(pg, &op->work, bufs, (size_t)n, root, op_done);
    return started(self->owner, op, rc, name);
  }
  {
    void *b = NULL;
    size_t len = 0;
    if (which != BYTES_BROADCAST || at_root) {
      if (hold(op, payload, 0, name, "the payload") < 0) goto fail;
      b = op->view[0].buf;
      len = (size_t)op->view[0].len;
    }
    switch (which) {
    case BYTES_BROADCAST:
      rc = uvccl_broadcast_bytes(pg, &op->work, b, len, root, op_done);
      break;
    case BYTES_ALLGATHER:
      rc = uvccl_allgather_bytes(pg, &op->work, b, len, op_done);
      break;
    default:
      rc = uvccl_gather_bytes(pg, &op->work, b, len, root, op_done);
    }
  }
  return started(self->owner, op, rc, name);
fail:
  op_free(op);
  return NULL;
}

#define BYTES_METHOD(fn, which)                                               \
  static PyObject *fn(GroupObject *self, PyObject *args) {                    \
    return bytes_coll(self, args, which);                                     \
  }
BYTES_METHOD(Group_broadcast_bytes, BYTES_BROADCAST)
BYTES_METHOD(Group_allgather_bytes, BYTES_ALLGATHER)
BYTES_METHOD(Group_gather_bytes, BYTES_GATHER)
BYTES_METHOD(Group_scatter_bytes, BYTES_SCATTER)

/* premul_sum(factor) -> an op of this group: the sum of each input times
 * factor */
static PyObject *Group_premul_sum(GroupObject *self, PyObject *args) {
  double factor;
  uvccl_pg_t *pg;
  uvccl_redop_t op;
  int rc;
  if (!PyArg_ParseTuple(args, "d", &factor)) return NULL;
  if ((pg = ready(self, "premul_sum")) == NULL) return NULL;
  rc = uvccl_pg_premul_sum(pg, factor, &op);
  if (rc < 0) return raise_status(rc, "premul_sum", NULL, pg);
  return PyLong_FromLong((long)op);
}

/* split(fut, color, key) -> Group (its future resolves to it) */
static PyObject *Group_split(GroupObject *self, PyObject *args) {
  PyObject *fut, *r;
  int color, key;
  uvccl_pg_t *pg;
  GroupObject *g;
  op_t *op;
  if (!PyArg_ParseTuple(args, "Oii", &fut, &color, &key)) return NULL;
  if ((pg = ready(self, "split")) == NULL) return NULL;
  if ((g = group_alloc(self->owner)) == NULL) return NULL;
  if ((op = op_new(fut, (PyObject *)self, RES_GROUP)) == NULL) {
    Py_DECREF(g);
    return NULL;
  }
  op->made = g;
  r = started(self->owner, op, uvccl_pg_split(pg, &g->box->pg, color, key, &op->work,
                                 op_done),
              "split");
  return r;
}

/* shrink(fut, exclude_list) -> Group */
static PyObject *Group_shrink(GroupObject *self, PyObject *args) {
  PyObject *fut, *excl, *seq;
  uvccl_pg_t *pg;
  GroupObject *g;
  op_t *op;
  Py_ssize_t i, n;
  int *ranks = NULL;
  if (!PyArg_ParseTuple(args, "OO", &fut, &excl)) return NULL;
  if ((pg = ready(self, "shrink")) == NULL) return NULL;
  seq = PySequence_Fast(excl, "shrink: exclude must be a sequence of ranks");
  if (seq == NULL) return NULL;
  n = PySequence_Fast_GET_SIZE(seq);
  if (n > 0 && (ranks = malloc(sizeof(int) * (size_t)n)) == NULL) {
    Py_DECREF(seq);
    return PyErr_NoMemory();
  }
  for (i = 0; i < n; i++) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      free(ranks);
      return NULL;
    }
    ranks[i] = (int)v;
  }
  Py_DECREF(seq);
  if ((g = group_alloc(self->owner)) == NULL) {
    free(ranks);
    return NULL;
  }
  if ((op = op_new(fut, (PyObject *)self, RES_GROUP)) == NULL) {
    Py_DECREF(g);
    free(ranks);
    return NULL;
  }
  op->made = g;
  op->mem = ranks;
  return started(self->owner, op,
                 n > 0 ? uvccl_pg_shrink_excluding(pg, &g->box->pg, ranks,
                                                   (int)n, &op->work, op_done)
                       : uvccl_pg_shrink(pg, &g->box->pg, &op->work, op_done),
                 "shrink");
}

/* new_group(ranks, tag) -> Group, or None where this rank is not in it */
static PyObject *Group_new_group(GroupObject *self, PyObject *args) {
  PyObject *list, *seq;
  const char *tag;
  uvccl_pg_t *pg;
  GroupObject *g;
  Py_ssize_t i, n;
  int *ranks, rc;
  if (!PyArg_ParseTuple(args, "Oz", &list, &tag)) return NULL;
  if ((pg = ready(self, "new_group")) == NULL) return NULL;
  seq = PySequence_Fast(list, "new_group: ranks must be a sequence");
  if (seq == NULL) return NULL;
  n = PySequence_Fast_GET_SIZE(seq);
  ranks = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
  if (ranks == NULL) {
    Py_DECREF(seq);
    return PyErr_NoMemory();
  }
  for (i = 0; i < n; i++) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      free(ranks);
      return NULL;
    }
    ranks[i] = (int)v;
  }
  Py_DECREF(seq);
  if ((g = group_alloc(self->owner)) == NULL) {
    free(ranks);
    return NULL;
  }
  rc = uvccl_pg_new_group(pg, &g->box->pg, ranks, (int)n, tag);
  free(ranks);
  if (rc == UVCCL_ENOTMEMBER) {
    Py_DECREF(g);
    Py_RETURN_NONE;
  }
  if (rc < 0) {
    Py_DECREF(g);
    return raise_status(rc, "new_group", NULL, pg);
  }
  g->state = GROUP_READY;
  return (PyObject *)g;
}

static PyObject *Group_revoke(GroupObject *self, PyObject *args) {
  const char *reason = NULL;
  uvccl_pg_t *pg;
  int rc;
  if (!PyArg_ParseTuple(args, "|z", &reason)) return NULL;
  if ((pg = ready(self, "revoke")) == NULL) return NULL;
  rc = uvccl_pg_revoke(pg, reason);
  if (rc < 0) return raise_status(rc, "revoke", NULL, pg);
  Py_RETURN_NONE;
}

static PyObject *Group_abort(GroupObject *self, PyObject *args) {
  const char *reason = NULL;
  uvccl_pg_t *pg;
  if (!PyArg_ParseTuple(args, "|z", &reason)) return NULL;
  if ((pg = ready(self, "abort")) == NULL) return NULL;
  uvccl_pg_abort(pg, reason);
  Py_RETURN_NONE;
}

/* destroy(fut_or_None): the future resolves once the connections are
 * closed */
static PyObject *Group_destroy(GroupObject *self, PyObject *args) {
  PyObject *fut;
  if (!PyArg_ParseTuple(args, "O", &fut)) return NULL;
  if (!close_begin(fut, self->state == GROUP_READY,
                   self->box ? &self->box->fut : NULL))
    Py_RETURN_NONE;
  self->state = GROUP_GONE;
  uvccl_pg_destroy(&self->box->pg, pg_closed);
  self->box = NULL;
  Py_RETURN_NONE;
}

static PyObject *Group_failure(GroupObject *self, PyObject *unused) {
  if (self->state != GROUP_READY) Py_RETURN_NONE;
  return failure_of(&self->box->pg);
}

static PyObject *Group_global_rank(GroupObject *self, PyObject *args) {
  int r;
  uvccl_pg_t *pg;
  if (!PyArg_ParseTuple(args, "i", &r)) return NULL;
  if ((pg = ready(self, "global_rank")) == NULL) return NULL;
  return PyLong_FromLong(uvccl_pg_global_rank(pg, r));
}

static PyObject *Group_peer_transport(GroupObject *self, PyObject *args) {
  int r;
  uvccl_pg_t *pg;
  if (!PyArg_ParseTuple(args, "i", &r)) return NULL;
  if ((pg = ready(self, "peer_transport")) == NULL) return NULL;
  return PyUnicode_FromString(uvccl_pg_peer_transport(pg, r));
}

static PyObject *Group_set_timeout(GroupObject *self, PyObject *args) {
  double s;
  uvccl_pg_t *pg;
  if (!PyArg_ParseTuple(args, "d", &s)) return NULL;
  if ((pg = ready(self, "set_timeout")) == NULL) return NULL;
  uvccl_pg_set_timeout(pg, (uint64_t)(s * 1000.0 + 0.5));
  Py_RETURN_NONE;
}

static PyMethodDef Group_methods[] = {
  {"allreduce", (PyCFunction)Group_allreduce, METH_VARARGS, NULL},
  {"allreduce_coalesced", (PyCFunction)Group_allreduce_coalesced, METH_VARARGS,
   NULL},
  {"allgatherv", (PyCFunction)Group_allgatherv, METH_VARARGS, NULL},
  {"reduce_scatterv", (PyCFunction)Group_reduce_scatterv, METH_VARARGS, NULL},
  {"alltoallv", (PyCFunction)Group_alltoallv, METH_VARARGS, NULL},
  {"monitored_barrier", (PyCFunction)Group_monitored_barrier, METH_VARARGS,
   NULL},
  {"broadcast", (PyCFunction)Group_broadcast, METH_VARARGS, NULL},
  {"reduce", (PyCFunction)Group_reduce, METH_VARARGS, NULL},
  {"allgather", (PyCFunction)Group_allgather, METH_VARARGS, NULL},
  {"reduce_scatter", (PyCFunction)Group_reduce_scatter, METH_VARARGS, NULL},
  {"alltoall", (PyCFunction)Group_alltoall, METH_VARARGS, NULL},
  {"gather", (PyCFunction)Group_gather, METH_VARARGS, NULL},
  {"scatter", (PyCFunction)Group_scatter, METH_VARARGS, NULL},
  {"barrier", (PyCFunction)Group_barrier, METH_VARARGS, NULL},
  {"send", (PyCFunction)Group_send, METH_VARARGS, NULL},
  {"p2p_batch", (PyCFunction)Group_p2p_batch, METH_VARARGS, NULL},
  {"broadcast_bytes", (PyCFunction)Group_broadcast_bytes, METH_VARARGS, NULL},
  {"allgather_bytes", (PyCFunction)Group_allgather_bytes, METH_VARARGS, NULL},
  {"gather_bytes", (PyCFunction)Group_gather_bytes, METH_VARARGS, NULL},
  {"scatter_bytes", (PyCFunction)Group_scatter_bytes, METH_VARARGS, NULL},
  {"premul_sum", (PyCFunction)Group_premul_sum, METH_VARARGS, NULL},
  {"recv", (PyCFunction)Group_recv, METH_VARARGS, NULL},
  {"split", (PyCFunction)Group_split, METH_VARARGS, NULL},
  {"shrink", (PyCFunction)Group_shrink, METH_VARARGS, NULL},
  {"new_group", (PyCFunction)Group_new_group, METH_VARARGS, NULL},
  {"revoke", (PyCFunction)Group_revoke, METH_VARARGS, NULL},
  {"abort", (PyCFunction)Group_abort, METH_VARARGS, NULL},
  {"destroy", (PyCFunction)Group_destroy, METH_VARARGS, NULL},
  {"failure", (PyCFunction)Group_failure, METH_NOARGS, NULL},
  {"global_rank", (PyCFunction)Group_global_rank, METH_VARARGS, NULL},
  {"peer_transport", (PyCFunction)Group_peer_transport, METH_VARARGS, NULL},
  {"set_timeout", (PyCFunction)Group_set_timeout, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL}
};

static PyTypeObject GroupType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "uvccl._core.Group",
  .tp_basicsize = sizeof(GroupObject),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_dealloc = (destructor)Group_dealloc,
  .tp_methods = Group_methods,
  .tp_getset = Group_getset,
};

/* ---- Store ------------------------------------------------------------- */

static void store_closed(uvccl_store_t *st) {
  store_box_t *box = (store_box_t *)st;
  closed(box->fut);
  free(box->host);
  free(box);
}

static void Store_dealloc(StoreObject *self) {
  if (self->box != NULL) uvccl_store_close(&self->box->store, store_closed);
  Py_XDECREF(self->owner);
  PyObject_Free(self);
}

static uvccl_store_t *store_open(StoreObject *self, const char *opname) {
  if (self->box == NULL) {
    raise_status(UVCCL_ECLOSING, opname, "the store is closed", NULL);
    return NULL;
  }
  return &self->box->store;
}

static PyObject *Store_connect(StoreObject *self, PyObject *args) {
  PyObject *fut;
  uvccl_store_t *st;
  op_t *op;
  if (!PyArg_ParseTuple(args, "O", &fut)) return NULL;
  if ((st = store_open(self, "connect")) == NULL) return NULL;
  if (st->type != UVCCL_STORE_TCP) {
    resolve(fut, 0, "", Py_None, NULL);
    Py_RETURN_NONE;
  }
  if ((op = op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  return started(self->owner, op, uvccl_tcp_store_connect(st, &op->work, op_done),
                 "store.connect");
}

/* set, append and queue_push: (fut, key, value); the call copies both */
static PyObject *Store_kv_op(StoreObject *self, PyObject *args, int which) {
  static const char *names[] = {"store.set", "store.append", "store.queue_push"};
  PyObject *fut;
  const char *key;
  Py_buffer v;
  uvccl_store_t *st;
  op_t *op;
  int rc;
  if (!PyArg_ParseTuple(args, "Osy*", &fut, &key, &v)) return NULL;
  if ((st = store_open(self, names[which])) == NULL ||
      (op = op_new(fut, (PyObject *)self, RES_NONE)) == NULL) {
    PyBuffer_Release(&v);
    return NULL;
  }
  switch (which) {
  case 0: rc = uvccl_store_set(st, &op->work, key, v.buf, (size_t)v.len, op_done); break;
  case 1: rc = uvccl_store_append(st, &op->work, key, v.buf, (size_t)v.len, op_done); break;
  default: rc = uvccl_store_queue_push(st, &op->work, key, v.buf, (size_t)v.len, op_done);
  }
  PyBuffer_Release(&v);
  return started(self->owner, op, rc, names[which]);
}

static PyObject *Store_set(StoreObject *self, PyObject *args) {
  return Store_kv_op(self, args, 0);
}
static PyObject *Store_append(StoreObject *self, PyObject *args) {
  return Store_kv_op(self, args, 1);
}
static PyObject *Store_queue_push(StoreObject *self, PyObject *args) {
  return Store_kv_op(self, args, 2);
}

static PyObject *Store_key_op(StoreObject *self, PyObject *args, int which) {
  PyObject *fut;
  const char *key;
  long long delta = 0;
  uvccl_store_t *st;
  op_t *op;
  int rc = 0, block = 0;
  static const char *names[] = {"store.get", "store.add", "store.delete_key",
                                "store.queue_len", "store.queue_pop"};
  static const int results[] = {RES_VALUE, RES_RESULT, RES_BOOL, RES_RESULT,
                                RES_VALUE};
  if (which == 1) {
    if (!PyArg_ParseTuple(args, "OsL", &fut, &key, &delta)) return NULL;
  } else if (which == 4) {
    if (!PyArg_ParseTuple(args, "Osp", &fut, &key, &block)) return NULL;
  } else if (!PyArg_ParseTuple(args, "Os", &fut, &key)) {
    return NULL;
  }
  if ((st = store_open(self, names[which])) == NULL) return NULL;
  op = op_new(fut, (PyObject *)self, results[which]);
  if (op == NULL) return NULL;
  switch (which) {
  case 0: rc = uvccl_store_get(st, &op->work, key, op_done); break;
  case 1: rc = uvccl_store_add(st, &op->work, key, delta, op_done); break;
  case 2: rc = uvccl_store_delete_key(st, &op->work, key, op_done); break;
  case 3: rc = uvccl_store_queue_len(st, &op->work, key, op_done); break;
  case 4: rc = uvccl_store_queue_pop(st, &op->work, key, block, op_done); break;
  }
  return started(self->owner, op, rc, names[which]);
}

static PyObject *Store_get(StoreObject *self, PyObject *args) {
  return Store_key_op(self, args, 0);
}
static PyObject *Store_add(StoreObject *self, PyObject *args) {
  return Store_key_op(self, args, 1);
}
static PyObject *Store_delete_key(StoreObject *self, PyObject *args) {
  return Store_key_op(self, args, 2);
}
static PyObject *Store_queue_len(StoreObject *self, PyObject *args) {
  return Store_key_op(self, args, 3);
}
static PyObject *Store_queue_pop(StoreObject *self, PyObject *args) {
  return Store_key_op(self, args, 4);
}

/* A list of str keys into one malloc'ed block (the pointers, then the
 * strings) at *mem; the count in *n. */
static const char **keys_block(PyObject *list, const char *opname, void **mem,
                               Py_ssize_t *n) {
  PyObject *seq = PySequence_Fast(list, "keys must be a sequence of str");
  (void)opname;
  Py_ssize_t i, len;
  size_t bytes;
  const char **keys;
  char *p;
  if (seq == NULL) return NULL;
  *n = PySequence_Fast_GET_SIZE(seq);
  bytes = sizeof(char *) * (size_t)(*n + 1);
  for (i = 0; i < *n; i++) {
    if (PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(seq, i), &len) == NULL) {
      Py_DECREF(seq);
      return NULL;
    }
    bytes += (size_t)len + 1;
  }
  if ((*mem = keys = malloc(bytes)) == NULL) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return NULL;
  }
  p = (char *)(keys + *n + 1);
  for (i = 0; i < *n; i++) {
    const char *k = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(seq, i), &len);
    memcpy(p, k, (size_t)len + 1);
    keys[i] = p;
    p += len + 1;
  }
  Py_DECREF(seq);
  return keys;
}

/* multi_get(fut, keys) -> [bytes], waiting for every key */
static PyObject *Store_multi_get(StoreObject *self, PyObject *args) {
  PyObject *fut, *list;
  uvccl_store_t *st;
  const char **keys;
  Py_ssize_t n;
  op_t *op;
  if (!PyArg_ParseTuple(args, "OO", &fut, &list)) return NULL;
  if ((st = store_open(self, "store.multi_get")) == NULL) return NULL;
  if ((op = op_new(fut, (PyObject *)self, RES_VALUES)) == NULL) return NULL;
  if ((keys = keys_block(list, "store.multi_get", &op->mem, &n)) == NULL) {
    op_free(op);
    return NULL;
  }
  return started(self->owner, op,
                 uvccl_store_multi_get(st, &op->work, keys, (size_t)n, op_done),
                 "store.multi_get");
}

/* multi_set(fut, keys, values) */
static PyObject *Store_multi_set(StoreObject *self, PyObject *args) {
  PyObject *fut, *list, *vals, *seq;
  uvccl_store_t *st;
  const char **keys;
  uvccl_buf_t *bufs;
  Py_ssize_t i, n;
  op_t *op;
  int rc;
  if (!PyArg_ParseTuple(args, "OOO", &fut, &list, &vals)) return NULL;
  if ((st = store_open(self, "store.multi_set")) == NULL) return NULL;
  if ((op = op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  if ((keys = keys_block(list, "store.multi_set", &op->mem, &n)) == NULL)
    goto fail;
  if ((seq = PySequence_Fast(vals, "store.multi_set: a list of values")) == NULL)
    goto fail;
  if (PySequence_Fast_GET_SIZE(seq) != n) {
    PyErr_Format(PyExc_ValueError, "store.multi_set: %zd keys, %zd values", n,
                 PySequence_Fast_GET_SIZE(seq));
    Py_DECREF(seq);
    goto fail;
  }
  if ((bufs = malloc(sizeof(*bufs) * (size_t)(n > 0 ? n : 1))) == NULL) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    goto fail;
  }
  for (i = 0; i < n; i++) {
    if (hold(op, PySequence_Fast_GET_ITEM(seq, i), 0, "store.multi_set",
             "each value") < 0) {
      free(bufs);
      Py_DECREF(seq);
      goto fail;
    }
    bufs[i].base = op->view[i].buf;
    bufs[i].len = (size_t)op->view[i].len;
  }
  Py_DECREF(seq);
  rc = uvccl_store_multi_set(st, &op->work, keys, bufs, (size_t)n, op_done);
  free(bufs); /* copied by the call */
  return started(self->owner, op, rc, "store.multi_set");
fail:
  op_free(op);
  return NULL;
}

/* list_keys(fut) -> [str] */
static PyObject *Store_list_keys(StoreObject *self, PyObject *args) {
  PyObject *fut;
  uvccl_store_t *st;
  op_t *op;
  if (!PyArg_ParseTuple(args, "O", &fut)) return NULL;
  if ((st = store_open(self, "store.list_keys")) == NULL) return NULL;
  if ((op = op_new(fut, (PyObject *)self, RES_KEYS)) == NULL) return NULL;
  return started(self->owner, op, uvccl_store_list_keys(st, &op->work, op_done),
                 "store.list_keys");
}

static PyObject *Store_num_keys(StoreObject *self, PyObject *args) {
  PyObject *fut;
  uvccl_store_t *st;
  op_t *op;
  if (!PyArg_ParseTuple(args, "O", &fut)) return NULL;
  if ((st = store_open(self, "store.num_keys")) == NULL) return NULL;
  if ((op = op_new(fut, (PyObject *)self, RES_RESULT)) == NULL) return NULL;
  return started(self->owner, op, uvccl_store_num_keys(st, &op->work, op_done),
                 "store.num_keys");
}

static PyObject *Store_compare_set(StoreObject *self, PyObject *args) {
  PyObject *fut;
  const char *key;
  Py_buffer e, d;
  uvccl_store_t *st;
  op_t *op;
  int rc;
  if (!PyArg_ParseTuple(args, "Osy*y*", &fut, &key, &e, &d)) return NULL;
  st = store_open(self, "store.compare_set");
  op = st ? op_new(fut, (PyObject *)self, RES_VALUE) : NULL;
  if (op == NULL) {
    PyBuffer_Release(&e);
    PyBuffer_Release(&d);
    return NULL;
  }
  rc = uvccl_store_compare_set(st, &op->work, key, e.buf, (size_t)e.len,
                               d.buf, (size_t)d.len, op_done);
  PyBuffer_Release(&e);
  PyBuffer_Release(&d);
  return started(self->owner, op, rc, "store.compare_set");
}

/* wait(fut, keys, timeout_s) and check(fut, keys): the keys are copied
 * into op->mem (keys_block). */
static const char **keys_block(PyObject *list, const char *opname, void **mem,
                               Py_ssize_t *n);

static PyObject *Store_keys_op(StoreObject *self, PyObject *args, int check) {
  PyObject *fut, *list;
  double to = 0;
  uvccl_store_t *st;
  op_t *op;
  Py_ssize_t n;
  const char **keys;
  int rc;
  const char *name = check ? "store.check" : "store.wait";
  if (check ? !PyArg_ParseTuple(args, "OO", &fut, &list)
            : !PyArg_ParseTuple(args, "OOd", &fut, &list, &to))
    return NULL;
  if ((st = store_open(self, name)) == NULL) return NULL;
  if ((op = op_new(fut, (PyObject *)self, check ? RES_BOOL : RES_NONE)) == NULL)
    return NULL;
  if ((keys = keys_block(list, name, &op->mem, &n)) == NULL) {
    op_free(op);
    return NULL;
  }
  if (check)
    rc = uvccl_store_check(st, &op->work, keys, (size_t)n, op_done);
  else
    rc = uvccl_store_wait(st, &op->work, keys, (size_t)n,
                          to > 0 ? (uint64_t)(to * 1000.0 + 0.5)
                                 : UVCCL_DEFAULT_TIMEOUT,
                          op_done);
  return started(self->owner, op, rc, name);
}

static PyObject *Store_wait(StoreObject *self, PyObject *args) {
  return Store_keys_op(self, args, 0);
}
static PyObject *Store_check(StoreObject *self, PyObject *args) {
  return Store_keys_op(self, args, 1);
}

static PyObject *Store_set_timeout(StoreObject *self, PyObject *args) {
  double s;
  uvccl_store_t *st;
  if (!PyArg_ParseTuple(args, "d", &s)) return NULL;
  if ((st = store_open(self, "store.set_timeout")) == NULL) return NULL;
  uvccl_store_set_timeout(st, (uint64_t)(s * 1000.0 + 0.5));
  Py_RETURN_NONE;
}

static PyObject *Store_close(StoreObject *self, PyObject *args) {
  PyObject *fut;
  if (!PyArg_ParseTuple(args, "O", &fut)) return NULL;
  if (!close_begin(fut, self->box != NULL, self->box ? &self->box->fut : NULL))
    Py_RETURN_NONE;
  uvccl_store_close(&self->box->store, store_closed);
  self->box = NULL;
  Py_RETURN_NONE;
}

static PyMethodDef Store_methods[] = {
  {"connect", (PyCFunction)Store_connect, METH_VARARGS, NULL},
  {"set", (PyCFunction)Store_set, METH_VARARGS, NULL},
  {"get", (PyCFunction)Store_get, METH_VARARGS, NULL},
  {"add", (PyCFunction)Store_add, METH_VARARGS, NULL},
  {"delete_key", (PyCFunction)Store_delete_key, METH_VARARGS, NULL},
  {"num_keys", (PyCFunction)Store_num_keys, METH_VARARGS, NULL},
  {"compare_set", (PyCFunction)Store_compare_set, METH_VARARGS, NULL},
  {"wait", (PyCFunction)Store_wait, METH_VARARGS, NULL},
  {"check", (PyCFunction)Store_check, METH_VARARGS, NULL},
  {"append", (PyCFunction)Store_append, METH_VARARGS, NULL},
  {"multi_get", (PyCFunction)Store_multi_get, METH_VARARGS, NULL},
  {"multi_set", (PyCFunction)Store_multi_set, METH_VARARGS, NULL},
  {"list_keys", (PyCFunction)Store_list_keys, METH_VARARGS, NULL},
  {"queue_push", (PyCFunction)Store_queue_push, METH_VARARGS, NULL},
  {"queue_pop", (PyCFunction)Store_queue_pop, METH_VARARGS, NULL},
  {"queue_len", (PyCFunction)Store_queue_len, METH_VARARGS, NULL},
  {"set_timeout", (PyCFunction)Store_set_timeout, METH_VARARGS, NULL},
  {"close", (PyCFunction)Store_close, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL}
};

static PyTypeObject StoreType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "uvccl._core.Store",
  .tp_basicsize = sizeof(StoreObject),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_dealloc = (destructor)Store_dealloc,
  .tp_methods = Store_methods,
};

/* ---- StoreServer ------------------------------------------------------- */

static void server_closed(uvccl_store_server_t *sv) {
  server_box_t *box = (server_box_t *)sv;
  closed(box->fut);
  free(box);
}

static void Server_dealloc(ServerObject *self) {
  if (self->box != NULL)
    uvccl_store_server_close(&self->box->server, server_closed);
  Py_XDECREF(self->owner);
  PyObject_Free(self);
}

static PyObject *Server_get_port(ServerObject *self, void *c) {
  return PyLong_FromLong(self->box ? self->box->server.port : -1);
}

static PyObject *Server_close(ServerObject *self, PyObject *args) {
  PyObject *fut;
  if (!PyArg_ParseTuple(args, "O", &fut)) return NULL;
  if (!close_begin(fut, self->box != NULL, self->box ? &self->box->fut : NULL))
    Py_RETURN_NONE;
  uvccl_store_server_close(&self->box->server, server_closed);
  self->box = NULL;
  Py_RETURN_NONE;
}

static PyMethodDef Server_methods[] = {
  {"close", (PyCFunction)Server_close, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL}
};

static PyGetSetDef Server_getset[] = {
  {"port", (getter)Server_get_port, NULL, NULL, NULL},
  {NULL, NULL, NULL, NULL, NULL}
};

static PyTypeObject ServerType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "uvccl._core.StoreServer",
  .tp_basicsize = sizeof(ServerObject),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_dealloc = (destructor)Server_dealloc,
  .tp_methods = Server_methods,
  .tp_getset = Server_getset,
};

/* ---- module ------------------------------------------------------------ */

static PyObject *mod_set_error_factory(PyObject *m, PyObject *fn) {
  Py_INCREF(fn);
  Py_XSETREF(error_factory, fn);
  Py_RETURN_NONE;
}

static PyObject *mod_strerror(PyObject *m, PyObject *args) {
  int err;
  if (!PyArg_ParseTuple(args, "i", &err)) return NULL;
  return Py_BuildValue("(ss)", uvccl_err_name(err), uvccl_strerror(err));
}

static PyObject *mod_dtype_size(PyObject *m, PyObject *args) {
  const char *name;
  uvccl_dtype_t dt;
  if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
  if (uvccl_dtype_from_name(name, &dt) < 0) {
    PyErr_Format(PyExc_ValueError, "unknown dtype '%s'", name);
    return NULL;
  }
  return PyLong_FromSize_t(uvccl_dtype_size(dt));
}

static PyMethodDef module_methods[] = {
  {"set_error_factory", mod_set_error_factory, METH_O, NULL},
  {"strerror", mod_strerror, METH_VARARGS,
   "(symbolic name, message) of an error code"},
  {"dtype_size", mod_dtype_size, METH_VARARGS, NULL},
  {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
  PyModuleDef_HEAD_INIT, "uvccl._core",
  "uvccl's C library on a uv loop that asyncio drives", -1, module_methods,
  NULL, NULL, NULL, NULL
};

PyMODINIT_FUNC PyInit__core(void) {
  PyObject *m;
  PyTypeObject *types[] = {&LoopType, &GroupType, &StoreType, &ServerType};
  size_t i;
  for (i = 0; i < sizeof(types) / sizeof(types[0]); i++)
    if (PyType_Ready(types[i]) < 0) return NULL;
  str_set_result = PyUnicode_InternFromString("set_result");
  str_set_exception = PyUnicode_InternFromString("set_exception");
  str_done = PyUnicode_InternFromString("done");
  if (!str_set_result || !str_set_exception || !str_done) return NULL;
  m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  Py_INCREF(&LoopType);
  PyModule_AddObject(m, "Loop", (PyObject *)&LoopType);
  PyModule_AddStringConstant(m, "version", uvccl_version_string());
#define ERR(name, code, msg) PyModule_AddIntConstant(m, #name, UVCCL_##name);
  UVCCL_ERRNO_MAP(ERR)
#undef ERR
  PyModule_AddIntConstant(m, "ETIMEDOUT", UV_ETIMEDOUT);
  PyModule_AddIntConstant(m, "ECANCELED", UV_ECANCELED);
  PyModule_AddIntConstant(m, "EINVAL", UV_EINVAL);
  return m;
}
