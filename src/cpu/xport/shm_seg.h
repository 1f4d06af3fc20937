/* Shared-memory segments and rings for ranks of one host (shm_seg.c).
 * Knows nothing of frames or groups: shm.c carries the transport's frames
 * through these rings.
 *
 * Every rank owns one inbox: an anonymous memfd (no name, so nothing is
 * left in /dev/shm whatever kills the process) holding one ring per
 * sender, and a pipe, its doorbell. A peer maps its own slot of the inbox
 * and opens the doorbell through /proc/PID/fd/N: that works only for a
 * process of the same host, PID namespace and user (the access check of
 * ptrace-read), and the inbox's random cookie proves it reached the right
 * segment, so "same host" is tested by doing it, not guessed.
 *
 * A ring: one producer (the slot's rank), one consumer (the inbox's owner),
 * free-running 64-bit head and tail. The consumer sleeps in its loop's
 * epoll; the producer rings the doorbell only when the consumer's inbox
 * says it is asleep, so a busy consumer costs no system call per message.
 * Every index read from shared memory is checked before it is used: a
 * corrupted ring is an error, never a wild copy. */
#ifndef UVCCL_CPU_XPORT_SHM_SEG_H
#define UVCCL_CPU_XPORT_SHM_SEG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define UVCCL__SHM_MAGIC 0x4d485355u /* "USHM" */
#define UVCCL__SHM_PAGE 4096u

/* The inbox's first page. */
typedef struct {
  uint32_t magic;
  uint32_t nslots;
  uint64_t cookie;
  uint64_t ring_size;
  /* 1: the owner links every peer of its world through shared memory and
   * takes small collectives through boxes (shm_box.c); written
   * before creation's store barrier, read after it */
  _Atomic uint32_t boxes_ok;
  /* 1: the owner has a large collective in flight (net.c: with 3 or 4
   * ranks a CPU, a loop spins only while no rank of its host has) */
  _Atomic uint32_t big;
  char pad0[32];
  _Atomic uint32_t sleeping; /* the owner's loop is about to block */
  char pad1[60];
  /* Which rings have news: producer s sets bit s after it publishes, the
   * owner takes the words (so a loop turn looks at the rings that moved,
   * not at every ring of a large world). Fills the rest of the page. */
  _Atomic uint64_t dirty[(UVCCL__SHM_PAGE - 128) / 8];
} uvccl__shm_inbox_hdr_t;

/* The most ranks an inbox can serve (one dirty bit each). */
#define UVCCL__SHM_MAX_SLOTS ((UVCCL__SHM_PAGE - 128) / 8 * 64)

/* A slot's first page: the ring's indices, each on its own cache line. */
typedef struct {
  _Atomic uint64_t tail;       /* written by the producer */
  char pad0[56];
  _Atomic uint64_t head;       /* written by the consumer */
  char pad1[56];
  _Atomic uint32_t want_space; /* the producer waits for room */
  char pad2[60];
  /* Single copy (large frames the consumer reads straight from the
   * producer's memory, process_vm_readv): the producer's side ... */
  _Atomic uint64_t cma_revoked;  /* a transfer whose buffer was taken back */
  _Atomic uint64_t cma_redirect; /* ... and the copy to read instead */
  char pad3[48];
  /* ... and the consumer's. */
  _Atomic uint64_t cma_reading;  /* the transfer it is reading now (0: none) */
  _Atomic uint64_t cma_acked;    /* the last transfer it finished */
  char pad4[48];
} uvccl__shm_ring_hdr_t;

/* What a rank tells each peer (the FRAME_SHM payload). */
/* Boxes: in each ring slot's first page, after the ring's header, two
 * boxes where that slot's producer leaves its part of the world's small
 * collectives (number t in box t % 2): the number t + 1, what the part is
 * (shm_box.c's box_desc: kind, type, reduction, root, length; every
 * rank's must be alike), then the bytes in the same and the following
 * lines (shm_box.c). */
#define UVCCL__SHM_BOX_OFF 512u
#define UVCCL__SHM_BOX_MAX 1024u
#define UVCCL__SHM_BOX_STRIDE 1088u
typedef struct {
  _Atomic uint64_t seq;
  uint64_t desc;
  char data[UVCCL__SHM_BOX_MAX];
} uvccl__shm_box_t;
_Static_assert(sizeof(uvccl__shm_ring_hdr_t) <= UVCCL__SHM_BOX_OFF,
               "ring header overlaps the boxes");
