/* uvccl._core: the stores (TCPStore client, HashStore) and the TCPStore
 * server, as futures. */
#include "core.h"

/* ---- Store ------------------------------------------------------------- */

static void store_closed(uvccl_store_t *st) {
  store_box_t *box = (store_box_t *)st;
  core_closed(box->fut);
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
    core_raise_status(UVCCL_ECLOSING, opname, "the store is closed", NULL);
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
    core_resolve(fut, 0, "", Py_None, NULL);
    Py_RETURN_NONE;
  }
  if ((op = core_op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  return core_started(self->owner, op, uvccl_tcp_store_connect(st, &op->work, core_op_done),
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
      (op = core_op_new(fut, (PyObject *)self, RES_NONE)) == NULL) {
    PyBuffer_Release(&v);
    return NULL;
  }
  switch (which) {
  case 0: rc = uvccl_store_set(st, &op->work, key, v.buf, (size_t)v.len, core_op_done); break;
  case 1: rc = uvccl_store_append(st, &op->work, key, v.buf, (size_t)v.len, core_op_done); break;
  default: rc = uvccl_store_queue_push(st, &op->work, key, v.buf, (size_t)v.len, core_op_done);
  }
  PyBuffer_Release(&v);
  return core_started(self->owner, op, rc, names[which]);
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
  op = core_op_new(fut, (PyObject *)self, results[which]);
  if (op == NULL) return NULL;
  switch (which) {
  case 0: rc = uvccl_store_get(st, &op->work, key, core_op_done); break;
  case 1: rc = uvccl_store_add(st, &op->work, key, delta, core_op_done); break;
  case 2: rc = uvccl_store_delete_key(st, &op->work, key, core_op_done); break;
  case 3: rc = uvccl_store_queue_len(st, &op->work, key, core_op_done); break;
  case 4: rc = uvccl_store_queue_pop(st, &op->work, key, block, core_op_done); break;
  }
  return core_started(self->owner, op, rc, names[which]);
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
  if ((op = core_op_new(fut, (PyObject *)self, RES_VALUES)) == NULL) return NULL;
  if ((keys = keys_block(list, "store.multi_get", &op->mem, &n)) == NULL) {
    core_op_free(op);
    return NULL;
  }
  return core_started(self->owner, op,
                 uvccl_store_multi_get(st, &op->work, keys, (size_t)n, core_op_done),
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
  if ((op = core_op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
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
    if (core_hold(op, PySequence_Fast_GET_ITEM(seq, i), 0, "store.multi_set",
             "each value") < 0) {
      free(bufs);
      Py_DECREF(seq);
      goto fail;
    }
    bufs[i].base = op->view[i].buf;
    bufs[i].len = (size_t)op->view[i].len;
  }
  Py_DECREF(seq);
  rc = uvccl_store_multi_set(st, &op->work, keys, bufs, (size_t)n, core_op_done);
  free(bufs); /* copied by the call */
  return core_started(self->owner, op, rc, "store.multi_set");
fail:
  core_op_free(op);
  return NULL;
}

/* list_keys(fut) -> [str] */
static PyObject *Store_list_keys(StoreObject *self, PyObject *args) {
  PyObject *fut;
  uvccl_store_t *st;
  op_t *op;
  if (!PyArg_ParseTuple(args, "O", &fut)) return NULL;
  if ((st = store_open(self, "store.list_keys")) == NULL) return NULL;
  if ((op = core_op_new(fut, (PyObject *)self, RES_KEYS)) == NULL) return NULL;
  return core_started(self->owner, op, uvccl_store_list_keys(st, &op->work, core_op_done),
                 "store.list_keys");
}

static PyObject *Store_num_keys(StoreObject *self, PyObject *args) {
  PyObject *fut;
  uvccl_store_t *st;
  op_t *op;
  if (!PyArg_ParseTuple(args, "O", &fut)) return NULL;
  if ((st = store_open(self, "store.num_keys")) == NULL) return NULL;
  if ((op = core_op_new(fut, (PyObject *)self, RES_RESULT)) == NULL) return NULL;
  return core_started(self->owner, op, uvccl_store_num_keys(st, &op->work, core_op_done),
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
  op = st ? core_op_new(fut, (PyObject *)self, RES_VALUE) : NULL;
  if (op == NULL) {
    PyBuffer_Release(&e);
    PyBuffer_Release(&d);
    return NULL;
  }
  rc = uvccl_store_compare_set(st, &op->work, key, e.buf, (size_t)e.len,
                               d.buf, (size_t)d.len, core_op_done);
  PyBuffer_Release(&e);
  PyBuffer_Release(&d);
  return core_started(self->owner, op, rc, "store.compare_set");
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
  if ((op = core_op_new(fut, (PyObject *)self, check ? RES_BOOL : RES_NONE)) == NULL)
    return NULL;
  if ((keys = keys_block(list, name, &op->mem, &n)) == NULL) {
    core_op_free(op);
    return NULL;
  }
  if (check)
    rc = uvccl_store_check(st, &op->work, keys, (size_t)n, core_op_done);
  else
    rc = uvccl_store_wait(st, &op->work, keys, (size_t)n,
                          to > 0 ? (uint64_t)(to * 1000.0 + 0.5)
                                 : UVCCL_DEFAULT_TIMEOUT,
                          core_op_done);
  return core_started(self->owner, op, rc, name);
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
  if (!core_close_begin(fut, self->box != NULL, self->box ? &self->box->fut : NULL))
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

PyTypeObject StoreType = {
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
  core_closed(box->fut);
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
  if (!core_close_begin(fut, self->box != NULL, self->box ? &self->box->fut : NULL))
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

PyTypeObject ServerType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "uvccl._core.StoreServer",
  .tp_basicsize = sizeof(ServerObject),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_dealloc = (destructor)Server_dealloc,
  .tp_methods = Server_methods,
  .tp_getset = Server_getset,
};

