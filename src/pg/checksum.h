/* CRC-32C (Castagnoli), the checksum of a state transfer (transfer.c). */
#ifndef UVCCL_PG_CHECKSUM_H
#define UVCCL_PG_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

/* Continues crc (0 to start) over p[0..n). */
uint32_t uvccl__crc32c(uint32_t crc, const void *p, size_t n);

#endif