_Static_assert(sizeof(uvccl__shm_box_t) <= UVCCL__SHM_BOX_STRIDE &&
                   UVCCL__SHM_BOX_OFF + 2 * UVCCL__SHM_BOX_STRIDE <=
                       UVCCL__SHM_PAGE,
               "boxes past the slot's first page");

enum { UVCCL__SHM_INFO = 1, UVCCL__SHM_ATTACHED = 2, UVCCL__SHM_REFUSED = 3 };
typedef struct {
  uint32_t magic;
  uint32_t kind;         /* UVCCL__SHM_* */
  uint32_t pid;          /* 0: this rank does not offer shared memory */
  int32_t memfd;
  int32_t bellfd;
  uint32_t nslots;
  uint64_t cookie;
  uint64_t ring_size;
  uint8_t boot_id[16];   /* the host: the kernel's boot id, told apart by
                            $UVCCL_HOST_ID */
  uint8_t kernel_id[16]; /* the kernel's boot id itself: the CPUs shared */
  /* Single copy. In an offer: where the cookie lies in the sender's
   * memory (0: it does not let peers read its memory); in an answer: 1
   * when the answering rank read it there (it will read large frames). */
  uint64_t cma_addr;
} uvccl__shm_info_t;

typedef struct {
  int memfd;
  int bell_r, bell_w;
  char *base;
  size_t size;
  uvccl__shm_inbox_hdr_t *hdr;
  uint64_t cookie;
  uint64_t ring_size;
  uint32_t nslots;
} uvccl__shm_inbox_t;

/* The producer's side: this rank's slot in a peer's inbox. */
typedef struct {
  char *hdr_map;            /* the peer inbox's first page */
  char *slot_map;
  size_t slot_size;
  uvccl__shm_inbox_hdr_t *peer;
  uvccl__shm_ring_hdr_t *ring;
  char *data;
  uint64_t size;
  uint64_t tail;            /* ours; published with release */
  uint64_t published;
  int bellfd;               /* the peer's doorbell */
  uint32_t slot;            /* ours (our bit in its dirty words) */
} uvccl__shm_out_t;

/* The consumer's side: one slot of this rank's inbox. */
typedef struct {
  uvccl__shm_ring_hdr_t *ring;
  const char *data;
  uint64_t size;
  uint64_t head;            /* ours; published with release */
} uvccl__shm_in_t;

/* Creates the inbox: nslots rings of ring_size bytes (a multiple of the
 * page size). 0, or an error with err filled. */
int uvccl__shm_inbox_open(uvccl__shm_inbox_t *ib, uint32_t nslots,
                          uint64_t ring_size, char *err, size_t errlen);
void uvccl__shm_inbox_close(uvccl__shm_inbox_t *ib);
void uvccl__shm_inbox_info(const uvccl__shm_inbox_t *ib, uvccl__shm_info_t *in);
/* The consumer's view of slot s. */
void uvccl__shm_inbox_slot(uvccl__shm_inbox_t *ib, uint32_t s,
                           uvccl__shm_in_t *in);
/* An info that offers nothing (shared memory off here). */
void uvccl__shm_info_none(uvccl__shm_info_t *in);
/* 1 when the info comes from this host (same boot id) and offers an inbox. */
int uvccl__shm_info_local(const uvccl__shm_info_t *in);
/* The host an offer came from, as 64 bits (0: unknown). */
uint64_t uvccl__shm_host_key(const uvccl__shm_info_t *in);
/* Its kernel, as 64 bits (0: unknown): ranks of network namespaces that
 * stand for hosts are different hosts but share one kernel's CPUs. */
uint64_t uvccl__shm_kernel_key(const uvccl__shm_info_t *in);

/* Maps slot `slot` of the inbox `peer` describes. 0, or an error with why. */
int uvccl__shm_attach(uvccl__shm_out_t *o, const uvccl__shm_info_t *peer,
                      uint32_t slot, char *why, size_t whylen);
