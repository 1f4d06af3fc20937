#include "internal.h"

#include <time.h>

uint64_t uvccl__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t uvccl__now_ms(void) { return uvccl__now_ns() / 1000000u; }
