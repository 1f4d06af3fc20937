/* libFuzzer target: the transport's frames (src/cpu/xport/frame.c) and the
 * monitor's link frames (src/cpu/live/link_frame.c), read back to back as
 * the connections read them. The first byte picks the connection's state;
 * the rest is what a peer sent. Whatever it is, nothing reads past the
 * bytes in, every refusal has a reason, and every text comes back
 * NUL-terminated. */
#include "cpu/internal.h"
#include "cpu/live/link_frame.h"

#include <stdint.h>
#include <string.h>

static void check(int cond) {
  if (!cond) __builtin_trap();
}

static void mesh(const uint8_t *data, size_t size, uint8_t state) {
  frame_ctx_t ctx;
  size_t pos = 0;
  ctx.up = state & 1;
  ctx.outgoing = (state >> 1) & 1;
  ctx.sparse = (state >> 2) & 1;
  ctx.creating = (state >> 3) & 1;
  ctx.world = 1 + (state >> 4) * 64;
  ctx.shm_info = sizeof(uvccl__shm_info_t);
  while (size - pos >= UVCCL__FRAME_HDR) {
    frame_hdr_t h;
    uint64_t need;
    const char *why;
    const uint8_t *payload = data + pos + UVCCL__FRAME_HDR;
    size_t avail = size - pos - UVCCL__FRAME_HDR;
    frame_verdict_t v;
    uvccl__frame_decode(&h, data + pos);
    v = uvccl__frame_classify(&h, &ctx, &need, &why);
    if (v == UVCCL__FRAME_BAD) {
      check(why != NULL && *why != '\0');
      return;
    }
    check(why == NULL && need <= h.len);
    if (avail < need) return;
    if (v == UVCCL__FRAME_HANDSHAKE) {
      hello_t hello;
      const unsigned char *nonce;
      int offered;
      hello_verdict_t hv =
          uvccl__frame_hello_parse(&h, payload, &hello, &offered, &nonce);
      check(memchr(hello.addr, '\0', sizeof(hello.addr)) != NULL);
      check(!offered || hv == UVCCL__HELLO_BAD_SIZE ||
            nonce == payload + sizeof(hello));
    } else if (v == UVCCL__FRAME_REJECTED) {
      char text[256];
      uvccl__frame_reject_text(&h, payload, avail, text, sizeof(text));
      check(strlen(text) < sizeof(text) && strlen(text) <= avail);
    }
    /* a data frame's payload streams: skip what of it is in */
    pos += UVCCL__FRAME_HDR +
           (v == UVCCL__FRAME_DATA ? (h.len < avail ? (size_t)h.len : avail)
                                   : (size_t)need);
  }
}

static void links(const uint8_t *data, size_t size) {
  size_t pos = 0;
  for (;;) {
    lf_hdr_t h;
    const uint8_t *p;
    int whole = uvccl__lframe_next(data + pos, size - pos, &h);
    if (whole <= 0) return;
    p = data + pos + LF_HDR;
    if (h.kind == LF_HELLO) {
      wire_hello_t hw;
      uvccl__lframe_hello(&h, p, sizeof(hw), &hw);
      uvccl__lframe_hello(&h, p, sizeof(hw) + UVCCL__AUTH_NONCE, &hw);
    } else if (h.kind == LF_DEAD) {
      uvccl__fail_t f;
      if (uvccl__lframe_dead(&h, p, 1, &f) == 0)
        check(memchr(f.detail, '\0', sizeof(f.detail)) != NULL);
    } else if (h.kind == LF_NOTICE) {
      wire_notice_t w;
      if (uvccl__lframe_notice(&h, p, &w) == 0)
        check(memchr(w.detail, '\0', sizeof(w.detail)) != NULL);
    }
    pos += LF_HDR + h.len;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  unsigned char buf[LF_HDR + LF_MAX_PAYLOAD];
  lf_hdr_t h;
  size_t n;
  if (size < 1) return 0;
  mesh(data + 1, size - 1, data[0]);
  links(data + 1, size - 1);
  /* what is built reads back the same */
  n = uvccl__lframe_build(buf, data[0], 1, 2, 3, data + 1, size - 1);
  check(uvccl__lframe_next(buf, n, &h) == 1 && h.kind == data[0] &&
        LF_HDR + (size_t)h.len == n);
  return 0;
}
