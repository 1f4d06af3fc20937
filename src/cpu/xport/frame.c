/* The mesh's frames with no I/O: see frame.h. */
#include "frame.h"
#include "store/auth.h"

#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "uvccl's frame format assumes a little-endian host"
#endif

static int is_handshake(uint8_t kind) {
  return kind == FRAME_HELLO || kind == FRAME_HELLO_ACK ||
         kind == FRAME_CHALLENGE || kind == FRAME_PROOF;
}

frame_verdict_t uvccl__frame_classify(const frame_hdr_t *h,
                                      const frame_ctx_t *ctx, uint64_t *need,
                                      const char **why) {
  *need = 0;
  *why = NULL;
  /* The handshake's frames are whole before they are read, in any state
   * (what each may be then is the handshake's business: rx.c). */
  if (is_handshake(h->kind)) {
    if (h->len > sizeof(hello_t) + UVCCL__AUTH_NONCE) {
      *why = "oversized hello";
      return UVCCL__FRAME_BAD;
    }
    *need = h->len;
    return UVCCL__FRAME_HANDSHAKE;
  }
  /* A refusal answers our dial, or ends a creation under way. A long
   * reason is not waited for: its first bytes say enough. */
  if (h->kind == FRAME_REJECT &&
      ((ctx->outgoing && !ctx->up) || (ctx->up && ctx->creating))) {
    *need = h->len < UVCCL__REJECT_WAIT ? h->len : 0;
    return UVCCL__FRAME_REJECTED;
  }
  if (h->kind == FRAME_CROSSED && ctx->outgoing && !ctx->up &&
      ctx->sparse && h->len == 0)
    return UVCCL__FRAME_CROSSED;
  if (h->kind == FRAME_AGREE && ctx->up) {
    if (h->len > 8 + 2 * (uint64_t)(ctx->world > 0 ? ctx->world : 0)) {
      *why = "oversized agree frame";
      return UVCCL__FRAME_BAD;
    }
    *need = h->len;
    return UVCCL__FRAME_AGREE;
  }
  if (h->kind == FRAME_SHM && ctx->up) {
    if (h->len != ctx->shm_info) {
      *why = "bad shared-memory frame";
      return UVCCL__FRAME_BAD;
    }
    *need = h->len;
    return UVCCL__FRAME_SHM_OFFER;
  }
  if (h->kind == FRAME_BYE && ctx->up && h->len == 0)
    return UVCCL__FRAME_LEAVING;
  if (!ctx->up || (h->kind != FRAME_COLL && h->kind != FRAME_P2P)) {
    *why = "bad frame (garbage, or not a uvccl peer)";
    return UVCCL__FRAME_BAD;
  }
  return UVCCL__FRAME_DATA;
}

hello_verdict_t uvccl__frame_hello_parse(const frame_hdr_t *h,
                                         const unsigned char *payload,
                                         hello_t *out, int *offered,
                                         const unsigned char **nonce) {
  *offered = h->len == sizeof(*out) + UVCCL__AUTH_NONCE;
  *nonce = NULL;
  memset(out, 0, sizeof(*out));
  if (h->len != sizeof(*out) && !*offered) return UVCCL__HELLO_BAD_SIZE;
  memcpy(out, payload, sizeof(*out));
  out->addr[sizeof(out->addr) - 1] = '\0';
  if (*offered) *nonce = payload + sizeof(*out);
  if (out->magic != UVCCL__HELLO_MAGIC) return UVCCL__HELLO_BAD_MAGIC;
  if (out->version != UVCCL__WIRE_VERSION) return UVCCL__HELLO_BAD_VERSION;
  return UVCCL__HELLO_OK;
}

void uvccl__frame_reject_text(const frame_hdr_t *h,
                              const unsigned char *payload, size_t avail,
                              char *out, size_t outlen) {
  size_t n;
  if (outlen == 0) return;
  n = h->len < avail ? (size_t)h->len : avail;
  if (n > outlen - 1) n = outlen - 1;
  memcpy(out, payload, n);
  out[n] = '\0';
}
