/* crc32c.h - CRC-32C (Castagnoli), the checksum of log records, log batches and data blocks.
 * Uses the SSE4.2 crc32 instruction when the CPU has it, a table otherwise. Thread-safe. */
#ifndef KV_CRC32C_H
#define KV_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continue a CRC: crc32c(0, p, n) starts one; crc32c(crc32c(0, a, n), b, m) == crc of a||b. */
uint32_t crc32c(uint32_t crc, const void *p, size_t n);

#endif
