/* Revoke and shrink for TCP groups: MPI ULFM's MPIX_Comm_revoke and
 * MPIX_Comm_shrink (and what ncclCommShrink does for NCCL).
 *
 * Revoke is a notice on the monitor's links (live.c): every member fails
 * the group's pending and later work with UVCCL_EREVOKED, whatever its
 * data connections are doing.
 *
 * Shrink agrees on who failed, then makes a group of the others on the
 * same connections. The agreement is a coordinator's: the lowest-ranked
 * member nobody knows to have failed collects every live member's set of
 * failed ranks (PROPOSE), and once it has heard from each member it does
 * not itself know to have failed, decides their union and tells everyone
 * (DECIDE). A rank the caller excludes (uvccl_pg_shrink_excluding) is in
 * its proposal as if failed. It tolerates failures during it, relying on
 * the monitor's verdicts (every survivor eventually learns of every
 * failure, and a rank declared failed is cut off, so it cannot come back
 * and disagree):
 *  - a member that learns its coordinator failed proposes to the next one;
 *  - a member that has already decided keeps answering, and proposes its
 *    decision to any new coordinator, which must adopt it; so if the
 *    coordinator dies after telling some members, no one decides anything
 *    else;
 *  - the state of each agreement lives in the net (the connections), not
 *    in the group, so it answers late coordinators even after the
 *    application destroyed the old group.
 * The messages are FRAME_AGREE frames on the data connections between
 * survivors (gid: the group shrunk, seq: the shrink's epoch, tag: kind).
 *
 * A cut link looks like death from either side: each side's ranks fall
 * silent to the other's, and each would shrink to itself and go on as the
 * group (split brain: two worlds training apart, both checkpointing). So
 * a coordinator that decides also rules whether its side may go on
 * (quorum()): ranks removed for their silence while on another host may
 * be alive over there, and its side goes on only as a majority of the
 * ranks that are either kept or may be alive, or as the half holding the
 * lowest of them. Both sides count the same ranks (each sees the other's
 * as silent), so at most one side passes. Ranks proven gone (a process
 * that exited, a reset, an abort: a live kernel or the rank itself said
 * so), ranks of this host (nothing cuts one kernel in two) and ranks the
 * caller excluded do not count. The verdict travels with the decision
 * (flag 2), so every member of a side acts on its coordinator's. */
#include "internal.h"
#include "loop/config.h"

#include <stdio.h>

enum { AG_PROPOSE = 1, AG_DECIDE = 2 };

typedef struct agree_s {
  struct agree_s *next;
  net_t *net;
  uint32_t gid, epoch;
  int n, me;                /* group size, this rank's group rank */
  int *ranks;               /* group rank -> world rank */
  unsigned char *failed;    /* known failed, by group rank */
  unsigned char *heard;     /* as coordinator: proposals received */
  unsigned char *decision;  /* once decided: excluded ranks */
  unsigned char *excluded;  /* by this rank's caller */
  int decided;
  int refused;              /* decided, but this side is no quorum */
  int joined;               /* this rank's application called shrink */
  int proposed_to;          /* the coordinator we proposed to (-1) */
  int announced;            /* as coordinator: DECIDE sent */
  /* the caller's, while its shrink is pending */
  group_t *g;
  uvccl_pg_t *newpg;
  uvccl_work_t *w;
} agree_t;