void uvccl__shm_detach(uvccl__shm_out_t *o);

/* Producer. Room for how many bytes (-1: the consumer's index is not
 * possible: a corrupted ring). */
int64_t uvccl__shm_space(uvccl__shm_out_t *o);
/* Copies n bytes (n <= space) behind the tail, not yet visible. */
void uvccl__shm_put(uvccl__shm_out_t *o, const void *src, size_t n);
/* Makes what was put visible; rings the doorbell if the consumer sleeps. */
void uvccl__shm_publish(uvccl__shm_out_t *o);
/* The producer waits for room: flag it, then check again (1: room now). */
int uvccl__shm_want_space(uvccl__shm_out_t *o);

/* Consumer. Bytes readable (-1: a corrupted ring). */
int64_t uvccl__shm_avail(uvccl__shm_in_t *in);
/* The readable bytes at the head up to the end of the ring's memory. */
const char *uvccl__shm_peek(const uvccl__shm_in_t *in, uint64_t avail,
                            size_t *contig);
/* Copies n readable bytes out (across the end of the ring). */
void uvccl__shm_copy_out(const uvccl__shm_in_t *in, void *dst, size_t n);
void uvccl__shm_consume(uvccl__shm_in_t *in, size_t n);
/* Publishes the head; if the producer waits for room and its loop sleeps
 * (its inbox, mapped through back), rings its doorbell. */
void uvccl__shm_release(uvccl__shm_in_t *in, uvccl__shm_out_t *back);
/* 1 when the ring holds unread bytes (a cheap look, no checks). */
int uvccl__shm_nonempty(const uvccl__shm_in_t *in);

/* Producer: tells the consumer to look at this slot (no bytes: for
 * example a single-copy transfer acknowledged through the ring's header). */
void uvccl__shm_nudge(uvccl__shm_out_t *o);

void uvccl__shm_set_boxes_ok(uvccl__shm_inbox_t *ib, int ok);
int uvccl__shm_boxes_ok(const uvccl__shm_inbox_hdr_t *h);
/* The inbox's `big` flag. */
void uvccl__shm_set_big(uvccl__shm_inbox_t *ib, int big);
int uvccl__shm_big(const uvccl__shm_inbox_hdr_t *h);
void uvccl__shm_box_put(uvccl__shm_out_t *o, uint64_t t, uint64_t desc,
                        const void *src, size_t n);
int uvccl__shm_box_get(const uvccl__shm_in_t *in, uint64_t t,
                       const char **data, uint64_t *desc);

/* Single copy. Reads n bytes at `remote` in process pid into dst: 0, or a
 * negative errno (a peer's bad address is an error, never a fault here). */
int uvccl__shm_cma_read(uint32_t pid, void *dst, uint64_t remote, size_t n);
/* 1 when this process may read pid's memory: the 8 bytes at addr hold
 * `expect` (the kernel's ptrace-attach check, seccomp and Yama decide). */
int uvccl__shm_cma_probe(uint32_t pid, uint64_t addr, uint64_t expect);

/* How fast this process copies 1 MiB with process_vm_readv (reading
 * itself: the kernel pins and copies pages the same way as from a peer)
 * and with memcpy, in GB/s: the round of median ratio of 11; about
 * a millisecond.
 * 0, or a negative errno when process_vm_readv is refused. */
int uvccl__shm_cma_speed(double *cma_gbps, double *memcpy_gbps);

/* Takes dirty word w (0 when nothing moved); marks slot s dirty again. */
uint64_t uvccl__shm_take_dirty(uvccl__shm_inbox_t *ib, uint32_t w);
void uvccl__shm_mark_dirty(uvccl__shm_inbox_t *ib, uint32_t s);
/* 1 when any ring has news (a cheap look). */
int uvccl__shm_any_dirty(uvccl__shm_inbox_t *ib);

/* The owner's loop: about to block (1) or awake (0). Returns, when going
 * to sleep, nothing: callers look at their rings again afterwards. */
void uvccl__shm_set_sleeping(uvccl__shm_inbox_t *ib, int sleeping);
/* Empties the doorbell pipe. */
void uvccl__shm_bell_drain(uvccl__shm_inbox_t *ib);
void uvccl__shm_ring_bell(int fd);

#endif
