/* uvccl_pg_transfer: a member's buffers to the ranks that need them (a
 * joiner brought up to date), on the group's point-to-point calls, so any
 * backend with send and recv carries it.
 *
 * Messages, all under the caller's tag:
 *   root -> each receiver: HELLO (counts), LENGTHS (every buffer's);
 *   each receiver -> root: READY (its buffers match, or where they do not);
 *   root -> each receiver: GO (all ready, or why not: then everyone stops);
 *   the chunks along the chain root -> to[0] -> to[1] ...;
 *   root -> each receiver: SUMS (every buffer's CRC-32C, once all are out);
 *   each receiver -> root: DONE (its bytes checked, or which buffer not).
 * One peer and one tag keep their order, so a receiver posts its receives
 * in the order its peers send. A receiver forwards chunks in order, from
 * its own buffers, once they are in. */
#include "backend.h"
#include "checksum.h"
#include "loop/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAGIC 0x46585655u /* "UVXF" */
#define VERSION 1u
#define WINDOW 8 /* chunks in flight on each link */
#define TEXT 160

enum { M_HELLO, M_LENGTHS, M_READY, M_GO, M_SUMS, M_DONE, M_CHUNK_RX,
       M_CHUNK_TX };

typedef struct {
  uint32_t magic, version;
  uint64_t nbufs, chunk;
} hello_t;

/* READY, GO and DONE: a status and, when it is not 0, why. */
typedef struct {
  int32_t status;
  char text[TEXT];
} verdict_t;

typedef struct xfer_s xfer_t;

typedef struct {
  uvccl_work_t w;
  xfer_t *x;
  int kind;
  int peer;     /* group rank */
  size_t chunk; /* M_CHUNK_*: its index */
  verdict_t v;  /* READY, GO, DONE: sent or received here */
} slot_t;

struct xfer_s {
  uvccl_pg_t *pg;
  uvccl_work_t *outer; /* NULL once it completed or was abandoned */
  const uvccl_buf_t *bufs;
  size_t nbufs;
  int root, tag, nto, pos; /* pos: this rank's place in to, -1 at root */
  int *to;
  int pred, succ;          /* chain neighbours, -1 for none */
  /* the chunks: chunk k is bytes [off, off + len) of buffer buf */
  size_t nchunks;
  size_t *chunk_buf;
  size_t *chunk_off;
  /* the messages' bodies */
  hello_t hello;
  uint64_t *lengths;       /* nbufs (received: the root's) */
  uint32_t *sums;          /* ours, by buffer, as chunks go by */
  uint32_t *root_sums;     /* a receiver's copy of the root's */
  unsigned char *landed;   /* receiver: chunk k arrived */
  size_t next_post;        /* next chunk to send (root) or receive */
  size_t next_sum;         /* next chunk to checksum (and forward) */
  int in_flight;           /* chunk receives (or root's sends) pending */
  int forwarding;          /* forwarded chunks not yet sent */
  int readies, dones;      /* root: answers in */
  int sums_in;             /* receiver: SUMS arrived */
  int sums_posted;         /* receiver: its receive posted */
  int go_ok, go_status;
  char go_text[TEXT];
  int go_seen;             /* GO sent (root) or received, ok */
  int said_ready;          /* receiver: READY sent */
  int told_succ;           /* the empty message went to the successor */
  int finishing;           /* receiver: DONE (or a failed READY) sent */
  unsigned char hello_buf[1]; /* the empty message's address */
  /* the first failure, and the works still out */
  int status;
  char msg[UVCCL_WORK_MSG_LEN];
  int live;
  slot_t **slots;          /* live ones, for cancelling */
  int nslots, capslots;
};

static void on_inner(uvccl_work_t *w, int status);

/* ---- bookkeeping ----------------------------------------------------- */

static void xfer_free(xfer_t *x) {
  int i;
  for (i = 0; i < x->nslots; i++) uvccl__free(x->slots[i]);
  uvccl__free(x->slots);
  uvccl__free(x->to);
  uvccl__free(x->chunk_buf);
  uvccl__free(x->chunk_off);
  uvccl__free(x->lengths);
  uvccl__free(x->sums);
  uvccl__free(x->root_sums);
  uvccl__free(x->landed);
  uvccl__free(x);
}

