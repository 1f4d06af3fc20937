/* Byte counts on the command line of the tools: a decimal number with an
 * optional binary suffix (4, 64K, 512M, 1G; "KiB" and "KB" read as K). */
#ifndef UVCCL_TOOLS_SIZE_ARG_H
#define UVCCL_TOOLS_SIZE_ARG_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* 0 with *out set, or -1 if s is not such a count or exceeds max. */
static int parse_size_arg(const char *s, uint64_t max, uint64_t *out) {
  char *end;
  unsigned long long v;
  unsigned shift = 0;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno != 0 || end == s || s[0] == '-') return -1;
  switch (*end) {
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  default: break;
  }
  if (*end == 'i' && shift != 0) end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end != '\0' || (shift != 0 && v > (UINT64_MAX >> shift)) ||
      ((uint64_t)v << shift) > max)
    return -1;
  *out = (uint64_t)v << shift;
  return 0;
}

#endif
