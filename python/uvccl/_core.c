/* uvccl._core: the C side of the asyncio binding; this file the module
 * and the Loop (core.h says where the rest is).
 *
 * A Loop is a uv_loop_t that Python's event loop drives (uvccl/__init__.py
 * watches its backend fd and timeout and calls run(), which is
 * uv_run(UV_RUN_NOWAIT)), so every uvccl callback runs on the thread that
 * runs asyncio, with the GIL held, and resolves the asyncio.Future the call
 * was given. Each call takes that future first. The buffers of an
 * operation stay held (their exporter's memory pinned) until it completes.
 * Nothing here waits: uvccl_work_wait is never called. */
#include "core.h"

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
    return core_raise_status(rc, "uv_loop_init", NULL, NULL);
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

/* Turns of the uv loop without blocking (see core_turn()): returns its backend
 * timeout afterwards (ms; -1: nothing timed; 0: more to do now). */
static PyObject *Loop_run(LoopObject *self, PyObject *unused) {
  int t = core_turn(self->loop, self->host_arms);
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
  if (rc < 0) return core_raise_status(rc, "trace_json", NULL, NULL);
  r = PyUnicode_DecodeUTF8(json, (Py_ssize_t)len, "replace");
  free(json);
  return r;
}

GroupObject *core_group_alloc(LoopObject *owner) {
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
  g = core_group_alloc(self);
  if (g == NULL) return NULL;
  op = core_op_new(fut, store == Py_None ? NULL : store, RES_GROUP);
  if (op == NULL) {
    Py_DECREF(g);
    return NULL;
  }
  op->made = g; /* the op's reference */
  if (url != NULL)
    rc = uvccl_pg_init_url(self->loop, &g->box->pg, url, &o, &op->work,
                           core_op_done);
  else
    rc = uvccl_pg_init(self->loop, &g->box->pg,
                       &((StoreObject *)store)->box->store, &o, &op->work,
                       core_op_done);
  return core_started(self, op, rc, "init_process_group");
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
    return core_raise_status(rc, "TCPStore", NULL, NULL);
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
    return core_raise_status(rc, "HashStore", NULL, NULL);
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
    return core_raise_status(rc, "StoreServer", NULL, NULL);
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

PyTypeObject LoopType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "uvccl._core.Loop",
  .tp_basicsize = sizeof(LoopObject),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_new = Loop_new,
  .tp_dealloc = (destructor)Loop_dealloc,
  .tp_methods = Loop_methods,
};

/* ---- module ------------------------------------------------------------ */

static PyObject *mod_set_error_factory(PyObject *m, PyObject *fn) {
  Py_INCREF(fn);
  Py_XSETREF(core_error_factory, fn);
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
  core_str_set_result = PyUnicode_InternFromString("set_result");
  core_str_set_exception = PyUnicode_InternFromString("set_exception");
  core_str_done = PyUnicode_InternFromString("done");
  if (!core_str_set_result || !core_str_set_exception || !core_str_done) return NULL;
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

