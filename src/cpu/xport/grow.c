/* A net takes in more ranks (a grow that keeps the members' connections,
 * src/cpu/grow.c): the new ranks take the numbers after the last, so
 * the failed ranks' numbers stay fenced and nothing about a live rank
 * changes. Each array by rank grows, every group's inverse map too, and
 * the monitor's arrays on its own thread; the new ranks dial in (higher
 * ranks dial lower ones) once the monitor says it can take their links.
 * Shared-memory inboxes were made with room for as many ranks again
 * (uvccl__shm_slots), so joiners of this host get rings as well. The
 * world's small collectives through boxes stay among the ranks they were
 * agreed for (the old world keeps them; a grown one goes without). */
#include "tcp.h"

uint32_t uvccl__shm_slots(int size) {
  uint64_t n = 2 * (uint64_t)(size > 0 ? size : 1);
  if (n > UVCCL__SHM_MAX_SLOTS) n = (uint64_t)size;
  if (n > UVCCL__SHM_MAX_SLOTS) n = UVCCL__SHM_MAX_SLOTS;
  return (uint32_t)n;
}

/* Grows *p from old to n elements of esize bytes, the new ones zero. */
static int grow_array(void *pp, size_t old, size_t n, size_t esize) {
  void **p = pp;
  char *q = uvccl__realloc(*p, n * esize);
  if (q == NULL) return UV_ENOMEM;
  memset(q + old * esize, 0, (n - old) * esize);
  *p = q;
  return 0;
}

int uvccl__net_grow(net_t *net, int size, void (*grown_cb)(net_t *, int)) {
  size_t old = (size_t)net->size, n = (size_t)size;
  uint64_t *hosts;
  group_t *g;
  size_t r;
  int rc = UV_ENOMEM;
  if (size <= net->size || net->sparse || net->live == NULL ||
      net->closing || net->grown_cb != NULL)
    return UV_EINVAL;
  /* every allocation first, so a failure changes nothing */
  hosts = uvccl__calloc(3 * n, sizeof(uint64_t));
  if (hosts == NULL) return UV_ENOMEM;
  for (g = net->groups; g != NULL; g = g->next)
    if (grow_array(&g->inv, old, n, sizeof(int)) != 0) goto fail;
  if (grow_array(&net->peers, old, n, sizeof(peer_t *)) != 0 ||
      grow_array(&net->addrs, old, n, sizeof(*net->addrs)) != 0 ||
      grow_array(&net->fails, old, n, sizeof(*net->fails)) != 0 ||
      grow_array(&net->failed, old, n, sizeof(int)) != 0 ||
      grow_array(&net->linked, old, n, 1) != 0)
    goto fail;
  for (g = net->groups; g != NULL; g = g->next)
    for (r = old; r < n; r++) g->inv[r] = -1;
  for (r = old; r < n; r++) net->fails[r].rank = -1;
  /* the monitor last: once it has the command, the net must grow */
  rc = uvccl__live_grow(net->live, size);
  if (rc != 0) goto fail;
  memcpy(hosts, net->hosts, old * sizeof(uint64_t));
  memcpy(hosts + n, net->kernels, old * sizeof(uint64_t));
  memcpy(hosts + 2 * n, net->lost, (size_t)net->nlost * sizeof(uint64_t));
  uvccl__free(net->hosts);
  net->hosts = hosts;
  net->kernels = hosts + n;
  net->lost = hosts + 2 * n;
  net->size = size;
  net->grown_cb = grown_cb;
  return 0;
fail:
  /* the arrays that did grow keep their extra room, unused */
  uvccl__free(hosts);
  return rc;
}

int uvccl__net_absent(net_t *net, int rank) {
  if (rank < 0 || rank >= net->size || rank == net->rank) return UV_EINVAL;
  return uvccl__live_absent(net->live, rank);
}
