/* The monitor's link frames with no I/O: see link_frame.h. */
#include "link_frame.h"

#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "uvccl's link frame format assumes a little-endian host"
#endif

size_t uvccl__lframe_build(unsigned char *buf, int kind, uint32_t a,
                           uint32_t b, uint32_t c, const void *payload,
                           size_t plen) {
  lf_hdr_t h;
  if (plen > LF_MAX_PAYLOAD) plen = LF_MAX_PAYLOAD;
  memset(&h, 0, sizeof(h));
  h.kind = (uint8_t)kind;
  h.len = (uint16_t)plen;
  h.a = a;
  h.b = b;
  h.c = c;
  memcpy(buf, &h, LF_HDR);
  if (plen) memcpy(buf + LF_HDR, payload, plen);
  return LF_HDR + plen;
}

int uvccl__lframe_next(const unsigned char *b, size_t avail, lf_hdr_t *h) {
  if (avail < LF_HDR) return 0;
  memcpy(h, b, LF_HDR);
  if (h->len > LF_MAX_PAYLOAD) return -1;
  return avail - LF_HDR >= (size_t)h->len;
}

int uvccl__lframe_hello(const lf_hdr_t *h, const unsigned char *p,
                        size_t want, wire_hello_t *hw) {
  memset(hw, 0, sizeof(*hw));
  if (h->len != want || want < sizeof(*hw)) return -1;
  memcpy(hw, p, sizeof(*hw));
  return hw->magic == LINK_MAGIC ? 0 : -2;
}

void uvccl__lframe_fail_put(wire_fail_t *w, const uvccl__fail_t *f) {
  memset(w, 0, sizeof(*w));
  w->rank = f->rank;
  w->origin = f->origin;
  w->cause = f->cause;
  w->err = f->err;
  memcpy(w->detail, f->detail, sizeof(w->detail));
  w->detail[sizeof(w->detail) - 1] = '\0';
}

int uvccl__lframe_dead(const lf_hdr_t *h, const unsigned char *p, int via,
                       uvccl__fail_t *f) {
  wire_fail_t w;
  if (h->len != sizeof(w)) return -1;
  memcpy(&w, p, sizeof(w));
  w.detail[sizeof(w.detail) - 1] = '\0';
  memset(f, 0, sizeof(*f));
  f->rank = w.rank;
  f->origin = w.origin;
  f->via = via;
  f->cause = w.cause;
  f->err = w.err;
  memcpy(f->detail, w.detail, sizeof(f->detail));
  return 0;
}

int uvccl__lframe_notice(const lf_hdr_t *h, const unsigned char *p,
                         wire_notice_t *w) {
  if (h->len != sizeof(*w)) return -1;
  memcpy(w, p, sizeof(*w));
  w->detail[sizeof(w->detail) - 1] = '\0';
  return 0;
}
