/* FileStore: a store in one file shared by the processes of a host, in
 * PyTorch's FileStore format, so a PyTorch FileStore and this store can
 * share the file.
 *
 * The format, as PyTorch 1.13 writes it (checked against python3-torch with
 * strace and hexdumps):
 *  - The file is an append-only log of entries. An entry is a key then a
 *    value, each a u32 length in host byte order followed by the bytes.
 *  - A user key k is stored as "/" + k. A delete appends "-" + "/" + k with
 *    an empty value (a tombstone). "cleanup/" counts the handles that have
 *    closed: each close adds 1 to it, and the one that brings it to exactly
 *    world_size removes the file. Nothing is written at open.
 *  - add stores the new total as decimal text; its old value is read with
 *    std::stoll rules (leading spaces, sign, digits, trailing junk ignored;
 *    an empty value counts as 0).
 *  - Writers hold flock(LOCK_EX) while appending, readers flock(LOCK_SH)
 *    while replaying, so nobody ever sees half an entry.
 *  - num_keys counts every key of the replayed map, "cleanup/" included:
 *    PyTorch does, and both sides must agree on the number.
 *
 * Every file access runs on libuv's thread pool, one job at a time per
 * store: the job opens the file, takes the lock, replays what was appended
 * since the last replay into an in-memory map, performs the operation and
 * closes the file. Works wait for the job slot in a FIFO, so operations
 * complete in the order they were started. get, wait and multi_get whose
 * keys are missing move to a blocked list and are re-checked by a poll job
 * every 10 ms (PyTorch's polling interval) until the keys appear or the
 * work's own timer fires.
 *
 * The map and the replay position belong to whoever runs: the job while it
 * is on the thread pool, the loop thread otherwise (uv_queue_work orders
 * the two). The loop thread only reads the map in the after-work callback
 * or when no job is in flight.
 *
 * Every operation runs under the store's timeout, writes included (a peer
 * that holds the lock forever must not hang us); a write whose job was
 * already on the thread pool when it timed out may still land.
 *
 * delete_key appends a tombstone as PyTorch 1.13's deleteKey does; its
 * result says whether the key existed (PyTorch always says true), and a
 * missing key writes nothing. Beyond PyTorch: list_keys (the user keys,
 * not "cleanup/"), append and multi_set/multi_get (1.13's FileStore has
 * none of them; they write ordinary entries, so PyTorch reads the results),
 * and a file that was removed or replaced (another inode, or shorter than
 * what was replayed) is replayed afresh instead of being trusted from a
 * stale map. Queues are not supported: UVCCL_ENOTSUP at the call. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define FS_POLL_MS 10
#define FS_READ_CHUNK (64 * 1024)
#define FS_REGULAR_PREFIX '/'
#define FS_DELETE_PREFIX '-'
#define FS_CLEANUP_KEY "cleanup/"
#define FS_LEN_MAX UINT32_MAX

/* ---- The replayed map ------------------------------------------------------
 * Chained hash table of file keys (with their "/" prefix) to values. */

typedef struct fs_entry_s {
  struct fs_entry_s *next;
  uint64_t hash;
  char *val; /* NUL-terminated past vlen */
  size_t vlen;
  size_t klen;
  char key[]; /* klen bytes, then a NUL */
} fs_entry_t;

typedef struct {
  fs_entry_t **buckets;
  size_t nbuckets; /* 0 or a power of two */
  size_t count;
} fs_map_t;

static uint64_t fs_hash(const void *p, size_t n) {
  const unsigned char *c = p;
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  while (n--) {
    h ^= *c++;
    h *= 1099511628211ULL;
  }
  return h;
}

static fs_entry_t *map_find(const fs_map_t *m, const void *k, size_t klen) {
  uint64_t h;
  fs_entry_t *e;
  if (m->nbuckets == 0) return NULL;
  h = fs_hash(k, klen);
  for (e = m->buckets[h & (m->nbuckets - 1)]; e != NULL; e = e->next)
    if (e->hash == h && e->klen == klen && memcmp(e->key, k, klen) == 0)
      return e;
  return NULL;
}

static int map_grow(fs_map_t *m) {
  size_t n = m->nbuckets ? m->nbuckets * 2 : 64, i;
  fs_entry_t **b = uvccl__calloc(n, sizeof(*b)), *e, *next;
  if (b == NULL) return UV_ENOMEM;
  for (i = 0; i < m->nbuckets; i++) {
    for (e = m->buckets[i]; e != NULL; e = next) {
      next = e->next;
      e->next = b[e->hash & (n - 1)];
      b[e->hash & (n - 1)] = e;
    }
  }
  uvccl__free(m->buckets);
  m->buckets = b;
  m->nbuckets = n;
  return 0;
}

/* Takes ownership of val (malloc'ed, NUL-terminated), also on failure. */
static int map_put(fs_map_t *m, const void *k, size_t klen, char *val,
                   size_t vlen) {
  fs_entry_t *e = map_find(m, k, klen), **slot;
  if (e != NULL) {
    uvccl__free(e->val);
    e->val = val;
    e->vlen = vlen;
    return 0;
  }
  if (m->count + 1 > m->nbuckets / 4 * 3 && map_grow(m) != 0) {
    uvccl__free(val);
    return UV_ENOMEM;
  }
  e = uvccl__malloc(sizeof(*e) + klen + 1);
  if (e == NULL) {
    uvccl__free(val);
    return UV_ENOMEM;
  }
  e->hash = fs_hash(k, klen);
  e->klen = klen;
  memcpy(e->key, k, klen);
  e->key[klen] = '\0';
  e->val = val;
  e->vlen = vlen;
  slot = &m->buckets[e->hash & (m->nbuckets - 1)];
  e->next = *slot;
  *slot = e;
  m->count++;
  return 0;
}

