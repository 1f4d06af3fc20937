/* The transport's frames with no I/O (src/cpu/xport/frame.c) and the
 * monitor's link frames (src/cpu/live/link_frame.c): headers round trip;
 * what each kind of mesh frame is on a connection in each state (the
 * verdict, the payload waited for, the reason of a refusal); the hello's
 * payload (sizes, magic, version, the nonce, an address with no NUL); a
 * REJECT's reason cut to its buffer; link frames whole, partial and
 * oversized; failures and notices on the wire and back, their details
 * always NUL-terminated. The same functions are fuzzed (make fuzz). */
#include "tap.h"
#include "cpu/internal.h"
#include "cpu/live/link_frame.h"

static frame_ctx_t ctx(int up, int outgoing, int sparse, int creating) {
  frame_ctx_t c;
  c.up = up;
  c.outgoing = outgoing;
  c.sparse = sparse;
  c.creating = creating;
  c.world = 4;
  c.shm_info = sizeof(uvccl__shm_info_t);
  return c;
}

static void verdict(uint8_t kind, uint64_t len, frame_ctx_t c,
                    frame_verdict_t want, uint64_t want_need,
                    const char *want_why, const char *what) {
  frame_hdr_t h;
  uint64_t need = 99;
  const char *why = "x";
  frame_verdict_t v;
  memset(&h, 0, sizeof(h));
  h.kind = kind;
  h.len = len;
  v = uvccl__frame_classify(&h, &c, &need, &why);
  ok(v == want && need == want_need &&
         (want_why == NULL ? why == NULL
                           : why != NULL && strcmp(why, want_why) == 0),
     "%s: verdict %d (want %d), need %llu (want %llu), why '%s'", what,
     (int)v, (int)want, (unsigned long long)need,
     (unsigned long long)want_need, why ? why : "(none)");
}

static void test_header(void) {
  frame_hdr_t h, back;
  unsigned char b[UVCCL__FRAME_HDR];
  memset(&h, 0, sizeof(h));
  h.kind = FRAME_COLL;
  h.flags = UVCCL__FRAME_F_CMA;
  h.gid = 0x01020304u;
  h.seq = 77;
  h.tag = 0xfffffffeu;
  h.len = (uint64_t)1 << 40;
  uvccl__frame_encode(b, &h);
  uvccl__frame_decode(&back, b);
  ok(back.kind == FRAME_COLL && back.flags == UVCCL__FRAME_F_CMA &&
         back.gid == 0x01020304u && back.seq == 77 &&
         back.tag == 0xfffffffeu && back.len == (uint64_t)1 << 40,
     "a header round trips (kind, flags, gid, seq, tag, a 2^40 length)");
  ok(b[0] == FRAME_COLL && b[4] == 0x04 && b[16] == 0 && b[21] == 1,
     "little-endian on the wire: kind first, gid's low byte at 4, len at 16");
}

