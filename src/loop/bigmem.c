/* Large buffers that go back to the system a piece at a time.
 *
 * Unmapping memory costs per page that was touched: a large staged frame
 * or a collective's scratch takes far longer to unmap than a turn on the
 * application's loop may last (see turn.c; bench/RESULTS.md). So
 * such buffers are mapped on their own, and a buffer no longer needed is
 * retired to a list whose owner unmaps it from the end, a few MiB per
 * turn; its first page, which holds the list's link, goes last. */
#include "internal.h"

#include <sys/mman.h>
#include <unistd.h>

struct uvccl__bighdr_s {
  size_t mapped;                  /* bytes still mapped, from the start */
  struct uvccl__bighdr_s *next;   /* retired after it */
};

#define BIG_HDR 64u /* the user's bytes start here (cache-line aligned) */

static size_t page_size(void) {
  static size_t ps;
  if (ps == 0) {
    long v = sysconf(_SC_PAGESIZE);
    ps = v > 0 ? (size_t)v : 4096;
  }
  return ps;
}

void *uvccl__big_alloc(size_t len) {
  size_t ps = page_size(), total;
  struct uvccl__bighdr_s *h;
  if (len > SIZE_MAX - BIG_HDR - ps) return NULL;
  total = (len + BIG_HDR + ps - 1) / ps * ps;
  h = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
           -1, 0);
  if (h == MAP_FAILED) return NULL;
  h->mapped = total;
  h->next = NULL;
  return (char *)h + BIG_HDR;
}

static struct uvccl__bighdr_s *hdr_of(void *p) {
  return (struct uvccl__bighdr_s *)((char *)p - BIG_HDR);
}

void uvccl__big_free(void *p) {
  struct uvccl__bighdr_s *h;
  if (p == NULL) return;
  h = hdr_of(p);
  munmap(h, h->mapped);
}

void uvccl__big_retire(uvccl__big_list_t *l, void *p) {
  struct uvccl__bighdr_s *h;
  if (p == NULL) return;
  h = hdr_of(p);
  h->next = l->head;
  l->head = h;
  l->bytes += h->mapped;
}

size_t uvccl__big_reap(uvccl__big_list_t *l, size_t max) {
  size_t ps = page_size(), done = 0;
  while (l->head != NULL && done < max) {
    struct uvccl__bighdr_s *h = l->head;
    size_t n = h->mapped - ps;
    if (n == 0) {
      l->head = h->next;
      l->bytes -= ps;
      munmap(h, ps);
      done += ps;
      continue;
    }
    if (n > max - done) n = (max - done + ps - 1) / ps * ps;
    if (n > h->mapped - ps) n = h->mapped - ps;
    munmap((char *)h + h->mapped - n, n);
    h->mapped -= n;
    l->bytes -= n;
    done += n;
  }
  return done;
}

void uvccl__big_reap_all(uvccl__big_list_t *l) {
  while (l->head != NULL) {
    struct uvccl__bighdr_s *h = l->head;
    l->head = h->next;
    munmap(h, h->mapped);
  }
  l->bytes = 0;
}
