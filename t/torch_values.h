/* The values the PyTorch interoperability tests exchange, the same bytes
 * as the Python helpers build (big_value and BINARY in
 * t/torch_modern_client.py and t/py/torch_store_client.py): 1 MiB with a
 * NUL every 4 KiB, and every byte value followed by NULs. Header-only. */
#ifndef UVCCL_T_TORCH_VALUES_H
#define UVCCL_T_TORCH_VALUES_H

#include <string.h>

#define BIG_LEN (1 << 20)
static unsigned char big[BIG_LEN];
static unsigned char binary[260];

static inline void make_values(void) {
  int i;
  for (i = 0; i < BIG_LEN; i++) big[i] = (unsigned char)((i * 7 + 3) % 251);
  for (i = 0; i < BIG_LEN; i += 4096) big[i] = 0;
  for (i = 0; i < 256; i++) binary[i] = (unsigned char)i;
  memcpy(binary + 256, "\0\0x\0", 4);
}

#endif
