/* uvccl._core: the ProcessGroup: collectives through one table of
 * shapes, point-to-point, subgroups, failure handling. */
#include "core.h"

/* ---- Group ------------------------------------------------------------- */

void core_pg_closed(uvccl_pg_t *pg) {
  pg_box_t *box = (pg_box_t *)pg;
  core_closed(box->fut);
  free(box);
}

static void Group_dealloc(GroupObject *self) {
  if (self->box != NULL && self->state == GROUP_READY)
    uvccl_pg_destroy(&self->box->pg, core_pg_closed);
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
    core_raise_status(UVCCL_ECLOSING, opname, msg, NULL);
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
    if (core_hold(op, out, 1, opname, "the output") < 0) return -1;
    vo = &op->view[op->nview - 1];
    if (core_dtype_of(vo, dtn, moving, opname, &dout, nout) < 0) return -1;
  }
  if (in != Py_None) {
    if (core_hold(op, in, 0, opname, "the input") < 0) return -1;
    vi = &op->view[op->nview - 1];
    if (core_dtype_of(vi, dtn, moving, opname, &din, nin) < 0) return -1;
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
  if (colls[which].reduces && core_redop_of(opn, name, &rop) < 0) return NULL;
  if (colls[which].root_side != 0) {
    PyObject **side = colls[which].root_side > 0 ? &out : &in;
    if (pg->rank == root && *side == Py_None) {
      PyErr_Format(PyExc_ValueError, "%s: the root needs an %s", name,
                   colls[which].root_side > 0 ? "output" : "input");
      return NULL;
    }
    if (pg->rank != root) *side = Py_None; /* unused there */
  }
  if ((op = core_op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  if (colls[which].shape == 0) {
    if (core_hold(op, out, 1, name, "the buffer") < 0 ||
        core_dtype_of(&op->view[0], dtn, !colls[which].reduces, name, &dt, &no) < 0)
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
  core_set_timeout(op, to);
  switch (which) {
  case COLL_ALLREDUCE:
    rc = uvccl_allreduce(pg, &op->work, ob, ob, no, dt, rop, core_op_done);
    break;
  case COLL_BROADCAST:
    rc = uvccl_broadcast(pg, &op->work, ob, no, dt, root, core_op_done);
    break;
  case COLL_REDUCE:
    rc = uvccl_reduce(pg, &op->work, ob, ob, no, dt, rop, root, core_op_done);
    break;
  case COLL_ALLGATHER:
    rc = uvccl_allgather(pg, &op->work, ib, ob, ni, dt, core_op_done);
    break;
  case COLL_REDUCE_SCATTER:
    rc = uvccl_reduce_scatter(pg, &op->work, ib, ob, no, dt, rop, core_op_done);
    break;
  case COLL_ALLTOALL:
    rc = uvccl_alltoall(pg, &op->work, ib, ob, ni / (size_t)pg->size, dt,
                        core_op_done);
    break;
  case COLL_GATHER:
    rc = uvccl_gather(pg, &op->work, ib, ob, ni, dt, root, core_op_done);
    break;
  default: /* COLL_SCATTER */
    rc = uvccl_scatter(pg, &op->work, ib, ob, no, dt, root, core_op_done);
  }
  return core_started(self->owner, op, rc, name);
fail:
  core_op_free(op);
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
  if ((op = core_op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
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
  core_set_timeout(op, to);
  return core_started(self->owner, op,
                 uvccl_alltoallv(pg, &op->work, op->view[1].buf, counts,
                                 op->view[0].buf, counts + pg->size, dt,
                                 core_op_done),
                 "alltoallv");
fail:
  core_op_free(op);
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
  if (core_redop_of(opn, "reduce_scatterv", &rop) < 0) return NULL;
  if ((op = core_op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
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
  core_set_timeout(op, to);
  return core_started(self->owner, op,
                 uvccl_reduce_scatterv(pg, &op->work, op->view[1].buf,
                                       op->view[0].buf, counts, dt, rop,
                                       core_op_done),
                 "reduce_scatterv");
fail:
  core_op_free(op);
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
  if ((op = core_op_new(fut, (PyObject *)self, RES_NONE)) == NULL) goto fail_seq;
  /* counts, then the buffer pointers, in one block */
  op->mem = malloc((sizeof(size_t) + sizeof(void *)) * (size_t)pg->size);
  if (op->mem == NULL) {
    PyErr_NoMemory();
    goto fail;
  }
  counts = op->mem;
  bufs = (void **)(counts + pg->size);
  if (core_hold(op, in, 0, "allgatherv", "the input") < 0 ||
      core_dtype_of(&op->view[0], dtn, 1, "allgatherv", &dt, &ni) < 0)
    goto fail;
  for (i = 0; i < pg->size; i++) {
    if (core_hold(op, PySequence_Fast_GET_ITEM(seq, i), 1, "allgatherv",
             "each output") < 0 ||
        core_dtype_of(&op->view[op->nview - 1], dtn, 1, "allgatherv", &d, &n) < 0)
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
  core_set_timeout(op, to);
  return core_started(self->owner, op,
                 uvccl_allgatherv(pg, &op->work, op->view[0].buf, ni,
                                  (void *const *)bufs, counts, dt, core_op_done),
                 "allgatherv");
fail:
  core_op_free(op);
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
  if (core_redop_of(opn, "allreduce_coalesced", &rop) < 0) return NULL;
  seq = PySequence_Fast(list, "allreduce_coalesced: a list of buffers");
  if (seq == NULL) return NULL;
  nb = PySequence_Fast_GET_SIZE(seq);
  if ((op = core_op_new(fut, (PyObject *)self, RES_NONE)) == NULL) {
    Py_DECREF(seq);
    return NULL;
  }
  if ((op->mem = bufs = malloc(sizeof(*bufs) * (size_t)(nb > 0 ? nb : 1))) ==
      NULL) {
    PyErr_NoMemory();
    goto fail;
  }
  for (i = 0; i < nb; i++) {
    if (core_hold(op, PySequence_Fast_GET_ITEM(seq, i), 1, "allreduce_coalesced",
             "each buffer") < 0 ||
        core_dtype_of(&op->view[i], dtn, 0, "allreduce_coalesced", &d, &n) < 0)
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
  core_set_timeout(op, to);
  return core_started(self->owner, op,
                 uvccl_allreduce_coalesced(pg, &op->work, bufs, (size_t)nb, dt,
                                           rop, core_op_done),
                 "allreduce_coalesced");
fail:
  Py_DECREF(seq);
  core_op_free(op);
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
  if ((op = core_op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  core_set_timeout(op, to);
  return core_started(self->owner, op,
                 uvccl_monitored_barrier(pg, &op->work, wait_all, core_op_done),
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
  if ((op = core_op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  core_set_timeout(op, to);
  return core_started(self->owner, op, uvccl_barrier(pg, &op->work, core_op_done), "barrier");
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
  if ((op = core_op_new(fut, (PyObject *)self, RES_NONE)) == NULL) return NULL;
  if (core_hold(op, buf, 0, "send", "the buffer") < 0) {
    core_op_free(op);
    return NULL;
  }
  core_set_timeout(op, to);
  return core_started(self->owner, op,
                 uvccl_send(pg, &op->work, op->view[0].buf,
                            (size_t)op->view[0].len, peer, tag, core_op_done),
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
  if ((op = core_op_new(fut, (PyObject *)self, RES_RECV)) == NULL) return NULL;
  if (core_hold(op, buf, 1, "recv", "the buffer") < 0) {
    core_op_free(op);
    return NULL;
  }
  core_set_timeout(op, to);
  return core_started(self->owner, op,
                 uvccl_recv(pg, &op->work, op->view[0].buf,
                            (size_t)op->view[0].len, peer, tag, core_op_done),
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
  if ((op = core_op_new(fut, (PyObject *)self, RES_BATCH)) == NULL) goto fail_seq;
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
        core_hold(op, buf, !send, "batch_isend_irecv", "each op's buffer") < 0)
      goto fail;
    p[i].is_send = send;
    p[i].buf = op->view[op->nview - 1].buf;
    p[i].len = (size_t)op->view[op->nview - 1].len;
    p[i].peer = peer;
    p[i].tag = tag;
  }
  Py_DECREF(seq);
  core_set_timeout(op, to);
  return core_started(self->owner, op,
                 uvccl_p2p_batch(pg, &op->work, p, (size_t)n, core_op_done),
                 "batch_isend_irecv");
fail:
  core_op_free(op);
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
  op = core_op_new(fut, (PyObject *)self,
              which == BYTES_ALLGATHER || which == BYTES_GATHER ? RES_VALUES
                                                                : RES_VALUE);
  if (op == NULL) return NULL;
  core_set_timeout(op, to);
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
        if (core_hold(op, PySequence_Fast_GET_ITEM(seq, i), 0, name, "each payload") < 0) {
          Py_DECREF(seq);
          goto fail;
        }
        bufs[i].base = op->view[i].buf;
        bufs[i].len = (size_t)op->view[i].len;
      }
      Py_DECREF(seq);
    }
    rc = uvccl_scatter_bytes(pg, &op->work, bufs, (size_t)n, root, core_op_done);
    return core_started(self->owner, op, rc, name);
  }
  {
    void *b = NULL;
    size_t len = 0;
    if (which != BYTES_BROADCAST || at_root) {
      if (core_hold(op, payload, 0, name, "the payload") < 0) goto fail;
      b = op->view[0].buf;
      len = (size_t)op->view[0].len;
    }
    switch (which) {
    case BYTES_BROADCAST:
      rc = uvccl_broadcast_bytes(pg, &op->work, b, len, root, core_op_done);
      break;
    case BYTES_ALLGATHER:
      rc = uvccl_allgather_bytes(pg, &op->work, b, len, core_op_done);
      break;
    default:
      rc = uvccl_gather_bytes(pg, &op->work, b, len, root, core_op_done);
    }
  }
  return core_started(self->owner, op, rc, name);
fail:
  core_op_free(op);
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
  if (rc < 0) return core_raise_status(rc, "premul_sum", NULL, pg);
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
  if ((g = core_group_alloc(self->owner)) == NULL) return NULL;
  if ((op = core_op_new(fut, (PyObject *)self, RES_GROUP)) == NULL) {
    Py_DECREF(g);
    return NULL;
  }
  op->made = g;
  r = core_started(self->owner, op, uvccl_pg_split(pg, &g->box->pg, color, key, &op->work,
                                 core_op_done),
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
  if ((g = core_group_alloc(self->owner)) == NULL) {
    free(ranks);
    return NULL;
  }
  if ((op = core_op_new(fut, (PyObject *)self, RES_GROUP)) == NULL) {
    Py_DECREF(g);
    free(ranks);
    return NULL;
  }
  op->made = g;
  op->mem = ranks;
  return core_started(self->owner, op,
                 n > 0 ? uvccl_pg_shrink_excluding(pg, &g->box->pg, ranks,
                                                   (int)n, &op->work, core_op_done)
                       : uvccl_pg_shrink(pg, &g->box->pg, &op->work, core_op_done),
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
  if ((g = core_group_alloc(self->owner)) == NULL) {
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
    return core_raise_status(rc, "new_group", NULL, pg);
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
  if (rc < 0) return core_raise_status(rc, "revoke", NULL, pg);
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
  if (!core_close_begin(fut, self->state == GROUP_READY,
                   self->box ? &self->box->fut : NULL))
    Py_RETURN_NONE;
  self->state = GROUP_GONE;
  uvccl_pg_destroy(&self->box->pg, core_pg_closed);
  self->box = NULL;
  Py_RETURN_NONE;
}

static PyObject *Group_failure(GroupObject *self, PyObject *unused) {
  if (self->state != GROUP_READY) Py_RETURN_NONE;
  return core_failure_of(&self->box->pg);
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

PyTypeObject GroupType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "uvccl._core.Group",
  .tp_basicsize = sizeof(GroupObject),
  .tp_flags = Py_TPFLAGS_DEFAULT,
  .tp_dealloc = (destructor)Group_dealloc,
  .tp_methods = Group_methods,
  .tp_getset = Group_getset,
};

