/* bench/cluster/delay.c - a link's one-way delay for the emulated cluster,
 * where the kernel has no netem: packets an nftables rule sends to
 * NFQUEUE queue Q are held here D microseconds, then let through in the
 * order they came (one delay for all: a FIFO, released in batches).
 *
 *   delay QUEUE MICROSECONDS     (inside the host's network namespace,
 *                                 root; stops on SIGTERM or SIGINT)
 *
 * Large sends pass as one packet each (the queue's GSO flag): the delay
 * costs a wakeup per send, not per wire packet. Needs libnetfilter-queue.
 * Packets are never copied here (metadata only). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#define HELD_MAX (1u << 16) /* a power of two */

typedef struct {
  uint32_t id;
  uint64_t due_ns;
} held_t;

static held_t held[HELD_MAX];
static uint32_t head, tail; /* held[head..tail) in arrival order */
static uint64_t delay_ns;
static volatile sig_atomic_t stop;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg,
                     struct nfq_data *nfa, void *data) {
  struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
  (void)msg;
  (void)data;
  if (ph == NULL) return 0;
  if (tail - head == HELD_MAX) /* full: this one goes at once */
    return nfq_set_verdict(qh, ntohl(ph->packet_id), NF_ACCEPT, 0, NULL);
  held[tail % HELD_MAX].id = ntohl(ph->packet_id);
  held[tail % HELD_MAX].due_ns = now_ns() + delay_ns;
  tail++;
  return 0;
}

/* Lets through every packet whose time has come (one batch verdict: the
 * queue's ids rise, and what is due is a prefix). */
static void release(struct nfq_q_handle *qh) {
  uint64_t t = now_ns();
  uint32_t last = head;
  while (last != tail && held[last % HELD_MAX].due_ns <= t) last++;
  if (last == head) return;
  nfq_set_verdict_batch(qh, held[(last - 1) % HELD_MAX].id, NF_ACCEPT);
  head = last;
}

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

int main(int argc, char **argv) {
  struct nfq_handle *h;
  struct nfq_q_handle *qh;
  char buf[65536];
  int fd, q;
  if (argc != 3) {
    fprintf(stderr, "usage: delay QUEUE MICROSECONDS\n");
    return 2;
  }
  q = atoi(argv[1]);
  delay_ns = (uint64_t)strtoull(argv[2], NULL, 10) * 1000u;
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  h = nfq_open();
  if (h == NULL) {
    perror("delay: nfq_open");
    return 1;
  }
  qh = nfq_create_queue(h, (uint16_t)q, on_packet, NULL);
  if (qh == NULL) {
    perror("delay: nfq_create_queue");
    return 1;
  }
  nfq_set_mode(qh, NFQNL_COPY_META, 0);
  nfq_set_queue_maxlen(qh, HELD_MAX);
  nfq_set_queue_flags(qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO);
  fd = nfq_fd(h);
  {
    int sz = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz));
  }
  while (!stop) {
    struct pollfd pfd = {fd, POLLIN, 0};
    struct timespec ts, *tp = NULL;
    int n;
    if (head != tail) {
      uint64_t due = held[head % HELD_MAX].due_ns, t = now_ns(),
               left = due > t ? due - t : 0;
      ts.tv_sec = (time_t)(left / 1000000000u);
      ts.tv_nsec = (long)(left % 1000000000u);
      tp = &ts;
    }
    n = ppoll(&pfd, 1, tp, NULL);
    if (n > 0) {
      ssize_t len;
      while ((len = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
        nfq_handle_packet(h, buf, (int)len);
      if (len < 0 && errno == ENOBUFS)
        fprintf(stderr, "delay: the kernel dropped queued packets\n");
    }
    release(qh);
  }
  /* what is held goes now */
  if (head != tail)
    nfq_set_verdict_batch(qh, held[(tail - 1) % HELD_MAX].id, NF_ACCEPT);
  nfq_destroy_queue(qh);
  nfq_close(h);
  return 0;
}
