/* Shared-memory inboxes, slots and rings (see shm_seg.h). */
#define _GNU_SOURCE
#include "shm_seg.h"
#include "cpu/par.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "loop/internal.h"

static uint64_t slot_size(uint64_t ring_size) {
  return UVCCL__SHM_PAGE + ring_size;
}

static uint64_t slot_offset(uint64_t ring_size, uint32_t s) {
  return UVCCL__SHM_PAGE + (uint64_t)s * slot_size(ring_size);
}

/* The kernel's boot id: two processes that read the same one run on the
 * same host in the same boot (containers included). */
static void kernel_boot_id(uint8_t out[16]) {
  static uint8_t cached[16];
  static int have;
  char buf[64];
  int fd, i, n, k = 0;
  if (have) {
    memcpy(out, cached, 16);
    return;
  }
  memset(out, 0, 16);
  fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  n = (int)read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return;
  for (i = 0; i < n && k < 32; i++) {
    int c = buf[i], v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else continue;
    out[k / 2] = (uint8_t)(out[k / 2] | (k % 2 ? v : v << 4));
    k++;
  }
  memcpy(cached, out, 16);
  have = 1;
}

/* This rank's host: the boot id, told apart by $UVCCL_HOST_ID where ranks
 * of one kernel stand for different hosts (network namespaces): two
 * ranks are on one host only if both agree. All zero: unknown. */
static void boot_id(uint8_t out[16]) {
  const char *id = uvccl__config_text(UVCCL__CFG_HOST_ID);
  uint64_t h = 0xcbf29ce484222325ull;
  int i;
  kernel_boot_id(out);
  if (id == NULL || memcmp(out, (uint8_t[16]){0}, 16) == 0) return;
  for (i = 0; id[i] != '\0'; i++) {
    h ^= (unsigned char)id[i];
    h *= 0x100000001b3ull;
  }
  for (i = 0; i < 16; i++) {
    out[i] ^= (uint8_t)(h >> (8 * (i % 8)));
    if (i == 7) h = h * 0x9e3779b97f4a7c15ull + 1;
  }
}

static uint64_t id_key(const uint8_t id[16]) {
  uint64_t a, b;
  memcpy(&a, id, 8);
  memcpy(&b, id + 8, 8);
  return a ^ (b * 0x9e3779b97f4a7c15ull);
}

uint64_t uvccl__shm_host_key(const uvccl__shm_info_t *in) {
  return id_key(in->boot_id);
}

uint64_t uvccl__shm_kernel_key(const uvccl__shm_info_t *in) {
  return id_key(in->kernel_id);
}

int uvccl__shm_inbox_open(uvccl__shm_inbox_t *ib, uint32_t nslots,
                          uint64_t ring_size, char *err, size_t errlen) {
  int fds[2];
  uint64_t size;
  memset(ib, 0, sizeof(*ib));
  ib->memfd = ib->bell_r = ib->bell_w = -1;
  if (nslots > UVCCL__SHM_MAX_SLOTS) {
    snprintf(err, errlen, "shared memory: a world of %u is more than an "
             "inbox serves (%u)", nslots, (unsigned)UVCCL__SHM_MAX_SLOTS);
    return UV_E2BIG;
  }
  if (ring_size == 0 || ring_size % UVCCL__SHM_PAGE != 0 || nslots == 0) {
    snprintf(err, errlen, "shared memory: bad ring size %llu",
             (unsigned long long)ring_size);
    return UV_EINVAL;
  }
  size = slot_offset(ring_size, nslots);
  ib->memfd = memfd_create("uvccl-inbox", MFD_CLOEXEC);
  if (ib->memfd < 0) {
    int e = errno;
    snprintf(err, errlen, "shared memory: memfd_create: %s", strerror(e));
    return -e;
  }
  /* Sparse: pages exist once a ring is used. */
  if (ftruncate(ib->memfd, (off_t)size) != 0) {
    int e = errno;
    snprintf(err, errlen, "shared memory: ftruncate %llu: %s",
             (unsigned long long)size, strerror(e));
    uvccl__shm_inbox_close(ib);
    return -e;
  }
  ib->base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED,
                  ib->memfd, 0);
  if (ib->base == MAP_FAILED) {
    int e = errno;
    ib->base = NULL;
    snprintf(err, errlen, "shared memory: mmap %llu: %s",
             (unsigned long long)size, strerror(e));
    uvccl__shm_inbox_close(ib);
    return -e;
  }
  ib->size = (size_t)size;
  if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
    int e = errno;
    snprintf(err, errlen, "shared memory: pipe: %s", strerror(e));
    uvccl__shm_inbox_close(ib);
    return -e;
  }
  ib->bell_r = fds[0];
  ib->bell_w = fds[1];
  if (uv_random(NULL, NULL, &ib->cookie, sizeof(ib->cookie), 0, NULL) != 0)
    ib->cookie = uv_hrtime() ^ ((uint64_t)getpid() << 40);
  ib->ring_size = ring_size;
  ib->nslots = nslots;
  ib->hdr = (uvccl__shm_inbox_hdr_t *)ib->base;
  ib->hdr->magic = UVCCL__SHM_MAGIC;
  ib->hdr->nslots = nslots;
  ib->hdr->cookie = ib->cookie;
  ib->hdr->ring_size = ring_size;
  atomic_store(&ib->hdr->sleeping, 0);
  return 0;
}