static void fail(xfer_t *x, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int post(xfer_t *x, int kind, int peer, int is_send, void *buf,
                size_t len, size_t chunk);
static int post_verdict(xfer_t *x, int kind, int peer, const verdict_t *v);

static int is_receive(const xfer_t *x, int kind) {
  switch (kind) {
  case M_CHUNK_RX: return 1;
  case M_CHUNK_TX: return 0;
  case M_READY: case M_DONE: return x->pos < 0;
  default: return x->pos >= 0;
  }
}

/* The first failure wins. The others are told rather than left waiting:
 * a receiver's own receives are cancelled (what they wait for may never
 * come), the root hears why (READY or DONE with the failure), and the
 * next rank in the chain, if chunks were still due to it, gets an empty
 * message (no chunk is empty), which stops it the same way. Sends run to
 * their end, so no stream is cut mid-message. The root keeps waiting for
 * every receiver's answer: each either answers or is declared failed. */
static void fail(xfer_t *x, int status, const char *fmt, ...) {
  va_list ap;
  int i;
  verdict_t v;
  if (x->status != 0) return;
  x->status = status;
  va_start(ap, fmt);
  vsnprintf(x->msg, sizeof(x->msg), fmt, ap);
  va_end(ap);
  if (x->pos >= 0)
    for (i = 0; i < x->nslots; i++)
      if (is_receive(x, x->slots[i]->kind) &&
          uvccl__work_is_live(&x->slots[i]->w))
        uvccl_work_cancel(&x->slots[i]->w);
  if (x->succ >= 0 && x->go_ok && x->go_seen && !x->told_succ &&
      (x->pos < 0 ? x->next_post : x->next_sum) < x->nchunks) {
    x->told_succ = 1;
    post(x, M_CHUNK_TX, x->succ, 1, x->hello_buf, 0, (size_t)-1);
  }
  if (x->pos >= 0 && !x->finishing) {
    memset(&v, 0, sizeof(v));
    v.status = status;
    snprintf(v.text, sizeof(v.text), "rank %d: %.120s", x->pg->rank, x->msg);
    x->finishing = 1;
    post_verdict(x, x->said_ready ? M_DONE : M_READY, x->root, &v);
  }
}

/* Completes the caller's work once nothing is out any more. */
static void maybe_finish(xfer_t *x) {
  int done;
  if (x->live > 0) return;
  if (x->status == 0) {
    if (x->pos < 0)
      done = x->dones == x->nto && x->next_post == x->nchunks;
    else
      done = x->finishing;
    if (!done) return;
  }
  if (x->outer != NULL) {
    uvccl_work_t *w = x->outer;
    x->outer = NULL;
    w->owner_ = NULL;
    if (x->status != 0)
      uvccl__work_fail(w, x->status, "%s", x->msg);
    else
      uvccl__work_complete(w, 0);
  }
  xfer_free(x);
}

static slot_t *slot_new(xfer_t *x, int kind, int peer) {
  slot_t *s;
  if (x->nslots == x->capslots) {
    int cap = x->capslots ? 2 * x->capslots : 16;
    slot_t **n = uvccl__realloc(x->slots, sizeof(*n) * (size_t)cap);
    if (n == NULL) return NULL;
    x->slots = n;
    x->capslots = cap;
  }
  s = uvccl__calloc(1, sizeof(*s));
  if (s == NULL) return NULL;
  s->x = x;
  s->kind = kind;
  s->peer = peer;
  s->w.data = s;
  x->slots[x->nslots++] = s;
  return s;
}

/* A slot's work is over: it leaves the list (and memory). */
static void slot_done(slot_t *s) {
  xfer_t *x = s->x;
  int i;
  for (i = 0; i < x->nslots; i++)
    if (x->slots[i] == s) {
      x->slots[i] = x->slots[--x->nslots];
      break;
    }
  uvccl_work_cleanup(&s->w);
  uvccl__free(s);
}

static const char *kind_name(int kind) {
  static const char *const names[] = {"hello", "lengths", "ready", "go",
                                      "checksums", "done", "chunk", "chunk"};
  return names[kind];
}

/* Starts a send or a receive (of buf, or of the slot's verdict, set from
 * v when given); 0 or the error (the transfer fails with it: the caller
 * stops there). */
static int post_v(xfer_t *x, int kind, int peer, int is_send, void *buf,
                  size_t len, size_t chunk, const verdict_t *v) {
  slot_t *s = slot_new(x, kind, peer);
  int rc;
  if (s == NULL) {
    fail(x, UV_ENOMEM, "transfer: out of memory");
    return UV_ENOMEM;
  }
  s->chunk = chunk;
  if (v != NULL) s->v = *v;
  if (buf == NULL) {
    buf = &s->v;
    len = sizeof(s->v);
  }
  rc = is_send ? uvccl_send(x->pg, &s->w, buf, len, peer, x->tag, on_inner)
               : uvccl_recv(x->pg, &s->w, buf, len, peer, x->tag, on_inner);
  if (rc != 0) {
    slot_done(s);
    fail(x, rc, "transfer: cannot %s the %s %s rank %d: %s",
         is_send ? "send" : "receive", kind_name(kind),
         is_send ? "to" : "from", peer, uvccl_strerror(rc));
    return rc;
  }
  x->live++;
  return 0;
}

static int post(xfer_t *x, int kind, int peer, int is_send, void *buf,
                size_t len, size_t chunk) {
  return post_v(x, kind, peer, is_send, buf, len, chunk, NULL);
}

static int post_verdict(xfer_t *x, int kind, int peer, const verdict_t *v) {
  return post_v(x, kind, peer, 1, NULL, 0, 0, v);
}

/* ---- the chunks -------------------------------------------------------- */

static unsigned char *chunk_ptr(xfer_t *x, size_t k, size_t *len) {
  size_t b = x->chunk_buf[k], off = x->chunk_off[k];
  size_t rest = x->bufs[b].len - off;
  *len = rest < UVCCL_TRANSFER_CHUNK ? rest : UVCCL_TRANSFER_CHUNK;
  return (unsigned char *)x->bufs[b].base + off;
}

static int make_chunks(xfer_t *x) {
  size_t b, n = 0, k = 0, off;
  for (b = 0; b < x->nbufs; b++)
    n += (x->bufs[b].len + UVCCL_TRANSFER_CHUNK - 1) / UVCCL_TRANSFER_CHUNK;
  x->nchunks = n;
  x->chunk_buf = uvccl__calloc(n ? n : 1, sizeof(size_t));
  x->chunk_off = uvccl__calloc(n ? n : 1, sizeof(size_t));
  x->landed = uvccl__calloc(n ? n : 1, 1);
  if (x->chunk_buf == NULL || x->chunk_off == NULL || x->landed == NULL)
    return UV_ENOMEM;
  for (b = 0; b < x->nbufs; b++)
    for (off = 0; off < x->bufs[b].len; off += UVCCL_TRANSFER_CHUNK) {
      x->chunk_buf[k] = b;
      x->chunk_off[k] = off;
      k++;
    }
  return 0;
}

/* Root: checksums and sends chunks while fewer than WINDOW are out; once
 * the last is out, the checksums to every receiver. */
static void root_pump(xfer_t *x) {
  int i;
  while (x->status == 0 && x->in_flight < WINDOW &&
         x->next_post < x->nchunks) {
    size_t k = x->next_post, len;
    unsigned char *p = chunk_ptr(x, k, &len);
    x->sums[x->chunk_buf[k]] = uvccl__crc32c(x->sums[x->chunk_buf[k]], p, len);
    if (post(x, M_CHUNK_TX, x->to[0], 1, p, len, k) != 0) return;
    x->next_post++;
    x->in_flight++;
    if (x->next_post == x->nchunks)
      for (i = 0; i < x->nto; i++)
        if (post(x, M_SUMS, x->to[i], 1, x->sums, x->nbufs * sizeof(uint32_t),
                 0) != 0)
          return;
  }
}

/* Receiver: checksums (and forwards) the chunks that are in, in order,
 * and keeps WINDOW receives posted while its successor keeps up. */
static void recv_pump(xfer_t *x) {
  while (x->status == 0 && x->next_sum < x->nchunks &&
         x->landed[x->next_sum]) {
    size_t k = x->next_sum, len;
    unsigned char *p = chunk_ptr(x, k, &len);
    x->sums[x->chunk_buf[k]] = uvccl__crc32c(x->sums[x->chunk_buf[k]], p, len);
    x->next_sum++;
    if (x->succ >= 0) {
      if (post(x, M_CHUNK_TX, x->succ, 1, p, len, k) != 0) return;
      x->forwarding++;
    }
  }
  while (x->status == 0 && x->in_flight < WINDOW &&
         x->forwarding < WINDOW && x->next_post < x->nchunks) {
    size_t k = x->next_post, len;
    unsigned char *p = chunk_ptr(x, k, &len);
    if (post(x, M_CHUNK_RX, x->pred, 0, p, len, k) != 0) return;
    x->next_post++;
    x->in_flight++;
  }
  /* the root's checksums follow its chunks on the same stream when it is
   * our predecessor: their receive goes after the chunks' */
  if (x->status == 0 && !x->sums_posted &&
      (x->pred != x->root || x->next_post == x->nchunks)) {
    x->sums_posted = 1;
    if (post(x, M_SUMS, x->root, 0, x->root_sums,
             x->nbufs * sizeof(uint32_t), 0) != 0)
      return;
  }
  /* every byte checked against the root's sums: tell the root */
  if (x->status == 0 && !x->finishing && x->sums_in &&
      x->next_sum == x->nchunks) {
    verdict_t v;
    size_t b;
    memset(&v, 0, sizeof(v));
    for (b = 0; b < x->nbufs; b++)
      if (x->sums[b] != x->root_sums[b]) {
        v.status = UVCCL_ECHECKSUM;
        snprintf(v.text, sizeof(v.text),
                 "rank %d: buffer %zu arrived corrupted (CRC-32C %08x where "
                 "the root's is %08x)", x->pg->rank, b, x->sums[b],
                 x->root_sums[b]);
        break;
      }
    x->finishing = 1;
    if (post_verdict(x, M_DONE, x->root, &v) != 0) return;
    if (v.status != 0) fail(x, v.status, "transfer: %s", v.text);
  }
}


/* ---- what arrived ------------------------------------------------------ */

/* Receiver: the root's HELLO and LENGTHS against our buffers. */
static void check_lengths(xfer_t *x, verdict_t *v) {
  size_t b;
  memset(v, 0, sizeof(*v));
  for (b = 0; b < x->nbufs; b++)
    if (x->lengths[b] != x->bufs[b].len) {
      v->status = UVCCL_EMISMATCH;
      snprintf(v->text, sizeof(v->text),
               "rank %d's buffer %zu is %zu bytes where the root's is %llu",
               x->pg->rank, b, x->bufs[b].len,
               (unsigned long long)x->lengths[b]);
      return;
    }
}

/* Root: a receiver's READY (or its failure to answer). Once all are in,
 * GO to every one: on, or the first reason not to. */
static void root_on_ready(xfer_t *x, slot_t *s) {
  int i;
  verdict_t go;
  if (s->v.status != 0 && x->go_ok) {
    x->go_ok = 0;
    x->go_status = s->v.status;
    s->v.text[TEXT - 1] = '\0';
    snprintf(x->go_text, sizeof(x->go_text), "%s", s->v.text);
  }
  if (++x->readies < x->nto) return;
  if (x->status != 0 && x->go_ok) { /* this side failed meanwhile */
    x->go_ok = 0;
    x->go_status = x->status;
    snprintf(x->go_text, sizeof(x->go_text), "the root (rank %d): %.120s",
             x->pg->rank, x->msg);
  }
  memset(&go, 0, sizeof(go));
  go.status = x->go_ok ? 0 : x->go_status;
  snprintf(go.text, sizeof(go.text), "%s", x->go_text);
  for (i = 0; i < x->nto; i++)
    if (post_verdict(x, M_GO, x->to[i], &go) != 0) return;
  if (!x->go_ok) {
    fail(x, go.status, "transfer: %s", go.text);
    return;
  }
  x->go_seen = 1;
  for (i = 0; i < x->nto; i++)
    if (post(x, M_DONE, x->to[i], 0, NULL, 0, 0) != 0) return;
  if (x->nchunks == 0)
    for (i = 0; i < x->nto; i++)
      if (post(x, M_SUMS, x->to[i], 1, x->sums, x->nbufs * sizeof(uint32_t),
               0) != 0)
        return;
  root_pump(x);
}

static void on_message(xfer_t *x, slot_t *s) {
  verdict_t v;
  switch (s->kind) {
  case M_HELLO:
    if (x->hello.magic != MAGIC || x->hello.version != VERSION) {
      fail(x, UVCCL_EPROTO, "transfer: rank %d sent something else than a "
           "transfer's hello under tag %d", x->root, x->tag);
    } else if (x->hello.chunk != UVCCL_TRANSFER_CHUNK) {
      /* a root built with other chunks: the receives would not match */
      fail(x, UVCCL_EPROTO, "transfer: rank %d sends %llu-byte chunks, this "
           "build takes %u", x->root, (unsigned long long)x->hello.chunk,
           UVCCL_TRANSFER_CHUNK);
    } else if (x->hello.nbufs != x->nbufs) {
      /* the lengths still come: take them, then say so */
      uvccl__free(x->lengths);
      x->lengths = uvccl__calloc(x->hello.nbufs ? x->hello.nbufs : 1, 8);
      if (x->lengths == NULL || x->hello.nbufs > UVCCL_TRANSFER_MAX_BUFS) {
        fail(x, UVCCL_EPROTO, "transfer: the root's hello is malformed");
        break;
      }
      post(x, M_LENGTHS, x->root, 0, x->lengths, x->hello.nbufs * 8, 0);
    } else {
      post(x, M_LENGTHS, x->root, 0, x->lengths, x->nbufs * 8, 0);
    }
    break;
  case M_LENGTHS:
    if (x->hello.nbufs != x->nbufs) {
      memset(&v, 0, sizeof(v));
      v.status = UVCCL_EMISMATCH;
      snprintf(v.text, sizeof(v.text),
               "rank %d has %zu buffers where the root has %llu",
               x->pg->rank, x->nbufs, (unsigned long long)x->hello.nbufs);
    } else {
      check_lengths(x, &v);
    }
    x->said_ready = 1;
    if (v.status != 0) x->finishing = 1; /* the root stops it all */
    if (post_verdict(x, M_READY, x->root, &v) == 0)
      post(x, M_GO, x->root, 0, NULL, 0, 0);
    break;
  case M_GO:
    if (s->v.status != 0) {
      s->v.text[TEXT - 1] = '\0';
      x->finishing = 1; /* the root knows */
      fail(x, s->v.status, "transfer: %s", s->v.text);
      break;
    }
    x->go_seen = 1;
    recv_pump(x);
    break;
  case M_SUMS:
    if (x->pos >= 0) {
      x->sums_in = 1;
      recv_pump(x);
    }
    break;
  case M_CHUNK_RX:
    x->in_flight--;
    x->landed[s->chunk] = 1;
    recv_pump(x);
    break;
  case M_CHUNK_TX:
    if (s->chunk == (size_t)-1) break; /* the empty message */
    if (x->pos < 0) {
      x->in_flight--;
      root_pump(x);
    } else {
      x->forwarding--;
      recv_pump(x);
    }
    break;
  }
}

static void on_inner(uvccl_work_t *w, int status) {
  slot_t *s = w->data;
  xfer_t *x = s->x;
  const char *why = w->msg[0] ? w->msg : uvccl_strerror(status);
  x->live--;
  if (x->pos < 0 && s->kind == M_READY && x->outer != NULL) {
    /* every answer counts, even after a failure: GO must go out */
    if (status != 0) {
      s->v.status = status;
      snprintf(s->v.text, sizeof(s->v.text), "rank %d did not answer: %.120s",
               s->peer, why);
    }
    root_on_ready(x, s);
  } else if (x->pos < 0 && s->kind == M_DONE) {
    x->dones++;
    s->v.text[TEXT - 1] = '\0';
    if (status != 0)
      fail(x, status, "transfer: rank %d did not confirm its bytes: %s",
           s->peer, why);
    else if (s->v.status != 0)
      fail(x, s->v.status, "transfer: %s", s->v.text);
  } else if (status == 0 && x->status == 0) {
    if (s->kind == M_CHUNK_RX) {
      size_t len;
      chunk_ptr(x, s->chunk, &len);
      if (w->value_len == 0)
        fail(x, UVCCL_EABORTED, "transfer: rank %d, before this one in the "
             "chain, stopped (the transfer failed there or upstream)",
             s->peer);
      else if (w->value_len != len)
        fail(x, UVCCL_EPROTO, "transfer: chunk %zu from rank %d has %zu "
             "bytes where %zu were due", s->chunk, s->peer, w->value_len,
             len);
    }
    /* a control message sent needs nothing more */
    if (x->status == 0 && (s->kind == M_CHUNK_TX || is_receive(x, s->kind)))
      on_message(x, s);
  } else if (status != 0 && x->status == 0) {
    fail(x, status, "transfer: %s %s rank %d failed: %s", kind_name(s->kind),
         is_receive(x, s->kind) ? "from" : "to", s->peer, why);
  }
  slot_done(s);
  maybe_finish(x);
}

/* ---- the call ------------------------------------------------------------ */

/* The caller's work timed out or was cancelled: what is out is cancelled,
 * and the transfer's memory goes once the last of it has come back. */
static void on_abandon(uvccl_work_t *w, int status) {
  xfer_t *x = w->owner_;
  if (x == NULL) return;
  int i;
  x->outer = NULL;
  fail(x, status, "transfer abandoned");
  for (i = 0; i < x->nslots; i++)
    if (uvccl__work_is_live(&x->slots[i]->w))
      uvccl_work_cancel(&x->slots[i]->w);
  maybe_finish(x);
}

static const struct uvccl__work_ops transfer_ops = {on_abandon, NULL, NULL};

static int check_args(const uvccl_pg_t *pg, const uvccl_buf_t *bufs,
                      size_t nbufs, int root, const int *to, int nto,
                      int *pos) {
  int i, j;
  size_t b;
  if (pg == NULL || pg->loop == NULL || pg->rank < 0) return UV_EINVAL;
  if (root < 0 || root >= pg->size || nto < 1 || nto >= pg->size ||
      to == NULL || nbufs > UVCCL_TRANSFER_MAX_BUFS || (nbufs && !bufs))
    return UV_EINVAL;
  for (b = 0; b < nbufs; b++)
    if (bufs[b].len > 0 && bufs[b].base == NULL) return UV_EINVAL;
  *pos = -2;
  if (pg->rank == root) *pos = -1;
  for (i = 0; i < nto; i++) {
    if (to[i] < 0 || to[i] >= pg->size || to[i] == root) return UV_EINVAL;
    for (j = 0; j < i; j++)
      if (to[j] == to[i]) return UV_EINVAL;
    if (to[i] == pg->rank) *pos = i;
  }
  return *pos == -2 ? UV_EINVAL : 0;
}

int uvccl_pg_transfer(uvccl_pg_t *pg, uvccl_work_t *work,
                      const uvccl_buf_t *bufs, size_t nbufs, int root,
                      const int *to, int nto, int tag, uvccl_work_cb cb) {
  xfer_t *x;
  int pos, rc, i;
  size_t b;
  if (work == NULL) return UV_EINVAL;
  if ((rc = check_args(pg, bufs, nbufs, root, to, nto, &pos)) != 0) return rc;
  if (work->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  x = uvccl__calloc(1, sizeof(*x));
  if (x == NULL) return UV_ENOMEM;
  x->pg = pg;
  x->bufs = bufs;
  x->nbufs = nbufs;
  x->root = root;
  x->tag = tag;
  x->nto = nto;
  x->pos = pos;
  x->go_ok = 1;
  x->to = uvccl__calloc((size_t)nto, sizeof(int));
  x->sums = uvccl__calloc(nbufs ? nbufs : 1, sizeof(uint32_t));
  x->root_sums = uvccl__calloc(nbufs ? nbufs : 1, sizeof(uint32_t));
  x->lengths = uvccl__calloc(nbufs ? nbufs : 1, 8);
  if (x->to == NULL || x->sums == NULL || x->root_sums == NULL ||
      x->lengths == NULL || make_chunks(x) != 0) {
    xfer_free(x);
    return UV_ENOMEM;
  }
  memcpy(x->to, to, sizeof(int) * (size_t)nto);
  x->pred = pos < 0 ? -1 : pos == 0 ? root : to[pos - 1];
  x->succ = pos < 0 ? to[0] : pos + 1 < nto ? to[pos + 1] : -1;
  x->hello.magic = MAGIC;
  x->hello.version = VERSION;
  x->hello.nbufs = nbufs;
  x->hello.chunk = UVCCL_TRANSFER_CHUNK;
  if (pos < 0)
    for (b = 0; b < nbufs; b++) x->lengths[b] = bufs[b].len;
  rc = uvccl__work_start(work, pg->loop, "transfer", &transfer_ops, x,
                         work->timeout_ms, cb);
  if (rc != 0) {
    xfer_free(x);
    return rc;
  }
  x->outer = work;
  /* The first message posted: if it cannot start, nothing did, and the
   * call fails as a whole. */
  if (pos < 0) {
    rc = post(x, M_READY, to[0], 0, NULL, 0, 0);
    for (i = 1; rc == 0 && i < nto; i++)
      rc = post(x, M_READY, to[i], 0, NULL, 0, 0);
    for (i = 0; rc == 0 && i < nto; i++) {
      rc = post(x, M_HELLO, to[i], 1, &x->hello, sizeof(x->hello), 0);
      if (rc == 0)
        rc = post(x, M_LENGTHS, to[i], 1, x->lengths, nbufs * 8, 0);
    }
  } else {
    rc = post(x, M_HELLO, root, 0, &x->hello, sizeof(x->hello), 0);
  }
  /* a failure to start goes to the callback, like any other */
  if (rc != 0) maybe_finish(x);
  return 0;
}