static void map_del(fs_map_t *m, const void *k, size_t klen) {
  uint64_t h;
  fs_entry_t **pe, *e;
  if (m->nbuckets == 0) return;
  h = fs_hash(k, klen);
  for (pe = &m->buckets[h & (m->nbuckets - 1)]; (e = *pe) != NULL;
       pe = &e->next) {
    if (e->hash == h && e->klen == klen && memcmp(e->key, k, klen) == 0) {
      *pe = e->next;
      uvccl__free(e->val);
      uvccl__free(e);
      m->count--;
      return;
    }
  }
}

static void map_clear(fs_map_t *m) {
  size_t i;
  fs_entry_t *e, *next;
  for (i = 0; i < m->nbuckets; i++) {
    for (e = m->buckets[i]; e != NULL; e = next) {
      next = e->next;
      uvccl__free(e->val);
      uvccl__free(e);
    }
  }
  uvccl__free(m->buckets);
  m->buckets = NULL;
  m->nbuckets = 0;
  m->count = 0;
}

/* ---- Store state --------------------------------------------------------- */

typedef struct {
  char *p;
  size_t len;
} fs_bytes_t;

enum { FS_QUEUED = 1, FS_BLOCKED, FS_RUNNING };
typedef enum { FS_JOB_OP = 1, FS_JOB_POLL, FS_JOB_CLEANUP } fs_job_kind_t;

/* One operation, copied out of the request (whose pointers die with
 * submit). Reached from its work through priv_[0]. */
typedef struct {
  uvccl_work_t *work; /* NULL once abandoned while its job ran */
  uvccl__op_t op;
  int where;          /* FS_QUEUED, FS_BLOCKED or FS_RUNNING */
  int64_t delta;
  size_t n;
  fs_bytes_t *keys;   /* file keys ("/" + key), n of them */
  fs_bytes_t *vals;   /* SET APPEND MULTI_SET; COMPARE_SET: expected,
                         desired */
  /* Results, written by the job. */
  int64_t result;
  fs_bytes_t reply;   /* COMPARE_SET */
} fs_op_t;

typedef struct {
  uvccl_store_t *store;
  uv_loop_t *loop;
  char *path;
  int world_size;

  /* Replay state (see the top of the file for who may touch it). */
  fs_map_t map;
  uint64_t pos;       /* file offset replayed up to */
  dev_t dev;          /* the file the map was replayed from */
  ino_t ino;
  int have_id;

  /* Loop thread only. */
  uvccl__work_list_t queued;  /* waiting for the job slot, in order */
  uvccl__work_list_t blocked; /* keys missing: re-checked by polls */
  uv_timer_t poll_timer;      /* also the handle whose close ends close */
  int poll_wanted;
  int closing;
  int cleanup_started;

  /* The one job slot. The fields below req are written by the job and
   * read in its after-work callback. */
  uv_work_t req;
  int busy;
  fs_job_kind_t kind;
  fs_op_t *op;
  int status;
  char msg[UVCCL_WORK_MSG_LEN];
  int64_t cleanup_count;
  int cleanup_skipped; /* no file to clean up */
  int removed;
} file_store_t;

static void fs_kick(file_store_t *fs);

static void fs_op_free(fs_op_t *op) {
  size_t i;
  if (op == NULL) return;
  if (op->keys != NULL)
    for (i = 0; i < op->n; i++) uvccl__free(op->keys[i].p);
  if (op->vals != NULL)
    for (i = 0; i < (op->op == UVCCL__OP_COMPARE_SET ? 2 : op->n); i++)
      uvccl__free(op->vals[i].p);
  uvccl__free(op->keys);
  uvccl__free(op->vals);
  uvccl__free(op->reply.p);
  uvccl__free(op);
}

static int bytes_dup(fs_bytes_t *b, const void *p, size_t len) {
  b->p = uvccl__malloc(len + 1);
  if (b->p == NULL) return UV_ENOMEM;
  if (len) memcpy(b->p, p, len);
  b->p[len] = '\0';
  b->len = len;
  return 0;
}

/* "/" + key: the regular prefix PyTorch puts before every user key. */
static int key_dup(fs_bytes_t *b, const char *key) {
  size_t len = strlen(key);
  if (len >= FS_LEN_MAX) return UVCCL_ELIMIT;
  b->p = uvccl__malloc(len + 2);
  if (b->p == NULL) return UV_ENOMEM;
  b->p[0] = FS_REGULAR_PREFIX;
  memcpy(b->p + 1, key, len + 1);
  b->len = len + 1;
  return 0;
}

/* The user's key, for messages. */
static const char *op_key(const fs_op_t *op) {
  return op->n > 0 ? op->keys[0].p + 1 : "";
}

static int op_writes(uvccl__op_t op) {
  switch (op) {
  case UVCCL__OP_SET:
  case UVCCL__OP_ADD:
  case UVCCL__OP_COMPARE_SET:
  case UVCCL__OP_DELETE_KEY:
  case UVCCL__OP_APPEND:
  case UVCCL__OP_MULTI_SET:
    return 1;
  default:
    return 0;
  }
}

