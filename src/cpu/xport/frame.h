/* The mesh's frames, parsed with no I/O (as the store's protocol is, in
 * store/proto.c): the wire format, the header's encoding, what a header
 * means on a connection in a given state, and the hello's payload. The
 * transport (rx.c) reads bytes and acts on the verdicts; fuzzed by
 * fuzz/frame_fuzz.c, pinned by t/2009-coll-frames.c.
 *
 * Every frame: a 24-byte header, then len payload bytes. Little-endian
 * (all supported hosts are; checked at compile time in frame.c). */
#ifndef UVCCL_CPU_XPORT_FRAME_H
#define UVCCL_CPU_XPORT_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
  FRAME_HELLO = 1,     /* connector -> acceptor: hello_t payload */
  FRAME_HELLO_ACK = 2, /* acceptor -> connector: empty */
  FRAME_COLL = 3,      /* collective data: (gid, seq, tag) */
  FRAME_P2P = 4,       /* point to point: (gid, tag = user tag) */
  FRAME_BYE = 5,       /* the sender is leaving cleanly (destroy) */
  FRAME_REJECT = 6,    /* acceptor -> connector: refused; payload: why */
  FRAME_AGREE = 7,     /* shrink's agreement (gid = the group shrunk,
                          seq = its epoch); payload: agree_msg_t */
  /* Worlds with a secret (auth.h): HELLO carries the connector's nonce
   * after hello_t; the acceptor answers CHALLENGE (its nonce, its MAC),
   * the connector PROOF (its MAC); then HELLO_ACK as without. */
  FRAME_CHALLENGE = 8,
  FRAME_PROOF = 9,
  /* Ranks of one host (shm.c): each tells the other where its inbox is
   * (uvccl__shm_info_t), then whether it attached to the other's. */
  FRAME_SHM = 10,
  /* Lazy connections (worlds above UVCCL_MESH_MAX): two ranks dialed each
   * other at once; the lower one's connection is refused with this and
   * it waits for the higher one's (see uvccl__net_peer_takeover). */
  FRAME_CROSSED = 11
};

#define UVCCL__FRAME_HDR 24
/* frame_hdr_t.flags: the payload is not in the ring: a descriptor (its
 * address in the sender and the transfer's number, 8 bytes each) follows
 * the header, and the receiver reads the payload from the sender's
 * memory (shared memory only; see shm.c). */
#define UVCCL__FRAME_F_CMA 0x01
#define UVCCL__CMA_DESC 16
#define UVCCL__HELLO_MAGIC 0x4c435655u /* "UVCL" */
/* 2: the shared-memory offer (FRAME_SHM) grew its single-copy address,
 * and frames may carry UVCCL__FRAME_F_CMA. */
#define UVCCL__WIRE_VERSION 2
/* A REJECT's reason is read up to this many bytes before it is whole. */
#define UVCCL__REJECT_WAIT 4096

typedef struct {
  uint8_t kind;
  uint8_t flags;
  uint16_t piece;      /* a data frame cut across a rank's connections
                          (stripe.c): which piece, from 1; 0: whole */
  uint32_t gid;
  uint32_t seq;
  uint32_t tag;
  uint64_t len;
} frame_hdr_t;

typedef struct {
  uint32_t magic;
  uint32_t version;
  uint32_t from;       /* sender's world rank */
  uint32_t to;         /* the rank it believes it reached */
  uint64_t to_nonce;   /* the listener id the target published */
  uint32_t world;
  uint32_t lanes;      /* striped TCP (stripe.c): bits 0-7, the lane this
                          connection is (0: the rank's first); bits 8-15,
                          the dialer's stripes (0, from a peer that
                          predates them: 1) */
  char addr[64];       /* the sender's advertised "host:port" */
} hello_t;

static inline uint32_t uvccl__hello_lanes(int lane, int stripes) {
  return (uint32_t)lane | (uint32_t)stripes << 8;
}
static inline int uvccl__hello_lane(const hello_t *h) {
  return (int)(h->lanes & 0xff);
}
static inline int uvccl__hello_stripes(const hello_t *h) {
  int n = (int)(h->lanes >> 8 & 0xff);
  return n ? n : 1;
}

/* The header's bytes (every frame's: inline). */
static inline void uvccl__frame_encode(unsigned char *b,
                                       const frame_hdr_t *h) {
  memcpy(b, h, UVCCL__FRAME_HDR);
}
static inline void uvccl__frame_decode(frame_hdr_t *h,
                                       const unsigned char *b) {
  memcpy(h, b, UVCCL__FRAME_HDR);
}

/* Where a connection stands: what a frame may be on it. */
typedef struct {
  int up;           /* the handshake is over (else it is under way) */
  int outgoing;     /* this side dialed */
  int sparse;       /* a world of lazy connections */
  int creating;     /* the group's creation waits on the mesh */
  int world;        /* ranks in the world */
  size_t shm_info;  /* a FRAME_SHM's payload: sizeof(uvccl__shm_info_t) */
} frame_ctx_t;

/* What a header asks of the receiver. */
typedef enum {
  UVCCL__FRAME_BAD = 0,     /* a protocol violation: *why says which */
  UVCCL__FRAME_HANDSHAKE,   /* HELLO, HELLO_ACK, CHALLENGE, PROOF */
  UVCCL__FRAME_REJECTED,    /* the peer refused us: REJECT */
  UVCCL__FRAME_CROSSED,     /* two dials crossed: CROSSED */
  UVCCL__FRAME_AGREE,       /* shrink's agreement */
  UVCCL__FRAME_SHM_OFFER,   /* a shared-memory offer */
  UVCCL__FRAME_LEAVING,     /* BYE */
  UVCCL__FRAME_DATA         /* COLL or P2P: the receive path takes it */
} frame_verdict_t;

/* The verdict on header h on a connection in ctx. *need: the payload bytes
 * that must be in before the frame is acted on (a data frame's payload is
 * streamed: 0); *why: the reason of a BAD verdict (static text). */
frame_verdict_t uvccl__frame_classify(const frame_hdr_t *h,
                                      const frame_ctx_t *ctx, uint64_t *need,
                                      const char **why);

/* A HELLO's payload. */
typedef enum {
  UVCCL__HELLO_OK = 0,
  UVCCL__HELLO_BAD_SIZE,     /* neither a hello nor a hello and a nonce */
  UVCCL__HELLO_BAD_MAGIC,    /* not a uvccl peer */
  UVCCL__HELLO_BAD_VERSION   /* another wire version: *out says which */
} hello_verdict_t;

/* Reads the payload of a HELLO of h->len bytes into *out (its address
 * always NUL-terminated); *offered: 1 when a nonce follows (the connector
 * holds a secret), and then *nonce points at it. */
hello_verdict_t uvccl__frame_hello_parse(const frame_hdr_t *h,
                                         const unsigned char *payload,
                                         hello_t *out, int *offered,
                                         const unsigned char **nonce);

/* A REJECT's reason: the first bytes of its payload (avail of them in),
 * cut to outlen - 1 and NUL-terminated. */
void uvccl__frame_reject_text(const frame_hdr_t *h,
                              const unsigned char *payload, size_t avail,
                              char *out, size_t outlen);

#endif