static void agree_progress(agree_t *a);
static void agree_finish(agree_t *a, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- revoke ------------------------------------------------------------ */

int uvccl__cpu_pg_revoke(uvccl_pg_t *pg, const char *reason) {
  group_t *g;
  net_t *net;
  uvccl__notice_t n;
  uvccl__fail_t f;
  char msg[UVCCL_WORK_MSG_LEN];
  if (pg == NULL) return UV_EINVAL;
  g = pg->impl_;
  if (g == NULL) return pg->rank < 0 ? UVCCL_ENOTMEMBER : UV_EINVAL;
  if (g->destroying) return UVCCL_ECLOSING;
  if (g->boot != NULL) return UV_EINVAL;
  net = g->net;
  if (reason == NULL) reason = "revoked by its application";
  memset(&n, 0, sizeof(n));
  n.what = UVCCL__NOTICE_REVOKE;
  n.gid = g->gid;
  n.rank = -1;
  n.origin = net->rank;
  n.cause = UVCCL_FAIL_REVOKED;
  n.err = UVCCL_EREVOKED;
  snprintf(n.detail, sizeof(n.detail), "%s", reason);
  /* The others first (out of band: their data connections may be stuck
   * in this very group's transfers), then here. */
  uvccl__net_notify(net, &n);
  memset(&f, 0, sizeof(f));
  f.rank = -1;
  f.origin = f.via = net->rank;
  f.cause = UVCCL_FAIL_REVOKED;
  f.err = UVCCL_EREVOKED;
  snprintf(f.detail, sizeof(f.detail), "%s", reason);
  snprintf(msg, sizeof(msg), "revoked by rank %d (global %d, this rank): %.100s",
           g->rank, net->rank, reason);
  uvccl__group_break(g, UVCCL_EREVOKED, &f, msg);
  return 0;
}

/* ---- agreement state ---------------------------------------------------- */

static agree_t *agree_find(net_t *net, uint32_t gid, uint32_t epoch) {
  agree_t *a;
  for (a = net->agrees; a != NULL; a = a->next)
    if (a->gid == gid && a->epoch == epoch) return a;
  return NULL;
}

static agree_t *agree_new(net_t *net, group_t *g, uint32_t epoch) {
  agree_t *a = uvccl__calloc(1, sizeof(*a));
  int i;
  if (a == NULL) return NULL;
  a->net = net;
  a->gid = g->gid;
  a->epoch = epoch;
  a->n = g->size;
  a->me = g->rank;
  a->proposed_to = -1;
  a->ranks = uvccl__malloc((size_t)g->size * sizeof(int));
  a->failed = uvccl__calloc((size_t)g->size, 1);
  a->heard = uvccl__calloc((size_t)g->size, 1);
  a->decision = uvccl__calloc((size_t)g->size, 1);
  a->excluded = uvccl__calloc((size_t)g->size, 1);
  if (a->ranks == NULL || a->failed == NULL || a->heard == NULL ||
      a->decision == NULL || a->excluded == NULL) {
    uvccl__free(a->ranks);
    uvccl__free(a->failed);
    uvccl__free(a->heard);
    uvccl__free(a->decision);
    uvccl__free(a->excluded);
    uvccl__free(a);
    return NULL;
  }
  for (i = 0; i < g->size; i++) a->ranks[i] = g->ranks[i];
  a->next = net->agrees;
  net->agrees = a;
  return a;
}

void uvccl__agree_free_all(net_t *net) {
  agree_t *a, *next;
  for (a = net->agrees; a != NULL; a = next) {
    next = a->next;
    uvccl__free(a->ranks);
    uvccl__free(a->failed);
    uvccl__free(a->heard);
    uvccl__free(a->decision);
    uvccl__free(a->excluded);
    uvccl__free(a);
  }
  net->agrees = NULL;
}

/* What the monitor says: a member failed, was cut off or left. */
static int member_gone(const net_t *net, int world_rank) {
  peer_t *p;
  if (world_rank == net->rank) return 0;
  if (net->fails[world_rank].rank >= 0) return 1;
  p = net->peers[world_rank];
  if (p == NULL) return !net->sparse; /* sparse: not connected yet */
  return p->state == PEER_DEAD && p->left;
}

int uvccl__agree_declared(const net_t *net, int world_rank) {
  const agree_t *a;
  int i;
  for (a = net->agrees; a != NULL; a = a->next)
    for (i = 0; a->decided && a->decision != NULL && i < a->n; i++)
      if (a->ranks[i] == world_rank && a->decision[i]) return 1;
  return 0;
}

static void learn_failures(agree_t *a) {
  int i;
  for (i = 0; i < a->n; i++)
    if (!a->failed[i] && member_gone(a->net, a->ranks[i])) a->failed[i] = 1;
}

static int coordinator(const agree_t *a) {
  int i;
  for (i = 0; i < a->n; i++)
    if (!a->failed[i]) return i;
  return a->me;
}

/* ---- quorum ---------------------------------------------------------------- */

/* Whether group rank i, removed, may be alive on the other side of a cut:
 * removed for silence (heartbeats, the network's or an operation's
 * timeout, or a member's word with no verdict here yet) and on another
 * host. A host not known counts as another where the world spans several. */
static int maybe_alive(const agree_t *a, int i) {
  const net_t *net = a->net;
  const uvccl__fail_t *f;
  uint64_t mine = net->hosts[net->rank], h;
  int r = a->ranks[i], q;
  if (a->excluded[i] || r == net->rank) return 0;
  f = &net->fails[r];
  if (f->rank >= 0 && f->cause != UVCCL_FAIL_HEARTBEAT &&
      f->cause != UVCCL_FAIL_UNREACHABLE && f->cause != UVCCL_FAIL_TIMEOUT)
    return 0;
  if (f->rank < 0 && member_gone(net, r)) return 0; /* it left */
  h = net->hosts[r];
  if (h != 0 && mine != 0) return h != mine;
  for (q = 0; q < net->size; q++)
    if (net->hosts[q] != 0 && net->hosts[q] != mine) return 1;
  return 0;
}

/* 1: the side that keeps the decision's ranks may go on. *kept, *silent:
 * the ranks it keeps and those removed that may be alive; *lowest: the
 * lowest group rank of either. */
static int quorum(const agree_t *a, int *kept, int *silent, int *lowest) {
  int i;
  *kept = *silent = 0;
  *lowest = -1;
  for (i = 0; i < a->n; i++) {
    if (!a->decision[i]) ++*kept;
    else if (maybe_alive(a, i)) ++*silent;
    else continue;
    if (*lowest < 0) *lowest = i;
  }
  if (*kept > *silent) return 1;
  return *kept == *silent && *lowest >= 0 && !a->decision[*lowest];
}

/* The coordinator's ruling on its own decision. */
static void quorum_rule(agree_t *a) {
  int on = 1, kept, silent, lowest;
  uvccl__config_choice(UVCCL__CFG_SHRINK_QUORUM, &on);
  a->refused = on && !quorum(a, &kept, &silent, &lowest);
  if (a->refused)
    LOG_ERROR("coll", "rank %d: shrink of group %u refused: this side keeps "
              "%d ranks, %d others went silent on other hosts (no quorum)",
              a->net->rank, a->gid, kept, silent);
}

/* Why this side may not go on (the work's message). */
static void quorum_finish(agree_t *a) {
  char list[64];
  size_t off = 0;
  int i, kept, silent, lowest, k = 0;
  quorum(a, &kept, &silent, &lowest);
  list[0] = '\0';
  for (i = 0; i < a->n; i++) {
    if (!a->decision[i] || !maybe_alive(a, i)) continue;
    if (off > sizeof(list) - 16) {
      snprintf(list + off, sizeof(list) - off, ", ...");
      break;
    }
    off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%d",
                            k++ ? ", " : "", a->ranks[i]);
  }
  if (kept == silent && lowest >= 0)
    agree_finish(a, UVCCL_ENOQUORUM, "shrink refused, no quorum: a half (%d "
                 "of %d ranks) without the lowest, global %d, silent on "
                 "another host and maybe going on; UVCCL_SHRINK_QUORUM=0 "
                 "overrides", kept, kept + silent, a->ranks[lowest]);
  else
    agree_finish(a, UVCCL_ENOQUORUM, "shrink refused, no quorum: this side "
                 "keeps %d of %d ranks; the others went silent on other "
                 "hosts (global %s), maybe going on; UVCCL_SHRINK_QUORUM=0 "
                 "overrides", kept, kept + silent, list);
}