static fs_op_t *fs_op_new(const uvccl__store_req_t *q, int *err) {
  fs_op_t *op = uvccl__calloc(1, sizeof(*op));
  size_t i, n = 0, nv = 0;
  int r = 0, single = 0;

  if (op == NULL) goto nomem;
  op->op = q->op;
  op->delta = q->delta;
  switch (q->op) {
  case UVCCL__OP_SET:
  case UVCCL__OP_APPEND:
  case UVCCL__OP_COMPARE_SET:
    n = 1;
    nv = q->op == UVCCL__OP_COMPARE_SET ? 2 : 1;
    single = 1;
    break;
  case UVCCL__OP_GET:
  case UVCCL__OP_ADD:
  case UVCCL__OP_DELETE_KEY:
    n = 1;
    single = 1;
    break;
  case UVCCL__OP_CHECK:
  case UVCCL__OP_WAIT:
  case UVCCL__OP_MULTI_GET:
    n = q->nkeys;
    break;
  case UVCCL__OP_MULTI_SET:
    n = nv = q->nkeys;
    break;
  default:
    break;
  }
  if (n > 0 && (op->keys = uvccl__calloc(n, sizeof(*op->keys))) == NULL)
    goto nomem;
  op->n = n;
  if (nv > 0 && (op->vals = uvccl__calloc(nv, sizeof(*op->vals))) == NULL)
    goto nomem;
  /* Single-key operations carry req->key, the others req->keys. */
  if (single)
    r = key_dup(&op->keys[0], q->key);
  else
    for (i = 0; r == 0 && i < n; i++) r = key_dup(&op->keys[i], q->keys[i]);
  if (r == 0 && q->op == UVCCL__OP_COMPARE_SET) {
    if (q->expected_len > FS_LEN_MAX || q->value_len > FS_LEN_MAX)
      r = UVCCL_ELIMIT;
    if (r == 0) r = bytes_dup(&op->vals[0], q->expected, q->expected_len);
    if (r == 0) r = bytes_dup(&op->vals[1], q->value, q->value_len);
  } else if (r == 0 && q->op == UVCCL__OP_MULTI_SET) {
    for (i = 0; r == 0 && i < n; i++) {
      if (q->values[i].len > FS_LEN_MAX) r = UVCCL_ELIMIT;
      else r = bytes_dup(&op->vals[i], q->values[i].base, q->values[i].len);
    }
  } else if (r == 0 && nv == 1) {
    if (q->value_len > FS_LEN_MAX) r = UVCCL_ELIMIT;
    else r = bytes_dup(&op->vals[0], q->value, q->value_len);
  }
  if (r != 0) {
    fs_op_free(op);
    *err = r;
    return NULL;
  }
  return op;

nomem:
  fs_op_free(op);
  *err = UV_ENOMEM;
  return NULL;
}

/* ---- Jobs: everything below up to the loop side runs on the thread pool --
 * They must not log or touch works; they report through fs->status and
 * fs->msg. */

