/* Shared-secret authentication of connections (see auth.h). The crypto
 * is OpenSSL's libcrypto: SHA-256, HMAC, RAND_bytes, CRYPTO_memcmp. */
#include "auth.h"
#include "loop/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

void uvccl__auth_key_init(uvccl__auth_key_t *k, const void *secret,
                          size_t len) {
  memset(k, 0, sizeof(*k));
  if (secret == NULL || len == 0) return;
  {
    unsigned char buf[16 + UVCCL__AUTH_SECRET_MAX];
    size_t n = len < UVCCL__AUTH_SECRET_MAX ? len : UVCCL__AUTH_SECRET_MAX;
    unsigned int outlen = 0;
    memcpy(buf, "uvccl-auth-key-1", 16);
    memcpy(buf + 16, secret, n);
    EVP_Digest(buf, 16 + n, k->key, &outlen, EVP_sha256(), NULL);
    OPENSSL_cleanse(buf, sizeof(buf));
  }
  k->set = 1;
}

static int load_file(const char *path, char *buf, size_t cap, size_t *len,
                     char *err, size_t errlen) {
  struct stat st;
  ssize_t n;
  size_t got = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    snprintf(err, errlen, "auth file %s: %s", path, strerror(e));
    return -e;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    snprintf(err, errlen, "auth file %s: not a regular file", path);
    return UV_EINVAL;
  }
  if ((st.st_mode & 077) != 0) {
    close(fd);
    snprintf(err, errlen, "auth file %s: readable by others (mode %03o): "
             "chmod 600 it", path, (unsigned)(st.st_mode & 0777));
    return UV_EPERM;
  }
  while (got < cap && (n = read(fd, buf + got, cap - got)) > 0) got += (size_t)n;
  close(fd);
  while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == '\r')) got--;
  *len = got;
  return 0;
}

int uvccl__auth_key_from_file(uvccl__auth_key_t *k, const char *path,
                              char *err, size_t errlen) {
  char buf[UVCCL__AUTH_SECRET_MAX];
  size_t len = 0;
  int rc = load_file(path, buf, sizeof(buf), &len, err, errlen);
  memset(k, 0, sizeof(*k));
  if (rc != 0) return rc;
  if (len == 0) {
    snprintf(err, errlen, "auth file %s is empty", path);
    return UV_EINVAL;
  }
  uvccl__auth_key_init(k, buf, len);
  OPENSSL_cleanse(buf, sizeof(buf));
  return 0;
}

int uvccl__auth_key_from_env(uvccl__auth_key_t *k, char *err, size_t errlen) {
  const char *tok = uvccl__config_text(UVCCL__CFG_AUTH_TOKEN);
  const char *file = uvccl__config_text(UVCCL__CFG_AUTH_FILE);
  memset(k, 0, sizeof(*k));
  if (tok != NULL && *tok != '\0') {
    uvccl__auth_key_init(k, tok, strlen(tok));
    return 0;
  }
  if (file != NULL && *file != '\0')
    return uvccl__auth_key_from_file(k, file, err, errlen);
  return 0;
}

int uvccl__auth_key_from_opts(uvccl__auth_key_t *k, const char *token,
                              const char *file, int none, char *err,
                              size_t errlen) {
  memset(k, 0, sizeof(*k));
  if (none) return 0;
  if (token != NULL) {
    if (*token == '\0') {
      snprintf(err, errlen, "the auth token is empty");
      return UV_EINVAL;
    }
    uvccl__auth_key_init(k, token, strlen(token));
    return 0;
  }
  if (file != NULL) return uvccl__auth_key_from_file(k, file, err, errlen);
  return uvccl__auth_key_from_env(k, err, errlen);
}

/* The kernel's CSPRNG (getrandom): no per-process generator to seed, which
 * costs OpenSSL's first RAND_bytes about a millisecond (a 1,024-rank world
 * starts 1,024 processes). */
int uvccl__auth_random(void *buf, size_t n) {
  return uv_random(NULL, NULL, buf, n, 0, NULL) == 0 ? 0 : UV_EIO;
}

void uvccl__auth_mac(const uvccl__auth_key_t *k, const char *role,
                     const char *purpose, const uint8_t *nc,
                     const uint8_t *ns, uint8_t *out) {
  unsigned char msg[256 + 2 * UVCCL__AUTH_NONCE];
  unsigned int outlen = 0;
  int n = snprintf((char *)msg, 256, "uvccl-auth-1 %s %s", role, purpose);
  if (n < 0 || n >= 256) n = 255; /* both ends cut alike */
  memcpy(msg + n, nc, UVCCL__AUTH_NONCE);
  memcpy(msg + n + UVCCL__AUTH_NONCE, ns, UVCCL__AUTH_NONCE);
  HMAC(EVP_sha256(), k->key, sizeof(k->key), msg,
       (size_t)n + 2 * UVCCL__AUTH_NONCE, out, &outlen);
}

int uvccl__auth_equal(const uint8_t *a, const uint8_t *b, size_t n) {
  return CRYPTO_memcmp(a, b, n) == 0;
}

void uvccl__auth_hello(uint8_t out[UVCCL__AUTH_HELLO_LEN], const uint8_t *nc) {
  memcpy(out, UVCCL__AUTH_MAGIC, UVCCL__AUTH_MAGIC_LEN);
  memcpy(out + UVCCL__AUTH_MAGIC_LEN, nc, UVCCL__AUTH_NONCE);
}

/* The magic, as far as len goes. */
static int magic_ok(const uint8_t *p, size_t len) {
  size_t n = len < UVCCL__AUTH_MAGIC_LEN ? len : UVCCL__AUTH_MAGIC_LEN;
  return memcmp(p, UVCCL__AUTH_MAGIC, n) == 0;
}

int uvccl__auth_read_hello(const uint8_t *p, size_t len, uint8_t *nc) {
  if (!magic_ok(p, len)) return UVCCL_EPROTO;
  if (len < UVCCL__AUTH_HELLO_LEN) return UVCCL__AUTH_NEED;
  memcpy(nc, p + UVCCL__AUTH_MAGIC_LEN, UVCCL__AUTH_NONCE);
  return 0;
}

void uvccl__auth_challenge(uint8_t out[UVCCL__AUTH_CHALLENGE_LEN],
                           const uvccl__auth_key_t *k, const char *purpose,
                           const uint8_t *nc, const uint8_t *ns) {
  memcpy(out, UVCCL__AUTH_MAGIC, UVCCL__AUTH_MAGIC_LEN);
  memcpy(out + UVCCL__AUTH_MAGIC_LEN, ns, UVCCL__AUTH_NONCE);
  uvccl__auth_mac(k, "server", purpose, nc, ns,
                  out + UVCCL__AUTH_MAGIC_LEN + UVCCL__AUTH_NONCE);
}

int uvccl__auth_read_challenge(const uint8_t *p, size_t len, uint8_t *ns,
                               uint8_t *mac) {
  if (!magic_ok(p, len)) return UVCCL_EPROTO;
  if (len < UVCCL__AUTH_CHALLENGE_LEN) return UVCCL__AUTH_NEED;
  memcpy(ns, p + UVCCL__AUTH_MAGIC_LEN, UVCCL__AUTH_NONCE);
  memcpy(mac, p + UVCCL__AUTH_MAGIC_LEN + UVCCL__AUTH_NONCE, UVCCL__AUTH_MAC);
  return 0;
}