/* ---- messages ------------------------------------------------------------- */

/* [u32 n][u32 flags: 1 decided, 2 refused][n bytes failed][n bytes
 * decision] */
static void agree_send(agree_t *a, int to, int kind) {
  size_t len = 8 + 2 * (size_t)a->n;
  unsigned char *p = uvccl__malloc(len);
  uint32_t n = (uint32_t)a->n,
           flags = (a->decided ? 1u : 0u) | (a->refused ? 2u : 0u);
  if (p == NULL) return; /* the work's timeout remains */
  memcpy(p, &n, 4);
  memcpy(p + 4, &flags, 4);
  memcpy(p + 8, a->failed, (size_t)a->n);
  memcpy(p + 8 + a->n, a->decision, (size_t)a->n);
  uvccl__net_send_ctl(a->net, a->ranks[to], FRAME_AGREE, a->gid, a->epoch,
                      (uint32_t)kind, p, len);
  uvccl__free(p);
}

static void agree_finish(agree_t *a, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void agree_finish(agree_t *a, int status, const char *fmt, ...) {
  uvccl_work_t *w = a->w;
  va_list ap;
  if (w == NULL) return;
  a->w = NULL;
  w->owner_ = NULL;
  if (status == 0) {
    uvccl__work_complete(w, 0);
    return;
  }
  {
    char msg[UVCCL_WORK_MSG_LEN];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    uvccl__work_fail(w, status, "%s", msg);
  }
}

/* Decided: this rank's new group, if its application asked. */
static void agree_complete(agree_t *a) {
  int *keep, i, n = 0, rc;
  if (!a->joined || a->w == NULL || a->g == NULL) return;
  if (a->decision[a->me]) {
    agree_finish(a, UVCCL_EPEER, "shrink: this rank (global %d) was excluded: "
                 "the others declared it failed", a->net->rank);
    return;
  }
  if (a->refused) {
    quorum_finish(a);
    return;
  }
  keep = uvccl__malloc((size_t)a->n * sizeof(int));
  if (keep == NULL) {
    agree_finish(a, UV_ENOMEM, "shrink: out of memory");
    return;
  }
  for (i = 0; i < a->n; i++)
    if (!a->decision[i]) keep[n++] = i;
  a->w->result = a->n - n;
  rc = uvccl__group_make_child(a->g, a->newpg,
                               uvccl__child_gid(a->gid, 0x40000000u | a->epoch,
                                                0x5348),
                               keep, n, NULL, "shrink");
  uvccl__free(keep);
  if (rc != 0) {
    agree_finish(a, rc, "shrink: making the new group: %s",
                 uvccl_strerror(rc));
    return;
  }
  LOG_INFO("coll", "rank %d: shrunk group %u to %d ranks (%d removed)",
           a->net->rank, a->gid, n, a->n - n);
  agree_finish(a, 0, NULL);
}

static void agree_progress(agree_t *a) {
  int c, i, all;
  learn_failures(a);
  c = coordinator(a);
  if (c != a->me) {
    /* Propose (or pass on a decision) to the coordinator, again whenever
     * it changes. A rank that has not joined keeps quiet until it does,
     * unless it knows a decision. */
    if ((a->joined || a->decided) && a->proposed_to != c) {
      a->proposed_to = c;
      agree_send(a, c, AG_PROPOSE);
    }
    if (a->decided) agree_complete(a);
    return;
  }
  if (!a->joined && !a->decided) return;
  a->heard[a->me] = 1;
  if (!a->decided) {
    for (all = 1, i = 0; i < a->n; i++)
      if (!a->failed[i] && !a->heard[i]) all = 0;
    if (!all) return;
    a->decided = 1;
    memcpy(a->decision, a->failed, (size_t)a->n);
    quorum_rule(a);
  }
  if (!a->announced) {
    a->announced = 1;
    for (i = 0; i < a->n; i++)
      if (i != a->me && !member_gone(a->net, a->ranks[i]))
        agree_send(a, i, AG_DECIDE);
  }
  agree_complete(a);
}

/* A FRAME_AGREE from world rank `from` (the net's upcall). */
static void agree_on_frame(net_t *net, int from, const frame_hdr_t *h,
                     const unsigned char *p) {
  agree_t *a = agree_find(net, h->gid, h->seq);
  uint32_t n, flags;
  int i, gi;
  if (h->len < 8) return;
  memcpy(&n, p, 4);
  memcpy(&flags, p + 4, 4);
  if (a == NULL) {
    group_t *g = uvccl__net_group(net, h->gid);
    if (g == NULL) {
      LOG_DEBUG("coll", "rank %d: shrink message for unknown group %u from "
                "rank %d: dropped", net->rank, h->gid, from);
      return;
    }
    a = agree_new(net, g, h->seq);
    if (a == NULL) return;
  }
  if ((int)n != a->n || h->len != 8 + 2 * (uint64_t)n) return;
  for (gi = -1, i = 0; i < a->n; i++)
    if (a->ranks[i] == from) gi = i;
  if (gi < 0) return;
  for (i = 0; i < a->n; i++)
    if (p[8 + i]) a->failed[i] = 1;
  if (h->tag == AG_PROPOSE) {
    a->heard[gi] = 1;
    if ((flags & 1) && !a->decided) {
      /* Someone already decided: that is the decision. */
      a->decided = 1;
      a->refused = (flags & 2) != 0;
      memcpy(a->decision, p + 8 + a->n, (size_t)a->n);
    }
    if (a->decided && a->announced) agree_send(a, gi, AG_DECIDE);
  } else if (h->tag == AG_DECIDE && (flags & 1) && !a->decided) {
    a->decided = 1;
    a->refused = (flags & 2) != 0;
    memcpy(a->decision, p + 8 + a->n, (size_t)a->n);
  }
  agree_progress(a);
}

/* A verdict on world rank r (the net's upcall): agreements in progress
 * move on (a new coordinator, one fewer member to wait for). */
static void agree_on_verdict(net_t *net, int r) {
  agree_t *a;
  (void)r;
  for (a = net->agrees; a != NULL; a = a->next)
    if (a->joined || a->decided) agree_progress(a);
}

void uvccl__shrink_attach(net_t *net) {
  net->on_agree = agree_on_frame;
  net->on_failed = agree_on_verdict;
  net->agrees_free = uvccl__agree_free_all;
}

/* ---- shrink --------------------------------------------------------------- */

static void shrink_abandon(uvccl_work_t *w, int status) {
  agree_t *a = w->owner_;
  char list[96];
  size_t off = 0;
  int i, k = 0;
  if (a == NULL) return;
  a->w = NULL; /* the agreement goes on without us (others may need it) */
  list[0] = '\0';
  learn_failures(a);
  if (coordinator(a) == a->me && !a->decided)
    for (i = 0; i < a->n && off < sizeof(list) - 16; i++)
      if (!a->failed[i] && !a->heard[i]) {
        off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%d",
                                k++ ? ", " : "", i);
      }
  if (status == UV_ETIMEDOUT) {
    if (k > 0)
      uvccl__work_fail(w, status, "shrink timed out after %llu ms: rank%s %s "
                       "did not join it (alive, but not shrinking?)",
                       (unsigned long long)w->timeout_ms_, k > 1 ? "s" : "",
                       list);
    else
      uvccl__work_fail(w, status, "shrink timed out after %llu ms waiting "
                       "for rank %d's decision",
                       (unsigned long long)w->timeout_ms_, coordinator(a));
  }
}