static int job_err(file_store_t *fs, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int job_err(file_store_t *fs, int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(fs->msg, sizeof(fs->msg), fmt, ap);
  va_end(ap);
  fs->status = status;
  return status;
}

static int job_errno(file_store_t *fs, const char *what, int err) {
  return job_err(fs, -err, "file store '%s': %s: %s", fs->path, what,
                 uvccl_strerror(-err));
}

static int job_corrupt(file_store_t *fs, uint64_t at, const char *what,
                       uint64_t len, uint64_t size) {
  return job_err(fs, UVCCL_EPROTO,
                 "file store '%s' is corrupt: %s length %" PRIu64
                 " at offset %" PRIu64 " runs past the end of the file (%"
                 PRIu64 " bytes)", fs->path, what, len, at, size);
}

/* Buffered positional reads of the part of the file not yet replayed. */
typedef struct {
  int fd;
  uint64_t off; /* file offset of the next byte to consume */
  uint64_t end; /* the file size seen under the lock */
  char *buf;
  size_t bpos, blen;
} fs_reader_t;

static int rd_bytes(file_store_t *fs, fs_reader_t *rd, void *dst, size_t n) {
  char *d = dst;
  ssize_t got;
  size_t take;

  while (n > 0) {
    if (rd->bpos == rd->blen) {
      /* Large values skip the buffer. */
      int direct = n >= FS_READ_CHUNK;
      size_t want = direct ? n : FS_READ_CHUNK;
      if (want > rd->end - rd->off) want = (size_t)(rd->end - rd->off);
      if (want == 0) break;
      do
        got = pread(rd->fd, direct ? d : rd->buf, want, (off_t)rd->off);
      while (got < 0 && errno == EINTR);
      if (got < 0) return job_errno(fs, "read", errno);
      if (got == 0) break;
      if (direct) {
        d += got;
        n -= (size_t)got;
        rd->off += (uint64_t)got;
        continue;
      }
      rd->bpos = 0;
      rd->blen = (size_t)got;
    }
    take = rd->blen - rd->bpos;
    if (take > n) take = n;
    memcpy(d, rd->buf + rd->bpos, take);
    rd->bpos += take;
    rd->off += take;
    d += take;
    n -= take;
  }
  if (n > 0)
    /* The size was checked against the length fields, so only a writer
     * that ignores the lock can get us here. */
    return job_err(fs, UVCCL_EPROTO,
                   "file store '%s' shrank while being read (offset %" PRIu64
                   ")", fs->path, rd->off);
  return 0;
}

/* Reads one length-prefixed field into a malloc'ed, NUL-terminated buffer.
 * The length is checked against the file size before anything is
 * allocated, so a corrupt length can neither crash nor exhaust memory. */
static int rd_field(file_store_t *fs, fs_reader_t *rd, const char *what,
                    char **out, size_t *outlen) {
  uint64_t at = rd->off;
  uint32_t len;
  char *p;
  int r;

  *out = NULL;
  if (rd->end - rd->off < sizeof(len))
    return job_err(fs, UVCCL_EPROTO,
                   "file store '%s' is corrupt: truncated %s length at offset "
                   "%" PRIu64 " (file is %" PRIu64 " bytes)",
                   fs->path, what, at, rd->end);
  if ((r = rd_bytes(fs, rd, &len, sizeof(len))) != 0) return r;
  if (len > rd->end - rd->off)
    return job_corrupt(fs, at, what, len, rd->end);
  p = uvccl__malloc((size_t)len + 1);
  if (p == NULL)
    return job_err(fs, UV_ENOMEM, "file store '%s': out of memory", fs->path);
  if ((r = rd_bytes(fs, rd, p, len)) != 0) {
    uvccl__free(p);
    return r;
  }
  p[len] = '\0';
  *out = p;
  *outlen = len;
  return 0;
}

/* Applies one entry to the map (a tombstone deletes). Takes val. */
static int fs_apply(file_store_t *fs, const char *k, size_t klen, char *val,
                    size_t vlen) {
  if (klen > 0 && k[0] == FS_DELETE_PREFIX) {
    map_del(&fs->map, k + 1, klen - 1);
    uvccl__free(val);
    return 0;
  }
  if (map_put(&fs->map, k, klen, val, vlen) != 0)
    return job_err(fs, UV_ENOMEM, "file store '%s': out of memory", fs->path);
  return 0;
}

static void fs_reset(file_store_t *fs) {
  map_clear(&fs->map);
  fs->pos = 0;
  fs->have_id = 0;
}

/* Replays what was appended since the last replay (PyTorch's refresh()).
 * The caller holds a lock on fd. */
static int fs_refresh(file_store_t *fs, int fd) {
  struct stat st;
  fs_reader_t rd;
  char *k, *v;
  size_t klen, vlen;
  int r = 0;

  if (fstat(fd, &st) != 0) return job_errno(fs, "stat", errno);
  if (S_ISDIR(st.st_mode))
    return job_err(fs, UV_EISDIR, "file store '%s' is a directory", fs->path);
  /* A removed and recreated (or truncated) file is a new store: replaying
   * it from our old offset would mix two histories. */
  if (!fs->have_id || st.st_dev != fs->dev || st.st_ino != fs->ino ||
      (uint64_t)st.st_size < fs->pos) {
    fs_reset(fs);
    fs->dev = st.st_dev;
    fs->ino = st.st_ino;
    fs->have_id = 1;
  }
  if ((uint64_t)st.st_size == fs->pos) return 0;

  memset(&rd, 0, sizeof(rd));
  rd.fd = fd;
  rd.off = fs->pos;
  rd.end = (uint64_t)st.st_size;
  rd.buf = uvccl__malloc(FS_READ_CHUNK);
  if (rd.buf == NULL)
    return job_err(fs, UV_ENOMEM, "file store '%s': out of memory", fs->path);
  while (rd.off < rd.end) {
    if ((r = rd_field(fs, &rd, "key", &k, &klen)) != 0) break;
    if ((r = rd_field(fs, &rd, "value", &v, &vlen)) != 0) {
      uvccl__free(k);
      break;
    }
    r = fs_apply(fs, k, klen, v, vlen);
    uvccl__free(k);
    if (r != 0) break;
    /* Only whole entries count as replayed. */
    fs->pos = rd.off;
  }
  uvccl__free(rd.buf);
  return r;
}

static int write_all(int fd, const char *p, size_t n) {
  ssize_t w;
  while (n > 0) {
    w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -errno;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static char *put_field(char *p, const void *b, size_t len) {
  uint32_t l = (uint32_t)len; /* host byte order, as PyTorch */
  memcpy(p, &l, sizeof(l));
  if (len) memcpy(p + sizeof(l), b, len);
  return p + sizeof(l) + len;
}

/* Appends n entries in one write. The caller holds LOCK_EX on fd and has
 * just replayed it, so the map is current and can take our own entries
 * without reading them back: blocked works of this store see them as soon
 * as the job returns. */
static int fs_append(file_store_t *fs, int fd, size_t n,
                     const fs_bytes_t *keys, const fs_bytes_t *vals) {
  size_t total = 0, i;
  char *buf, *p, *v;
  off_t end;
  int r;

  for (i = 0; i < n; i++) total += 8 + keys[i].len + vals[i].len;
  if (total == 0) return 0;
  buf = uvccl__malloc(total);
  if (buf == NULL)
    return job_err(fs, UV_ENOMEM, "file store '%s': out of memory", fs->path);
  for (p = buf, i = 0; i < n; i++) {
    p = put_field(p, keys[i].p, keys[i].len);
    p = put_field(p, vals[i].p, vals[i].len);
  }
  end = lseek(fd, 0, SEEK_END);
  if (end < 0) {
    uvccl__free(buf);
    return job_errno(fs, "seek", errno);
  }
  r = write_all(fd, buf, total);
  uvccl__free(buf);
  if (r != 0) {
    /* A torn entry would make the file unreadable for everyone: cut it
     * off (best effort; we still hold the lock). */
    if (ftruncate(fd, end) != 0) { /* nothing more to do */ }
    return job_err(fs, r, "file store '%s': write: %s", fs->path,
                   uvccl_strerror(r));
  }
  if (fs->pos != (uint64_t)end) return 0; /* not current: replay later */
  for (i = 0; i < n; i++) {
    if ((v = uvccl__malloc(vals[i].len + 1)) == NULL) return 0;
    if (vals[i].len) memcpy(v, vals[i].p, vals[i].len);
    v[vals[i].len] = '\0';
    /* On failure the next replay starts over from pos, and replaying
     * entries that are already applied changes nothing. */
    if (fs_apply(fs, keys[i].p, keys[i].len, v, vals[i].len) != 0) {
      fs->status = 0;
      return 0;
    }
  }
  fs->pos = (uint64_t)end + total;
  return 0;
}

static int fs_append1(file_store_t *fs, int fd, const fs_bytes_t *key,
                      const void *v, size_t vlen) {
  fs_bytes_t val;
  val.p = (char *)v;
  val.len = vlen;
  return fs_append(fs, fd, 1, key, &val);
}

/* std::stoll, as PyTorch's add parses the old value: leading white space,
 * a sign, at least one digit; trailing bytes are ignored. */
static int parse_stoll(const char *s, size_t len, int64_t *out) {
  size_t i = 0;
  int neg = 0, digits = 0;
  uint64_t v = 0, lim;

  while (i < len && (s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r'))) i++;
  if (i < len && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (; i < len && s[i] >= '0' && s[i] <= '9'; i++, digits++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (v > (lim - d) / 10) return UV_ERANGE;
    v = v * 10 + d;
  }
  if (digits == 0) return UVCCL_ENOTNUM;
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return 0;
}

/* add under LOCK_EX: replay, parse, append the new total. */
static int fs_add(file_store_t *fs, int fd, const fs_bytes_t *key,
                  const char *name, int64_t delta, int64_t *out) {
  fs_entry_t *e;
  int64_t v = 0;
  char num[32];
  int r;

  if ((r = fs_refresh(fs, fd)) != 0) return r;
  e = map_find(&fs->map, key->p, key->len);
  if (e != NULL && e->vlen > 0 && (r = parse_stoll(e->val, e->vlen, &v)) != 0)
    return job_err(fs, UVCCL_ENOTNUM,
                   "store.add '%s': value '%.*s' is %s", name,
                   e->vlen > 32 ? 32 : (int)e->vlen, e->val,
                   r == UV_ERANGE ? "out of range" : "not an integer");
  if (__builtin_add_overflow(v, delta, &v))
    return job_err(fs, UV_ERANGE, "store.add '%s': %" PRId64 " + %" PRId64
                   " overflows", name, v, delta);
  snprintf(num, sizeof(num), "%" PRId64, v);
  if ((r = fs_append1(fs, fd, key, num, strlen(num))) != 0) return r;
  *out = v;
  return 0;
}

static int fs_run_op(file_store_t *fs, int fd, fs_op_t *op) {
  fs_entry_t *e;
  fs_bytes_t *exp, *des, tomb;
  char *joined;
  size_t len;
  int r;

  switch (op->op) {
  case UVCCL__OP_SET:
  case UVCCL__OP_MULTI_SET:
    if ((r = fs_refresh(fs, fd)) != 0) return r;
    return fs_append(fs, fd, op->n, op->keys, op->vals);
  case UVCCL__OP_ADD:
    return fs_add(fs, fd, &op->keys[0], op_key(op), op->delta,
                  &op->result);
  case UVCCL__OP_APPEND:
    if ((r = fs_refresh(fs, fd)) != 0) return r;
    e = map_find(&fs->map, op->keys[0].p, op->keys[0].len);
    if (e == NULL) return fs_append(fs, fd, 1, op->keys, op->vals);
    len = e->vlen + op->vals[0].len;
    if (len > FS_LEN_MAX)
      return job_err(fs, UVCCL_ELIMIT, "store.append '%s': value would be "
                     "%zu bytes, over the format's 4 GiB", op_key(op), len);
    joined = uvccl__malloc(len + 1);
    if (joined == NULL)
      return job_err(fs, UV_ENOMEM, "file store '%s': out of memory",
                     fs->path);
    memcpy(joined, e->val, e->vlen);
    memcpy(joined + e->vlen, op->vals[0].p, op->vals[0].len);
    r = fs_append1(fs, fd, &op->keys[0], joined, len);
    uvccl__free(joined);
    return r;
  case UVCCL__OP_COMPARE_SET:
    /* Always replay: the cached value may be stale (as PyTorch). */
    if ((r = fs_refresh(fs, fd)) != 0) return r;
    exp = &op->vals[0];
    des = &op->vals[1];
    e = map_find(&fs->map, op->keys[0].p, op->keys[0].len);
    if ((e == NULL && exp->len == 0) ||
        (e != NULL && e->vlen == exp->len &&
         memcmp(e->val, exp->p, exp->len) == 0)) {
      if ((r = fs_append(fs, fd, 1, op->keys, des)) != 0) return r;
      r = bytes_dup(&op->reply, des->p, des->len);
    } else if (e == NULL) {
      r = bytes_dup(&op->reply, exp->p, exp->len);
    } else {
      r = bytes_dup(&op->reply, e->val, e->vlen);
    }
    if (r != 0)
      return job_err(fs, r, "file store '%s': out of memory", fs->path);
    return 0;
  case UVCCL__OP_DELETE_KEY:
    if ((r = fs_refresh(fs, fd)) != 0) return r;
    e = map_find(&fs->map, op->keys[0].p, op->keys[0].len);
    op->result = e != NULL;
    if (e == NULL) return 0;
    /* The tombstone: "-" + file key, empty value. */
    tomb.len = op->keys[0].len + 1;
    tomb.p = uvccl__malloc(tomb.len + 1);
    if (tomb.p == NULL)
      return job_err(fs, UV_ENOMEM, "file store '%s': out of memory",
                     fs->path);
    tomb.p[0] = FS_DELETE_PREFIX;
    memcpy(tomb.p + 1, op->keys[0].p, op->keys[0].len + 1);
    r = fs_append1(fs, fd, &tomb, "", 0);
    uvccl__free(tomb.p);
    return r;
  default: /* reads: the loop side answers from the replayed map */
    return fs_refresh(fs, fd);
  }
}

static int fs_cleanup(file_store_t *fs, int fd) {
  fs_bytes_t key;
  int r;
  key.p = FS_CLEANUP_KEY;
  key.len = sizeof(FS_CLEANUP_KEY) - 1;
  if ((r = fs_add(fs, fd, &key, FS_CLEANUP_KEY, 1, &fs->cleanup_count)) != 0)
    return r;
  /* PyTorch removes the file when the count is exactly world_size (a
   * world_size <= 0 never matches). Unlinking under the lock means every
   * later open gets a fresh file. */
  if (fs->world_size > 0 && fs->cleanup_count == fs->world_size) {
    if (unlink(fs->path) != 0 && errno != ENOENT)
      return job_errno(fs, "unlink", errno);
    fs->removed = 1;
  }
  return 0;
}

static void fs_job_run(uv_work_t *req) {
  file_store_t *fs = req->data;
  int writes, flags, fd, r, err;

  writes = fs->kind == FS_JOB_CLEANUP ||
           (fs->kind == FS_JOB_OP && op_writes(fs->op->op));
  flags = (writes ? O_RDWR : O_RDONLY) | O_CLOEXEC;
  /* Writes create the file (as PyTorch); the cleanup does not, since a
   * file that is gone has been cleaned up already. */
  if (writes && fs->kind != FS_JOB_CLEANUP) flags |= O_CREAT;
  do
    fd = open(fs->path, flags, 0644);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    err = errno;
    if (err == ENOENT && fs->kind == FS_JOB_CLEANUP) {
      fs->cleanup_skipped = 1;
      return;
    }
    if (err == ENOENT && !writes) {
      /* No file yet: an empty store (PyTorch waits for the file to
       * appear; polling does the same here). */
      fs_reset(fs);
      return;
    }
    job_err(fs, -err, "cannot open file store '%s': %s", fs->path,
            uvccl_strerror(-err));
    return;
  }
  do
    r = flock(fd, writes ? LOCK_EX : LOCK_SH);
  while (r != 0 && errno == EINTR);
  if (r != 0) {
    job_errno(fs, "flock", errno);
    close(fd);
    return;
  }
  switch (fs->kind) {
  case FS_JOB_OP:
    fs_run_op(fs, fd, fs->op);
    break;
  case FS_JOB_POLL:
    fs_refresh(fs, fd);
    break;
  case FS_JOB_CLEANUP:
    fs_cleanup(fs, fd);
    break;
  }
  /* close() drops the flock as well. */
  close(fd);
}

/* ---- Loop side ----------------------------------------------------------- */

static int fs_have_all(file_store_t *fs, const fs_op_t *op) {
  size_t i;
  for (i = 0; i < op->n; i++)
    if (map_find(&fs->map, op->keys[i].p, op->keys[i].len) == NULL) return 0;
  return 1;
}

/* Answers a get, wait or multi_get whose keys are all in the map. */
static void fs_answer(file_store_t *fs, uvccl_work_t *w, const fs_op_t *op) {
  fs_entry_t *e;
  size_t i;
  int r = 0;

  if (op->op == UVCCL__OP_GET) {
    e = map_find(&fs->map, op->keys[0].p, op->keys[0].len);
    r = uvccl__work_set_value(w, e->val, e->vlen);
  } else if (op->op == UVCCL__OP_MULTI_GET) {
    r = uvccl__work_set_values(w, op->n);
    for (i = 0; r == 0 && i < op->n; i++) {
      e = map_find(&fs->map, op->keys[i].p, op->keys[i].len);
      r = uvccl__work_set_nth(w, i, e->val, e->vlen);
    }
  }
  uvccl__work_complete(w, r);
}

static void fs_poll_cb(uv_timer_t *t) {
  file_store_t *fs = t->data;
  fs->poll_wanted = 1;
  fs_kick(fs);
}

static void fs_blocked_changed(file_store_t *fs) {
  if (fs->blocked.len == 0) {
    uv_timer_stop(&fs->poll_timer);
    fs->poll_wanted = 0;
  } else if (!uv_is_active((uv_handle_t *)&fs->poll_timer)) {
    uv_timer_start(&fs->poll_timer, fs_poll_cb, FS_POLL_MS, FS_POLL_MS);
  }
}

/* Answers every blocked work whose keys are now in the map. Completing
 * never calls back inside this loop, so walking the list is safe. */
static void fs_check_blocked(file_store_t *fs) {
  uvccl_work_t *w, *next;
  fs_op_t *op;
  for (w = fs->blocked.head; w != NULL; w = next) {
    next = w->next_;
    op = w->priv_[0];
    if (!fs_have_all(fs, op)) continue;
    uvccl__work_list_remove(&fs->blocked, w);
    w->priv_[0] = NULL;
    fs_answer(fs, w, op);
    fs_op_free(op);
  }
  fs_blocked_changed(fs);
}

/* A replay failed (a corrupt file, an unreadable path): the blocked works
 * would only fail the same way on every poll, so they fail now. */
static void fs_fail_blocked(file_store_t *fs, int status, const char *msg) {
  uvccl_work_t *w;
  while ((w = uvccl__work_list_pop(&fs->blocked)) != NULL) {
    fs_op_free(w->priv_[0]);
    w->priv_[0] = NULL;
    uvccl__work_fail(w, status, "%s", msg);
  }
  fs_blocked_changed(fs);
}

static int collect_keys(file_store_t *fs, uvccl_work_t *w) {
  size_t i, n = 0;
  fs_entry_t *e;
  int r;
  /* Only user keys: "cleanup/" is PyTorch's bookkeeping. */
  for (i = 0; i < fs->map.nbuckets; i++)
    for (e = fs->map.buckets[i]; e != NULL; e = e->next)
      if (e->klen > 0 && e->key[0] == FS_REGULAR_PREFIX) n++;
  if ((r = uvccl__work_set_values(w, n)) != 0) return r;
  n = 0;
  for (i = 0; i < fs->map.nbuckets; i++)
    for (e = fs->map.buckets[i]; e != NULL; e = e->next)
      if (e->klen > 0 && e->key[0] == FS_REGULAR_PREFIX &&
          (r = uvccl__work_set_nth(w, n++, e->key + 1, e->klen - 1)) != 0)
        return r;
  return 0;
}

/* An operation's job finished: complete its work (unless it was abandoned
 * meanwhile) or move it to the blocked list. */
static void fs_op_done(file_store_t *fs, fs_op_t *op) {
  uvccl_work_t *w = op->work;
  int r = 0;

  if (w == NULL) { /* timed out or cancelled while on the thread pool */
    fs_op_free(op);
    return;
  }
  if (fs->status != 0) {
    w->priv_[0] = NULL;
    uvccl__work_fail(w, fs->status, "%s", fs->msg);
    fs_op_free(op);
    return;
  }
  switch (op->op) {
  case UVCCL__OP_ADD:
  case UVCCL__OP_DELETE_KEY:
    w->result = op->result;
    break;
  case UVCCL__OP_COMPARE_SET:
    r = uvccl__work_set_value(w, op->reply.p, op->reply.len);
    break;
  case UVCCL__OP_CHECK:
    w->result = fs_have_all(fs, op);
    break;
  case UVCCL__OP_GETNUMKEYS:
    w->result = (int64_t)fs->map.count;
    break;
  case UVCCL__OP_LIST_KEYS:
    r = collect_keys(fs, w);
    break;
  case UVCCL__OP_GET:
  case UVCCL__OP_WAIT:
  case UVCCL__OP_MULTI_GET:
    if (!fs_have_all(fs, op)) {
      if (fs->closing) {
        r = UV_ECANCELED;
        break;
      }
      op->where = FS_BLOCKED;
      uvccl__work_list_push(&fs->blocked, w);
      fs_blocked_changed(fs);
      return;
    }
    w->priv_[0] = NULL;
    fs_answer(fs, w, op);
    fs_op_free(op);
    return;
  default:
    break;
  }
  w->priv_[0] = NULL;
  if (r == UV_ECANCELED)
    uvccl__work_fail(w, r, "%s '%s': store closed", w->op, op_key(op));
  else
    uvccl__work_complete(w, r);
  fs_op_free(op);
}

static void fs_closed_cb(uv_handle_t *h) {
  file_store_t *fs = h->data;
  uvccl_store_t *s = fs->store;
  map_clear(&fs->map);
  uvccl__free(fs->path);
  uvccl__free(fs);
  uvccl__store_closed(s);
}

static void fs_cleanup_done(file_store_t *fs) {
  if (fs->status != 0)
    LOG_WARN("store", "file store '%s': cleanup on close failed: %s",
             fs->path, fs->msg);
  else if (fs->cleanup_skipped)
    LOG_DEBUG("store", "file store '%s': closed (no file to clean up)",
              fs->path);
  else
    LOG_DEBUG("store", "file store '%s': closed, %s = %" PRId64 "%s",
              fs->path, FS_CLEANUP_KEY, fs->cleanup_count,
              fs->removed ? ", file removed" : "");
  uv_close((uv_handle_t *)&fs->poll_timer, fs_closed_cb);
}

static void fs_job_done(uv_work_t *req, int status) {
  file_store_t *fs = req->data;
  fs_job_kind_t kind = fs->kind;
  fs_op_t *op = fs->op;

  fs->busy = 0;
  fs->op = NULL;
  if (status != 0 && fs->status == 0) /* never cancelled, but be safe */
    job_err(fs, status, "file store '%s': %s", fs->path,
            uvccl_strerror(status));
  switch (kind) {
  case FS_JOB_OP:
    fs_op_done(fs, op);
    fs_check_blocked(fs);
    break;
  case FS_JOB_POLL:
    fs_check_blocked(fs);
    if (fs->status != 0) fs_fail_blocked(fs, fs->status, fs->msg);
    break;
  case FS_JOB_CLEANUP:
    fs_cleanup_done(fs);
    return;
  }
  fs_kick(fs);
}

static int fs_start_job(file_store_t *fs, fs_job_kind_t kind, fs_op_t *op) {
  int r;
  fs->kind = kind;
  fs->op = op;
  fs->status = 0;
  fs->msg[0] = '\0';
  fs->req.data = fs;
  fs->busy = 1;
  r = uv_queue_work(fs->loop, &fs->req, fs_job_run, fs_job_done);
  if (r != 0) {
    fs->busy = 0;
    fs->op = NULL;
  }
  return r;
}

/* Starts the next job if the slot is free. A poll that is due goes first
 * (it is due at most every 10 ms, so it cannot starve the queue, and a busy
 * queue of writes must not starve the blocked works); then the queued
 * operations in order; once closing, only the cleanup. */
static void fs_kick(file_store_t *fs) {
  uvccl_work_t *w;
  fs_op_t *op;
  int r;

  while (!fs->busy) {
    if (fs->closing) {
      if (fs->cleanup_started) return;
      fs->cleanup_started = 1;
      if ((r = fs_start_job(fs, FS_JOB_CLEANUP, NULL)) != 0) {
        job_err(fs, r, "cannot start file I/O: %s", uvccl_strerror(r));
        fs_cleanup_done(fs);
      }
      return;
    }
    if (fs->poll_wanted && fs->blocked.len > 0) {
      fs->poll_wanted = 0;
      if (fs_start_job(fs, FS_JOB_POLL, NULL) == 0) return;
      /* Could not start: the next tick of the poll timer tries again. */
    }
    if ((w = uvccl__work_list_pop(&fs->queued)) == NULL) return;
    op = w->priv_[0];
    op->where = FS_RUNNING;
    r = fs_start_job(fs, FS_JOB_OP, op);
    if (r != 0) {
      w->priv_[0] = NULL;
      uvccl__work_fail(w, r, "%s '%s': cannot start file I/O: %s", w->op,
                       op_key(op), uvccl_strerror(r));
      fs_op_free(op);
    }
  }
}

static void fs_abandon(uvccl_work_t *w, int status) {
  file_store_t *fs = w->owner_;
  fs_op_t *op = w->priv_[0];
  char key[64];

  if (op == NULL) return;
  w->priv_[0] = NULL;
  snprintf(key, sizeof(key), "%s", op_key(op));
  switch (op->where) {
  case FS_QUEUED:
    uvccl__work_list_remove(&fs->queued, w);
    fs_op_free(op);
    break;
  case FS_BLOCKED:
    uvccl__work_list_remove(&fs->blocked, w);
    fs_blocked_changed(fs);
    fs_op_free(op);
    break;
  case FS_RUNNING:
    /* The job cannot be stopped: it frees op when it returns, and its
     * result is dropped. A write may still happen. */
    op->work = NULL;
    break;
  }
  if (status == UV_ETIMEDOUT)
    uvccl__work_fail(w, status, "%s '%s': timed out after %llu ms "
                     "(file store '%s')", w->op, key,
                     (unsigned long long)w->timeout_ms_, fs->path);
}

static const struct uvccl__work_ops fs_work_ops = {fs_abandon, NULL, NULL};

static int fs_submit(uvccl_store_t *s, uvccl_work_t *w,
                     const uvccl__store_req_t *q, uvccl_work_cb cb) {
  file_store_t *fs = s->impl_;
  fs_op_t *op;
  int r;

  switch (q->op) {
  case UVCCL__OP_SET:
  case UVCCL__OP_GET:
  case UVCCL__OP_ADD:
  case UVCCL__OP_COMPARE_SET:
  case UVCCL__OP_CHECK:
  case UVCCL__OP_WAIT:
  case UVCCL__OP_DELETE_KEY:
  case UVCCL__OP_GETNUMKEYS:
  case UVCCL__OP_APPEND:
  case UVCCL__OP_MULTI_GET:
  case UVCCL__OP_MULTI_SET:
  case UVCCL__OP_LIST_KEYS:
    break;
  default: /* queues: PyTorch's FileStore has none */
    return UVCCL_ENOTSUP;
  }
  op = fs_op_new(q, &r);
  if (op == NULL) return r;
  /* Every operation has the store's timeout, blocking ones and writes
   * alike: a peer that holds the lock forever must not hang us. */
  r = uvccl__work_start(w, s->loop, uvccl__op_name(q->op), &fs_work_ops, fs,
                        q->timeout_ms, cb);
  if (r != 0) {
    fs_op_free(op);
    return r;
  }
  op->work = w;
  op->where = FS_QUEUED;
  w->priv_[0] = op;
  uvccl__work_list_push(&fs->queued, w);
  fs_kick(fs);
  return 0;
}

static void fs_cancel(uvccl_work_t *w) {
  fs_abandon(w, UV_ECANCELED);
  uvccl__work_fail(w, UV_ECANCELED, "%s: store closed", w->op);
}

/* Pending works are cancelled; a job on the thread pool is waited for (its
 * result is still delivered), then this handle's "cleanup/" count is added
 * as PyTorch's destructor does, then the poll timer's close ends it. */
static void fs_close(uvccl_store_t *s) {
  file_store_t *fs = s->impl_;
  uvccl_work_t *w;

  fs->closing = 1;
  while ((w = fs->queued.head) != NULL) fs_cancel(w);
  while ((w = fs->blocked.head) != NULL) fs_cancel(w);
  uv_timer_stop(&fs->poll_timer);
  fs_kick(fs);
}

static const struct uvccl__store_vtable fs_vtable = {fs_submit, fs_close};

int uvccl_file_store_init(uv_loop_t *loop, uvccl_store_t *s, const char *path,
                          int world_size) {
  file_store_t *fs;
  if (loop == NULL || s == NULL || path == NULL || path[0] == '\0')
    return UV_EINVAL;
  fs = uvccl__calloc(1, sizeof(*fs));
  if (fs == NULL) return UV_ENOMEM;
  fs->path = uvccl__strdup(path);
  if (fs->path == NULL) {
    uvccl__free(fs);
    return UV_ENOMEM;
  }
  fs->store = s;
  fs->loop = loop;
  fs->world_size = world_size;
  uv_timer_init(loop, &fs->poll_timer);
  fs->poll_timer.data = fs;
  uvccl__store_init_common(s, loop, UVCCL_STORE_FILE, &fs_vtable, fs);
  LOG_DEBUG("store", "file store '%s' (world size %d)", path, world_size);
  return 0;
}