static void test_classify(void) {
  const char *bad = "bad frame (garbage, or not a uvccl peer)";
  size_t hello = sizeof(hello_t);
  size_t shm = sizeof(uvccl__shm_info_t);
  verdict(FRAME_HELLO, hello, ctx(0, 0, 0, 1), UVCCL__FRAME_HANDSHAKE,
          hello, NULL, "HELLO on an incoming connection");
  verdict(FRAME_HELLO, hello + UVCCL__AUTH_NONCE, ctx(0, 0, 0, 1),
          UVCCL__FRAME_HANDSHAKE, hello + UVCCL__AUTH_NONCE, NULL,
          "HELLO with a nonce");
  verdict(FRAME_HELLO, hello + UVCCL__AUTH_NONCE + 1, ctx(0, 0, 0, 1),
          UVCCL__FRAME_BAD, 0, "oversized hello", "HELLO a byte too long");
  verdict(FRAME_PROOF, (uint64_t)1 << 62, ctx(1, 0, 0, 0), UVCCL__FRAME_BAD,
          0, "oversized hello", "a 2^62-byte PROOF");
  verdict(FRAME_HELLO_ACK, 0, ctx(0, 1, 0, 1), UVCCL__FRAME_HANDSHAKE, 0,
          NULL, "HELLO_ACK");
  verdict(FRAME_REJECT, 10, ctx(0, 1, 0, 1), UVCCL__FRAME_REJECTED, 10, NULL,
          "REJECT answering our dial");
  verdict(FRAME_REJECT, UVCCL__REJECT_WAIT, ctx(0, 1, 0, 1),
          UVCCL__FRAME_REJECTED, 0, NULL,
          "a long REJECT is not waited for");
  verdict(FRAME_REJECT, 10, ctx(1, 0, 0, 1), UVCCL__FRAME_REJECTED, 10, NULL,
          "REJECT during creation");
  verdict(FRAME_REJECT, 10, ctx(1, 1, 0, 0), UVCCL__FRAME_BAD, 0, bad,
          "REJECT after creation");
  verdict(FRAME_REJECT, 10, ctx(0, 0, 0, 1), UVCCL__FRAME_BAD, 0, bad,
          "REJECT on an incoming connection");
  verdict(FRAME_CROSSED, 0, ctx(0, 1, 1, 1), UVCCL__FRAME_CROSSED, 0, NULL,
          "CROSSED on a sparse dial");
  verdict(FRAME_CROSSED, 0, ctx(0, 1, 0, 1), UVCCL__FRAME_BAD, 0, bad,
          "CROSSED in a full mesh");
  verdict(FRAME_CROSSED, 1, ctx(0, 1, 1, 1), UVCCL__FRAME_BAD, 0, bad,
          "CROSSED with a payload");
  verdict(FRAME_AGREE, 8 + 2 * 4, ctx(1, 0, 0, 0), UVCCL__FRAME_AGREE,
          8 + 2 * 4, NULL, "AGREE of a world of 4");
  verdict(FRAME_AGREE, 8 + 2 * 4 + 1, ctx(1, 0, 0, 0), UVCCL__FRAME_BAD, 0,
          "oversized agree frame", "AGREE too long for a world of 4");
  verdict(FRAME_AGREE, 0, ctx(0, 1, 0, 1), UVCCL__FRAME_BAD, 0, bad,
          "AGREE before the handshake");
  verdict(FRAME_SHM, shm, ctx(1, 0, 0, 1), UVCCL__FRAME_SHM_OFFER, shm, NULL,
          "a shared-memory offer");
  verdict(FRAME_SHM, shm - 1, ctx(1, 0, 0, 1), UVCCL__FRAME_BAD, 0,
          "bad shared-memory frame", "a short shared-memory offer");
  verdict(FRAME_BYE, 0, ctx(1, 1, 0, 0), UVCCL__FRAME_LEAVING, 0, NULL, "BYE");
  verdict(FRAME_BYE, 3, ctx(1, 1, 0, 0), UVCCL__FRAME_BAD, 0, bad,
          "BYE with a payload");
  verdict(FRAME_COLL, (uint64_t)1 << 40, ctx(1, 0, 0, 0), UVCCL__FRAME_DATA,
          0, NULL, "COLL data is streamed (nothing waited for)");
  verdict(FRAME_P2P, 5, ctx(1, 1, 0, 0), UVCCL__FRAME_DATA, 0, NULL, "P2P");
  verdict(FRAME_COLL, 5, ctx(0, 1, 0, 1), UVCCL__FRAME_BAD, 0, bad,
          "data before the handshake");
  verdict(0, 0, ctx(1, 1, 0, 0), UVCCL__FRAME_BAD, 0, bad, "kind 0");
  verdict(200, 0, ctx(1, 1, 0, 0), UVCCL__FRAME_BAD, 0, bad, "kind 200");
}