static const struct uvccl__work_ops shrink_ops = {shrink_abandon, NULL, NULL};

int uvccl__cpu_pg_shrink(uvccl_pg_t *pg, uvccl_pg_t *newpg,
                         const int *exclude, int nexclude, uvccl_work_t *w,
                         uvccl_work_cb cb) {
  group_t *g;
  net_t *net;
  agree_t *a;
  uint32_t epoch;
  uint64_t timeout;
  int rc, i;
  if (pg == NULL || newpg == NULL || w == NULL || newpg == pg)
    return UV_EINVAL;
  g = pg->impl_;
  if (g == NULL) return pg->rank < 0 ? UVCCL_ENOTMEMBER : UV_EINVAL;
  if (g->destroying) return UVCCL_ECLOSING;
  if (g->boot != NULL) return UV_EINVAL;
  if (w->state == UVCCL_WORK_PENDING) return UVCCL_EBUSY;
  net = g->net;
  if (net->fenced) {
    snprintf(w->msg, sizeof(w->msg), "shrink: %.170s", g->broken_msg);
    return UVCCL_EPEER;
  }
  epoch = ++g->nshrinks;
  a = agree_find(net, g->gid, epoch);
  if (a == NULL) a = agree_new(net, g, epoch);
  if (a == NULL) return UV_ENOMEM;
  timeout = w->timeout_ms ? w->timeout_ms : g->timeout_ms;
  rc = uvccl__work_start(w, net->loop, "shrink", &shrink_ops, a, timeout, cb);
  if (rc != 0) return rc;
  /* The excluded count as failed in this rank's proposal: a coordinator
   * does not wait for them, and the decision (a union) leaves them out. */
  for (i = 0; i < nexclude; i++)
    a->failed[exclude[i]] = a->excluded[exclude[i]] = 1;
  a->joined = 1;
  a->g = g;
  a->newpg = newpg;
  a->w = w;
  agree_progress(a);
  return 0;
}

/* The group is going away: a shrink of it that is still pending fails
 * (its agreement goes on for the others). */
void uvccl__shrink_forget_group(group_t *g) {
  agree_t *a;
  for (a = g->net->agrees; a != NULL; a = a->next) {
    if (a->g != g) continue;
    a->g = NULL;
    agree_finish(a, UV_ECANCELED, "shrink cancelled: the group was destroyed");
  }
}
