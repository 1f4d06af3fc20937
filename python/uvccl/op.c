/* uvccl._core: errors, operations and their futures, buffers and dtypes. */
#include "core.h"




/* uvccl._error(status, message, failure) -> exception instance: the Python
 * side knows its exception classes. */
PyObject *core_error_factory;
PyObject *core_str_set_result, *core_str_set_exception, *core_str_done;
/* Futures core_resolved so far: a turn that core_resolved one hands back to asyncio
 * at once. */
uint64_t core_resolved;

/* How long one call may keep turning a uv loop that has more to do at
 * once (a busy-polling group waiting on its peers' rings) before it hands
 * back to asyncio. A turn of asyncio costs microseconds; spinning here for
 * this long at most saves those turns when the peers answer within it,
 * and keeps asyncio's loop as responsive as uvccl's turn budget does. */
#define SPIN_NS 50000

/* Turns the loop without waiting until something core_resolved a future, the
 * loop has nothing more to do at once, or SPIN_NS passed. Returns how long
 * asyncio may block (uvccl_loop_before_block). */
int core_turn(uv_loop_t *loop, int host_arms) {
  uint64_t before = core_resolved, deadline = uv_hrtime() + SPIN_NS;
  int t;
  for (;;) {
    uv_run(loop, UV_RUN_NOWAIT);
    t = uv_backend_timeout(loop);
    /* Where the host does not say when it blocks, it may block after any
     * turn: arm the wake-ups now. */
    if (t != 0 && !host_arms) t = uvccl_loop_before_block(loop);
    if (t != 0 || core_resolved != before || PyErr_Occurred()) return t;
    if (uv_hrtime() > deadline) return t;
  }
}

/* ---- errors ------------------------------------------------------------ */

PyObject *core_failure_of(const uvccl_pg_t *pg) {
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
                ? core_failure_of(pg)
                : (Py_INCREF(Py_None), Py_None);
  if (failure == NULL) return NULL;
  if (core_error_factory == NULL) { /* _core imported on its own */
    Py_DECREF(failure);
    return PyObject_CallFunction(PyExc_RuntimeError, "s", msg);
  }
  exc = PyObject_CallFunction(core_error_factory, "isN", status, msg, failure);
  return exc;
}

/* Raises for an error returned by the call itself. */
PyObject *core_raise_status(int status, const char *op, const char *msg,
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

op_t *core_op_new(PyObject *fut, PyObject *owner, int result) {
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

void core_op_free(op_t *op) {
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


void core_resolve(PyObject *fut, int status, const char *msg,
                    PyObject *value, const uvccl_pg_t *pg) {
  PyObject *done, *r;
  core_resolved++;
  done = PyObject_CallMethodNoArgs(fut, core_str_done);
  if (done == NULL) goto unraisable;
  if (PyObject_IsTrue(done)) { /* cancelled by its awaiter */
    Py_DECREF(done);
    return;
  }
  Py_DECREF(done);
  if (status == 0) {
    r = PyObject_CallMethodOneArg(fut, core_str_set_result,
                                  value ? value : Py_None);
  } else {
    PyObject *exc = make_error(status, msg, pg);
    if (exc == NULL) goto unraisable;
    r = PyObject_CallMethodOneArg(fut, core_str_set_exception, exc);
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
 * (core_closed()); with nothing left to close it resolves now. Returns 1 when
 * the caller is to close. */
int core_close_begin(PyObject *fut, int open, PyObject **slot) {
  if (!open) {
    if (fut != Py_None) core_resolve(fut, 0, "", Py_None, NULL);
    return 0;
  }
  if (fut != Py_None) {
    Py_INCREF(fut);
    *slot = fut;
  }
  return 1;
}

void core_closed(PyObject *fut) {
  if (fut != NULL) {
    core_resolve(fut, 0, "", Py_None, NULL);
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

void core_op_done(uvccl_work_t *w, int status) {
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
      uvccl_pg_destroy(&g->box->pg, core_pg_closed);
    }
    g->box = NULL;
  }
  core_resolve(op->fut, status, w->msg, value, pg);
  Py_XDECREF(value);
  core_op_free(op);
}

/* A started operation's fate: on a call-time error the op is freed and
 * the exception raised. On success the loop turns once, without waiting,
 * before the call returns: the operation's handles reach the kernel, and
 * when the peers were there first it may complete now, so that awaiting
 * its future costs asyncio no turn of its own (the callbacks resolve
 * futures only: no Python code of the application runs inside). Returns
 * the loop's backend timeout after that core_turn (ms; 0: more to do now), for
 * the driver. */
PyObject *core_started(LoopObject *lo, op_t *op, int rc, const char *name) {
  if (rc < 0) {
    PyObject *owner = op->owner;
    Py_XINCREF(owner);
    if (op->made != NULL) { /* never started: nothing to destroy */
      free(op->made->box);
      op->made->box = NULL;
      op->made->state = GROUP_GONE;
    }
    op->work.state = UVCCL_WORK_IDLE;
    core_raise_status(rc, name, op->work.msg, owner_pg(owner));
    Py_XDECREF(owner);
    core_op_free(op);
    return NULL;
  }
  {
    int t = core_turn(lo->loop, lo->host_arms);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLong(t);
  }
}

void core_set_timeout(op_t *op, double timeout_s) {
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
int core_hold(op_t *op, PyObject *obj, int writable, const char *opname,
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
int core_dtype_of(const Py_buffer *v, const char *dtname, int moving,
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
int core_redop_of(PyObject *v, const char *opname, uvccl_redop_t *op) {
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