static void test_hello(void) {
  unsigned char buf[sizeof(hello_t) + UVCCL__AUTH_NONCE];
  hello_t in, out;
  frame_hdr_t h;
  const unsigned char *nonce;
  int offered;
  hello_verdict_t v;
  memset(&in, 0, sizeof(in));
  in.magic = UVCCL__HELLO_MAGIC;
  in.version = UVCCL__WIRE_VERSION;
  in.from = 3;
  in.to = 1;
  in.to_nonce = 0x1122334455667788ull;
  in.world = 4;
  memset(in.addr, 'a', sizeof(in.addr)); /* no NUL */
  memcpy(buf, &in, sizeof(in));
  memset(buf + sizeof(in), 0x5a, UVCCL__AUTH_NONCE);
  memset(&h, 0, sizeof(h));
  h.kind = FRAME_HELLO;
  h.len = sizeof(in);
  v = uvccl__frame_hello_parse(&h, buf, &out, &offered, &nonce);
  ok(v == UVCCL__HELLO_OK && !offered && nonce == NULL && out.from == 3 &&
         out.to == 1 && out.world == 4 &&
         out.to_nonce == 0x1122334455667788ull &&
         strlen(out.addr) == sizeof(out.addr) - 1,
     "a hello: from 3 to 1 of 4, its address cut to %zu bytes and "
     "NUL-terminated", strlen(out.addr));
  h.len = sizeof(in) + UVCCL__AUTH_NONCE;
  v = uvccl__frame_hello_parse(&h, buf, &out, &offered, &nonce);
  ok(v == UVCCL__HELLO_OK && offered && nonce == buf + sizeof(in) &&
         nonce[0] == 0x5a,
     "a hello with a nonce: offered, the nonce after the hello");
  h.len = sizeof(in) + 1;
  v = uvccl__frame_hello_parse(&h, buf, &out, &offered, &nonce);
  ok(v == UVCCL__HELLO_BAD_SIZE && !offered && out.magic == 0,
     "a hello of another size: refused unread");
  in.magic = 0x48545450u; /* "HTTP" */
  memcpy(buf, &in, sizeof(in));
  h.len = sizeof(in);
  v = uvccl__frame_hello_parse(&h, buf, &out, &offered, &nonce);
  ok(v == UVCCL__HELLO_BAD_MAGIC, "another magic: not a uvccl peer");
  in.magic = UVCCL__HELLO_MAGIC;
  in.version = 1;
  memcpy(buf, &in, sizeof(in));
  v = uvccl__frame_hello_parse(&h, buf, &out, &offered, &nonce);
  ok(v == UVCCL__HELLO_BAD_VERSION && out.version == 1,
     "wire version 1: refused, the version read (%u)", out.version);
}

static void test_reject(void) {
  unsigned char why[300];
  char out[256], tiny[4];
  frame_hdr_t h;
  memset(why, 'x', sizeof(why));
  memcpy(why, "authentication failed: no", 25);
  memset(&h, 0, sizeof(h));
  h.kind = FRAME_REJECT;
  h.len = 25;
  uvccl__frame_reject_text(&h, why, 25, out, sizeof(out));
  is_str(out, "authentication failed: no", "a REJECT's reason");
  h.len = sizeof(why);
  uvccl__frame_reject_text(&h, why, sizeof(why), out, sizeof(out));
  ok(strlen(out) == sizeof(out) - 1, "a 300-byte reason cut to %zu",
     strlen(out));
  uvccl__frame_reject_text(&h, why, 5, out, sizeof(out));
  is_str(out, "authe", "only the bytes in are read (5 of 300)");
  uvccl__frame_reject_text(&h, why, sizeof(why), tiny, sizeof(tiny));
  is_str(tiny, "aut", "cut to a 4-byte buffer");
}

