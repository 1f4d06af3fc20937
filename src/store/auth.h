/* Mutual authentication of connections by a shared secret (no I/O: the
 * store's server and client, the mesh (cpu/xport/net.c) and the liveness links
 * (cpu/live/live.c) drive it; fuzzed).
 *
 * The store's exchange, before anything else on a connection:
 *   client -> server  HELLO     "UVCCLAU1" | Nc (32 random bytes)
 *   server -> client  CHALLENGE "UVCCLAU1" | Ns (32) | HMAC(K, "uvccl-auth-1
 *                               server " purpose | Nc | Ns)
 *   client -> server  PROOF     HMAC(K, "uvccl-auth-1 client " purpose |
 *                               Nc | Ns)
 * K = SHA-256("uvccl-auth-key-1" | secret); HMAC is HMAC-SHA-256
 * (OpenSSL's libcrypto). Each side checks the other's MAC over both fresh
 * nonces (constant-time), so the secret never crosses the wire, a
 * recorded exchange replays nowhere (the other side's nonce is new), and
 * the purpose ("store", "mesh ...", "live ...") keeps one kind of
 * connection's proof from opening another. The mesh and the liveness
 * links carry the same three messages inside their own frames (the
 * nonce after the hello, then CHALLENGE and PROOF frames), their purpose
 * naming who dials whom, the listener's id and the world size. The MAC's
 * message is cut at 256 bytes of role and purpose (alike on both ends). */
#ifndef UVCCL_STORE_AUTH_H
#define UVCCL_STORE_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define UVCCL__AUTH_MAGIC "UVCCLAU1"
#define UVCCL__AUTH_MAGIC_LEN 8
#define UVCCL__AUTH_NONCE 32
#define UVCCL__AUTH_MAC 32
#define UVCCL__AUTH_HELLO_LEN (UVCCL__AUTH_MAGIC_LEN + UVCCL__AUTH_NONCE)
#define UVCCL__AUTH_CHALLENGE_LEN \
  (UVCCL__AUTH_MAGIC_LEN + UVCCL__AUTH_NONCE + UVCCL__AUTH_MAC)
#define UVCCL__AUTH_PROOF_LEN UVCCL__AUTH_MAC
#define UVCCL__AUTH_SECRET_MAX 4096

typedef struct {
  int set;                   /* a secret was given */
  uint8_t key[32];           /* K */
} uvccl__auth_key_t;

/* K from a secret of len bytes (len 0: none). */
void uvccl__auth_key_init(uvccl__auth_key_t *k, const void *secret,
                          size_t len);
/* The process's secret: $UVCCL_AUTH_TOKEN, else the contents of the file
 * $UVCCL_AUTH_FILE (which must be a regular file readable by its owner
 * only; a trailing newline is dropped). 0 with k->set 0 when neither is
 * set, 0 with the key, or an error with a message in err (a file that
 * cannot be read or is open to others, an empty secret). */
int uvccl__auth_key_from_env(uvccl__auth_key_t *k, char *err, size_t errlen);
/* Loads a secret file as uvccl__auth_key_from_env does. */
int uvccl__auth_key_from_file(uvccl__auth_key_t *k, const char *path,
                              char *err, size_t errlen);

/* The secret the options name (token, else file), else the
 * environment's; none with none = 1. As uvccl__auth_key_from_env. */
int uvccl__auth_key_from_opts(uvccl__auth_key_t *k, const char *token,
                              const char *file, int none, char *err,
                              size_t errlen);
/* Fills n bytes from the system's random source. 0 or an error. */
int uvccl__auth_random(void *buf, size_t n);
/* out = HMAC(K, "uvccl-auth-1 " role " " purpose | nc | ns). */
void uvccl__auth_mac(const uvccl__auth_key_t *k, const char *role,
                     const char *purpose, const uint8_t *nc,
                     const uint8_t *ns, uint8_t *out);
/* 1 when the n bytes are equal (in time independent of where they
 * differ). */
int uvccl__auth_equal(const uint8_t *a, const uint8_t *b, size_t n);

/* Message builders and readers. The readers return 0 and fill their
 * outputs, UVCCL__AUTH_NEED (fewer bytes than the message so far, all of
 * them consistent with it), or UVCCL_EPROTO (not this message). */
#define UVCCL__AUTH_NEED 1
void uvccl__auth_hello(uint8_t out[UVCCL__AUTH_HELLO_LEN], const uint8_t *nc);
int uvccl__auth_read_hello(const uint8_t *p, size_t len, uint8_t *nc);
void uvccl__auth_challenge(uint8_t out[UVCCL__AUTH_CHALLENGE_LEN],
                           const uvccl__auth_key_t *k, const char *purpose,
                           const uint8_t *nc, const uint8_t *ns);
int uvccl__auth_read_challenge(const uint8_t *p, size_t len, uint8_t *ns,
                               uint8_t *mac);

#endif