void uvccl__shm_inbox_close(uvccl__shm_inbox_t *ib) {
  if (ib->base != NULL) munmap(ib->base, ib->size);
  if (ib->memfd >= 0) close(ib->memfd);
  if (ib->bell_r >= 0) close(ib->bell_r);
  if (ib->bell_w >= 0) close(ib->bell_w);
  ib->base = NULL;
  ib->hdr = NULL;
  ib->memfd = ib->bell_r = ib->bell_w = -1;
}

void uvccl__shm_info_none(uvccl__shm_info_t *in) {
  memset(in, 0, sizeof(*in));
  in->magic = UVCCL__SHM_MAGIC;
  in->kind = UVCCL__SHM_INFO;
  in->memfd = in->bellfd = -1;
  boot_id(in->boot_id); /* the host, for the rings' order (ring.c) */
  kernel_boot_id(in->kernel_id); /* the CPUs, for busy polling (net.c) */
}

void uvccl__shm_inbox_info(const uvccl__shm_inbox_t *ib,
                           uvccl__shm_info_t *in) {
  uvccl__shm_info_none(in);
  in->pid = (uint32_t)getpid();
  in->memfd = ib->memfd;
  in->bellfd = ib->bell_r;
  in->nslots = ib->nslots;
  in->cookie = ib->cookie;
  in->ring_size = ib->ring_size;
  in->cma_addr = (uint64_t)(uintptr_t)&ib->cookie;
  boot_id(in->boot_id);
}

int uvccl__shm_info_local(const uvccl__shm_info_t *in) {
  uint8_t mine[16], zero[16];
  if (in->magic != UVCCL__SHM_MAGIC || in->pid == 0 || in->memfd < 0 ||
      in->bellfd < 0)
    return 0;
  boot_id(mine);
  memset(zero, 0, sizeof(zero));
  return memcmp(mine, zero, 16) != 0 && memcmp(mine, in->boot_id, 16) == 0;
}

void uvccl__shm_inbox_slot(uvccl__shm_inbox_t *ib, uint32_t s,
                           uvccl__shm_in_t *in) {
  char *slot = ib->base + slot_offset(ib->ring_size, s);
  in->ring = (uvccl__shm_ring_hdr_t *)slot;
  in->data = slot + UVCCL__SHM_PAGE;
  in->size = ib->ring_size;
  in->head = atomic_load_explicit(&in->ring->head, memory_order_relaxed);
}

/* Opens another process's descriptor through /proc (same user, same PID
 * namespace: otherwise it is some other process, or refused). */
static int open_peer_fd(uint32_t pid, int fd, int flags, char *why,
                        size_t whylen) {
  char path[64];
  int r;
  snprintf(path, sizeof(path), "/proc/%u/fd/%d", pid, fd);
  r = open(path, flags | O_CLOEXEC);
  if (r < 0) {
    int e = errno;
    snprintf(why, whylen, "open %s: %s", path, strerror(e));
    return -e;
  }
  return r;
}

