/* The monitor's link frames, parsed with no I/O (the links' reading and
 * writing are link.c's and live.c's): a 16-byte header (kind, payload
 * length, three words) and at most 512 payload bytes, little-endian like
 * the mesh's frames. Fuzzed by fuzz/frame_fuzz.c, pinned by
 * t/2009-coll-frames.c. */
#ifndef UVCCL_CPU_LIVE_LINK_FRAME_H
#define UVCCL_CPU_LIVE_LINK_FRAME_H

#include "cpu/live/event.h"

#include <stddef.h>
#include <stdint.h>

enum {
  LF_HELLO = 1, /* a = from, b = to, c = world; payload: u64 target nonce */
  LF_ACK,
  LF_HB,
  LF_BYE,
  LF_DEAD,      /* payload: wire_fail_t */
  LF_NOTICE,    /* payload: wire_notice_t */
  /* Worlds with a secret (auth.h): HELLO's payload is followed by the
   * dialer's nonce; CHALLENGE (the listener's nonce and MAC) and PROOF
   * (the dialer's MAC) come before ACK, and the listener acts on the
   * hello only once it is proven. */
  LF_CHALLENGE,
  LF_PROOF
};

#define LF_HDR 16
#define LF_MAX_PAYLOAD 512
#define LINK_MAGIC 0x4b4e4c55u     /* "ULNK", in HELLO's payload */

typedef struct {
  uint8_t kind;
  uint8_t pad;
  uint16_t len;
  uint32_t a, b, c;
} lf_hdr_t;

typedef struct {
  int32_t rank, origin, cause, err;
  char detail[UVCCL__DETAIL_LEN];
} wire_fail_t;

typedef struct {
  int32_t what, rank, origin, cause, err;
  uint32_t gid;
  char detail[UVCCL__DETAIL_LEN];
} wire_notice_t;

typedef struct {
  uint32_t magic;
  uint32_t pad;
  uint64_t nonce;
} wire_hello_t;

/* Lays out a frame in buf (LF_HDR + LF_MAX_PAYLOAD bytes; a payload over
 * LF_MAX_PAYLOAD is cut there); its length. */
size_t uvccl__lframe_build(unsigned char *buf, int kind, uint32_t a,
                           uint32_t b, uint32_t c, const void *payload,
                           size_t plen);

/* The frame at b, avail bytes in: 1 when it is whole (*h its header, its
 * size LF_HDR + h->len), 0 when more bytes are needed, -1 when it is not a
 * link frame (a payload over LF_MAX_PAYLOAD). */
int uvccl__lframe_next(const unsigned char *b, size_t avail, lf_hdr_t *h);

/* A HELLO's payload, want bytes expected (a nonce follows where the world
 * has a secret): 0 and *hw; -1 for another size, -2 for another magic. */
int uvccl__lframe_hello(const lf_hdr_t *h, const unsigned char *p,
                        size_t want, wire_hello_t *hw);

/* A failure's record on the wire and back; the detail is NUL-terminated
 * both ways. uvccl__lframe_dead: 0 and *f (heard through rank via), -1
 * when the payload is not a record. */
void uvccl__lframe_fail_put(wire_fail_t *w, const uvccl__fail_t *f);
int uvccl__lframe_dead(const lf_hdr_t *h, const unsigned char *p, int via,
                       uvccl__fail_t *f);

/* A NOTICE's payload: 0 and *w (detail NUL-terminated), -1 when the
 * payload is not a notice. */
int uvccl__lframe_notice(const lf_hdr_t *h, const unsigned char *p,
                         wire_notice_t *w);

#endif