static void test_link(void) {
  unsigned char buf[LF_HDR + LF_MAX_PAYLOAD + 8];
  lf_hdr_t h;
  wire_hello_t hw, got;
  wire_fail_t wf;
  wire_notice_t wn, wn2;
  uvccl__fail_t f, back;
  size_t n;
  memset(&hw, 0, sizeof(hw));
  hw.magic = LINK_MAGIC;
  hw.nonce = 42;
  n = uvccl__lframe_build(buf, LF_HELLO, 1, 2, 4, &hw, sizeof(hw));
  ok(n == LF_HDR + sizeof(hw) && uvccl__lframe_next(buf, n, &h) == 1 &&
         h.kind == LF_HELLO && h.a == 1 && h.b == 2 && h.c == 4 &&
         h.len == sizeof(hw),
     "a link HELLO round trips (%zu bytes)", n);
  ok(uvccl__lframe_next(buf, LF_HDR - 1, &h) == 0 &&
         uvccl__lframe_next(buf, n - 1, &h) == 0,
     "part of a header, or of a payload: more is needed");
  ok(uvccl__lframe_hello(&h, buf + LF_HDR, sizeof(hw), &got) == 0 &&
         got.nonce == 42,
     "its payload: the target's nonce");
  ok(uvccl__lframe_hello(&h, buf + LF_HDR, sizeof(hw) + UVCCL__AUTH_NONCE,
                         &got) == -1,
     "a world with a secret wants a nonce after it");
  hw.magic = 0x12345678u;
  uvccl__lframe_build(buf, LF_HELLO, 1, 2, 4, &hw, sizeof(hw));
  uvccl__lframe_next(buf, n, &h);
  ok(uvccl__lframe_hello(&h, buf + LF_HDR, sizeof(hw), &got) == -2,
     "another magic: not a uvccl monitor");
  memset(&h, 0, sizeof(h));
  h.kind = LF_NOTICE;
  h.len = LF_MAX_PAYLOAD + 1;
  memcpy(buf, &h, LF_HDR);
  ok(uvccl__lframe_next(buf, sizeof(buf), &h) == -1,
     "a payload over %d bytes: not a link frame", LF_MAX_PAYLOAD);
  {
    static unsigned char big[LF_MAX_PAYLOAD + 100];
    n = uvccl__lframe_build(buf, LF_BYE, 0, 0, 0, big, sizeof(big));
  }
  ok(n == LF_HDR + LF_MAX_PAYLOAD, "building cuts a payload at %d",
     LF_MAX_PAYLOAD);

  memset(&f, 0, sizeof(f));
  f.rank = 5;
  f.origin = 2;
  f.cause = 3;
  f.err = UVCCL_EPEER;
  memset(f.detail, 'd', sizeof(f.detail)); /* no NUL */
  uvccl__lframe_fail_put(&wf, &f);
  n = uvccl__lframe_build(buf, LF_DEAD, 0, 0, 0, &wf, sizeof(wf));
  uvccl__lframe_next(buf, n, &h);
  ok(uvccl__lframe_dead(&h, buf + LF_HDR, 7, &back) == 0 && back.rank == 5 &&
         back.origin == 2 && back.via == 7 && back.cause == 3 &&
         back.err == UVCCL_EPEER &&
         strlen(back.detail) == sizeof(back.detail) - 1,
     "a failure on the wire and back: rank 5 from 2, heard via 7, detail "
     "NUL-terminated");
  memset(buf + LF_HDR, 'z', sizeof(wf)); /* a hostile record: no NUL */
  ok(uvccl__lframe_dead(&h, buf + LF_HDR, 7, &back) == 0 &&
         strlen(back.detail) == sizeof(back.detail) - 1,
     "a hostile failure record's detail is NUL-terminated");
  h.len = sizeof(wf) - 1;
  ok(uvccl__lframe_dead(&h, buf + LF_HDR, 7, &back) == -1,
     "a failure record of another size is dropped");
  memset(&wn, 'n', sizeof(wn));
  n = uvccl__lframe_build(buf, LF_NOTICE, 0, 0, 0, &wn, sizeof(wn));
  uvccl__lframe_next(buf, n, &h);
  ok(uvccl__lframe_notice(&h, buf + LF_HDR, &wn2) == 0 &&
         strlen(wn2.detail) == sizeof(wn2.detail) - 1,
     "a notice: its detail NUL-terminated");
  h.len = sizeof(wn) + 1;
  ok(uvccl__lframe_notice(&h, buf + LF_HDR, &wn2) == -1,
     "a notice of another size is dropped");
}

int main(void) {
  plan(2 + 25 + 5 + 4 + 12);
  test_header();
  test_classify();
  test_hello();
  test_reject();
  test_link();
  return done_testing();
}