/* Maps len bytes of fd at off, read and write; NULL with why filled. */
static char *map_shared(int fd, size_t len, uint64_t off, char *why,
                        size_t whylen, int *rc) {
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                 (off_t)off);
  if (p != MAP_FAILED) return p;
  *rc = -errno;
  snprintf(why, whylen, "mmap: %s", strerror(errno));
  return NULL;
}

int uvccl__shm_attach(uvccl__shm_out_t *o, const uvccl__shm_info_t *peer,
                      uint32_t slot, char *why, size_t whylen) {
  struct stat st;
  int fd, rc = UV_EINVAL;
  const uvccl__shm_inbox_hdr_t *h;

  memset(o, 0, sizeof(*o));
  o->bellfd = -1;
  if (!uvccl__shm_info_local(peer)) {
    snprintf(why, whylen, "another host");
    return UV_EHOSTUNREACH;
  }
  if (peer->ring_size == 0 || peer->ring_size % UVCCL__SHM_PAGE != 0 ||
      peer->ring_size > ((uint64_t)1 << 32) || slot >= peer->nslots ||
      peer->nslots > UVCCL__SHM_MAX_SLOTS) {
    snprintf(why, whylen, "bad inbox description");
    return UV_EINVAL;
  }
  fd = open_peer_fd(peer->pid, peer->memfd, O_RDWR, why, whylen);
  if (fd < 0) return fd;
  if (fstat(fd, &st) != 0 ||
      (uint64_t)st.st_size != slot_offset(peer->ring_size, peer->nslots)) {
    snprintf(why, whylen, "the inbox is not the size it was said to be");
    goto fail;
  }
  o->hdr_map = map_shared(fd, UVCCL__SHM_PAGE, 0, why, whylen, &rc);
  if (o->hdr_map == NULL) goto fail;
  h = (const uvccl__shm_inbox_hdr_t *)o->hdr_map;
  if (h->magic != UVCCL__SHM_MAGIC || h->cookie != peer->cookie ||
      h->ring_size != peer->ring_size || h->nslots != peer->nslots) {
    snprintf(why, whylen, "another process's memory (cookie mismatch)");
    goto fail;
  }
  o->slot_size = (size_t)slot_size(peer->ring_size);
  o->slot_map = map_shared(fd, o->slot_size,
                           slot_offset(peer->ring_size, slot), why, whylen,
                           &rc);
  if (o->slot_map == NULL) goto fail;
  close(fd);
  fd = -1;
  /* Read and write: a pipe with a reader never raises SIGPIPE, even once
   * its owner is gone (the bytes then just stay). */
  o->bellfd = open_peer_fd(peer->pid, peer->bellfd, O_RDWR | O_NONBLOCK, why,
                           whylen);
  if (o->bellfd < 0) {
    rc = o->bellfd;
    o->bellfd = -1;
    goto fail;
  }
  if (fstat(o->bellfd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
    snprintf(why, whylen, "the doorbell is not a pipe");
    rc = UV_EINVAL;
    goto fail;
  }
  o->peer = (uvccl__shm_inbox_hdr_t *)o->hdr_map;
  o->ring = (uvccl__shm_ring_hdr_t *)o->slot_map;
  o->data = o->slot_map + UVCCL__SHM_PAGE;
  o->size = peer->ring_size;
  o->tail = atomic_load_explicit(&o->ring->tail, memory_order_relaxed);
  o->published = o->tail;
  o->slot = slot;
  return 0;

fail:
  if (fd >= 0) close(fd);
  uvccl__shm_detach(o);
  return rc;
}

void uvccl__shm_detach(uvccl__shm_out_t *o) {
  if (o->slot_map != NULL) munmap(o->slot_map, o->slot_size);
  if (o->hdr_map != NULL) munmap(o->hdr_map, UVCCL__SHM_PAGE);
  if (o->bellfd >= 0) close(o->bellfd);
  memset(o, 0, sizeof(*o));
  o->bellfd = -1;
}

void uvccl__shm_ring_bell(int fd) {
  char b = 1;
  ssize_t n;
  /* A full pipe already holds a wake-up: EAGAIN is fine. */
  do n = write(fd, &b, 1);
  while (n < 0 && errno == EINTR);
}

void uvccl__shm_bell_drain(uvccl__shm_inbox_t *ib) {
  char buf[256];
  while (read(ib->bell_r, buf, sizeof(buf)) == (ssize_t)sizeof(buf)) {
  }
}

void uvccl__shm_set_sleeping(uvccl__shm_inbox_t *ib, int sleeping) {
  atomic_store_explicit(&ib->hdr->sleeping, (uint32_t)sleeping,
                        memory_order_relaxed);
  /* Going to sleep: the flag must be visible before the rings are looked
   * at again (a producer publishes, then reads the flag: one of the two
   * sees the other). */
  if (sleeping) atomic_thread_fence(memory_order_seq_cst);
}

/* ---- producer -------------------------------------------------------------- */

int64_t uvccl__shm_space(uvccl__shm_out_t *o) {
  uint64_t head = atomic_load_explicit(&o->ring->head, memory_order_acquire);
  uint64_t used = o->tail - head;
  if (head > o->published || used > o->size) return -1;
  return (int64_t)(o->size - used);
}

void uvccl__shm_put(uvccl__shm_out_t *o, const void *src, size_t n) {
  uint64_t off = o->tail % o->size;
  size_t first = n < o->size - off ? n : (size_t)(o->size - off);
  uvccl__par_memcpy(o->data + off, src, first);
  if (n > first) uvccl__par_memcpy(o->data, (const char *)src + first, n - first);
  o->tail += n;
}

static void wake(uvccl__shm_inbox_hdr_t *h, int bellfd) {
  /* Whoever clears the flag rings: one wake-up per sleep, not one per
   * producer or per message. */
  if (bellfd >= 0 && atomic_load_explicit(&h->sleeping, memory_order_relaxed) &&
      atomic_exchange_explicit(&h->sleeping, 0, memory_order_relaxed))
    uvccl__shm_ring_bell(bellfd);
}

static void set_dirty(uvccl__shm_inbox_hdr_t *h, uint32_t s) {
  _Atomic uint64_t *w = &h->dirty[s / 64];
  uint64_t bit = (uint64_t)1 << (s % 64);
  /* Look first: the line is shared by 64 producers, a plain read keeps it
   * from bouncing while the bit is already set. */
  if (!(atomic_load_explicit(w, memory_order_relaxed) & bit))
    atomic_fetch_or_explicit(w, bit, memory_order_release);
}

void uvccl__shm_publish(uvccl__shm_out_t *o) {
  if (o->tail == o->published) return;
  atomic_store_explicit(&o->ring->tail, o->tail, memory_order_release);
  o->published = o->tail;
  /* The tail must be visible before the bit is looked at: a bit seen set
   * may be taken by the consumer the next instant, and it must then find
   * this tail (else the bit is gone and the bytes unread). */
  atomic_thread_fence(memory_order_seq_cst);
  set_dirty(o->peer, o->slot);
  atomic_thread_fence(memory_order_seq_cst);
  wake(o->peer, o->bellfd);
}

void uvccl__shm_nudge(uvccl__shm_out_t *o) {
  /* What the consumer is to find (the caller's stores) before the bit. */
  atomic_thread_fence(memory_order_seq_cst);
  set_dirty(o->peer, o->slot);
  atomic_thread_fence(memory_order_seq_cst);
  wake(o->peer, o->bellfd);
}

int uvccl__shm_cma_read(uint32_t pid, void *dst, uint64_t remote, size_t n) {
  struct iovec l, r;
  ssize_t got;
  l.iov_base = dst;
  l.iov_len = n;
  r.iov_base = (void *)(uintptr_t)remote;
  r.iov_len = n;
  do
    got = process_vm_readv((pid_t)pid, &l, 1, &r, 1, 0);
  while (got < 0 && errno == EINTR);
  if (got < 0) return -errno;
  /* Short only when the range runs into unmapped memory. */
  return (size_t)got == n ? 0 : -EFAULT;
}

int uvccl__shm_cma_probe(uint32_t pid, uint64_t addr, uint64_t expect) {
  uint64_t v = 0;
  if (pid == 0 || addr == 0) return 0;
  return uvccl__shm_cma_read(pid, &v, addr, sizeof(v)) == 0 && v == expect;
}

/* The two copies are timed side by side in each round (1 MiB, one
 * process_vm_readv, in cache as the rings' copies mostly are), and the
 * round whose ratio is the median gives the figures. A ratio of two times taken a moment apart
 * drifts little when the host is busy (with more ranks than CPUs, every
 * rank measures at once), and a round where a preemption landed in one
 * of the two falls to either end of the order. The best of a few rounds
 * of each copy taken separately once caught every memcpy round slowed and
 * not every process_vm_readv, made single copy look nearly as fast as
 * memcpy, and turned it on in a job where it slowed every large
 * collective (bench/notes/shm-history.md). */
#define CMA_SPEED_BYTES (1u << 20)
#define CMA_SPEED_ROUNDS 11

int uvccl__shm_cma_speed(double *cma_gbps, double *memcpy_gbps) {
  size_t n = CMA_SPEED_BYTES, off;
  uint64_t cma_ns[CMA_SPEED_ROUNDS], cpy_ns[CMA_SPEED_ROUNDS], t0;
  double ratio[CMA_SPEED_ROUNDS];
  int order[CMA_SPEED_ROUNDS];
  pid_t self = getpid();
  int i, j, rc = 0, mid;
  char *src = mmap(NULL, 2 * n, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), *dst;
  if (src == MAP_FAILED) return -errno;
  dst = src + n;
  memset(src, 0x5a, n); /* both touched: no page fault is timed */
  memset(dst, 0, n);
  for (i = 0; i < CMA_SPEED_ROUNDS && rc == 0; i++) {
    t0 = uvccl__now_ns();
    memcpy(dst, src, n);
    cpy_ns[i] = uvccl__now_ns() - t0 + 1;
    t0 = uvccl__now_ns();
    /* in the receiver's steps (shm.c's CMA_STEP) */
    for (off = 0; off < n && rc == 0; off += 1u << 20)
      rc = uvccl__shm_cma_read((uint32_t)self, dst + off,
                               (uint64_t)(uintptr_t)(src + off), 1u << 20);
    cma_ns[i] = uvccl__now_ns() - t0 + 1;
    ratio[i] = (double)cpy_ns[i] / (double)cma_ns[i];
    /* insertion into the order by ratio */
    for (j = i; j > 0 && ratio[order[j - 1]] > ratio[i]; j--)
      order[j] = order[j - 1];
    order[j] = i;
  }
  if (rc == 0 && dst[n - 1] != 0x5a) rc = -EIO;
  munmap(src, 2 * n);
  if (rc != 0) return rc;
  mid = order[CMA_SPEED_ROUNDS / 2];
  *cma_gbps = (double)n / (double)cma_ns[mid];
  *memcpy_gbps = (double)n / (double)cpy_ns[mid];
  return 0;
}

uint64_t uvccl__shm_take_dirty(uvccl__shm_inbox_t *ib, uint32_t w) {
  if (atomic_load_explicit(&ib->hdr->dirty[w], memory_order_relaxed) == 0)
    return 0;
  return atomic_exchange_explicit(&ib->hdr->dirty[w], 0,
                                  memory_order_seq_cst);
}

void uvccl__shm_mark_dirty(uvccl__shm_inbox_t *ib, uint32_t s) {
  set_dirty(ib->hdr, s);
}

int uvccl__shm_any_dirty(uvccl__shm_inbox_t *ib) {
  uint32_t w, n = (ib->nslots + 63) / 64;
  for (w = 0; w < n; w++)
    if (atomic_load_explicit(&ib->hdr->dirty[w], memory_order_relaxed))
      return 1;
  return 0;
}

int uvccl__shm_want_space(uvccl__shm_out_t *o) {
  atomic_store_explicit(&o->ring->want_space, 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
  return uvccl__shm_space(o) > 0;
}

/* ---- consumer -------------------------------------------------------------- */

int64_t uvccl__shm_avail(uvccl__shm_in_t *in) {
  uint64_t tail = atomic_load_explicit(&in->ring->tail, memory_order_acquire);
  uint64_t n = tail - in->head;
  if (tail < in->head || n > in->size) return -1;
  return (int64_t)n;
}

int uvccl__shm_nonempty(const uvccl__shm_in_t *in) {
  return atomic_load_explicit(&in->ring->tail, memory_order_relaxed) !=
         in->head;
}

const char *uvccl__shm_peek(const uvccl__shm_in_t *in, uint64_t avail,
                            size_t *contig) {
  uint64_t off = in->head % in->size;
  uint64_t n = in->size - off;
  *contig = (size_t)(avail < n ? avail : n);
  return in->data + off;
}

void uvccl__shm_copy_out(const uvccl__shm_in_t *in, void *dst, size_t n) {
  uint64_t off = in->head % in->size;
  size_t first = n < in->size - off ? n : (size_t)(in->size - off);
  memcpy(dst, in->data + off, first);
  if (n > first) memcpy((char *)dst + first, in->data, n - first);
}

void uvccl__shm_consume(uvccl__shm_in_t *in, size_t n) { in->head += n; }

void uvccl__shm_release(uvccl__shm_in_t *in, uvccl__shm_out_t *back) {
  atomic_store_explicit(&in->ring->head, in->head, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&in->ring->want_space, memory_order_relaxed) &&
      atomic_exchange_explicit(&in->ring->want_space, 0,
                               memory_order_relaxed) &&
      back != NULL && back->peer != NULL)
    /* The producer sleeps (or is about to): its inbox's flag says. Its
     * prepare step looks at its blocked sends after setting the flag. */
    wake(back->peer, back->bellfd);
}

/* ---- boxes ------------------------------------------------------------------ */

void uvccl__shm_set_boxes_ok(uvccl__shm_inbox_t *ib, int ok) {
  atomic_store_explicit(&ib->hdr->boxes_ok, ok ? 1u : 0u,
                        memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
}

void uvccl__shm_set_big(uvccl__shm_inbox_t *ib, int big) {
  atomic_store_explicit(&ib->hdr->big, big ? 1u : 0u, memory_order_relaxed);
}

int uvccl__shm_big(const uvccl__shm_inbox_hdr_t *h) {
  return atomic_load_explicit(&((uvccl__shm_inbox_hdr_t *)h)->big,
                              memory_order_relaxed) != 0;
}

int uvccl__shm_boxes_ok(const uvccl__shm_inbox_hdr_t *h) {
  return atomic_load_explicit(&((uvccl__shm_inbox_hdr_t *)h)->boxes_ok,
                              memory_order_acquire) == 1;
}

static uvccl__shm_box_t *box_at(uvccl__shm_ring_hdr_t *ring, uint64_t t) {
  return (uvccl__shm_box_t *)((char *)ring + UVCCL__SHM_BOX_OFF +
                              (t & 1) * UVCCL__SHM_BOX_STRIDE);
}

/* The bytes, then the number that says they are there; a sleeping
 * consumer is woken as publish does (no dirty bit: a consumer with a box
 * to wait for looks at its boxes on every turn). */
void uvccl__shm_box_put(uvccl__shm_out_t *o, uint64_t t, uint64_t desc,
                        const void *src, size_t n) {
  uvccl__shm_box_t *b = box_at(o->ring, t);
  b->desc = desc;
  if (n > 0) memcpy(b->data, src, n);
  atomic_store_explicit(&b->seq, t + 1, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  wake(o->peer, o->bellfd);
}

/* 1: part t is there (data points at it), 0: not yet, -1: the box holds
 * a number its producer cannot have written yet (it would need our part
 * of t first): the memory is not what the protocol wrote. */
int uvccl__shm_box_get(const uvccl__shm_in_t *in, uint64_t t,
                       const char **data, uint64_t *desc) {
  uvccl__shm_box_t *b = box_at(in->ring, t);
  uint64_t seq = atomic_load_explicit(&b->seq, memory_order_acquire);
  if (seq == t + 1) {
    *data = b->data;
    *desc = b->desc;
    return 1;
  }
  if (seq > t + 1) return -1;
  return 0;
}
