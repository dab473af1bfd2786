/* replog_gen.c - the load for the log batching experiment (experiments/
 * fig4_log_batching.py): n records of a given size appended to a log from one
 * thread, as fast as the log takes them, through the log's own append function
 * (see replog_gen.h). Benchmark code, not part of the server. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/replog_gen.h"
#include "durability/wal.h" /* the record layout: WAL_HDR, WAL_TRAILER, WAL_SET */

int64_t rl_generate(kvt_log_fn append, void *arg, uint64_t n, uint32_t record_bytes)
{
    if (record_bytes < WAL_HDR + WAL_TRAILER + 17 || record_bytes > 1u << 20)
        return -EINVAL;
    uint32_t vlen = record_bytes - WAL_HDR - WAL_TRAILER - 16;
    char key[17], *val = malloc(vlen);
    if (!val)
        return -ENOMEM;
    memset(val, 'v', vlen);
    int64_t last = 0;
    for (uint64_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "dev:%012llu", (unsigned long long)i);
        int64_t lsn;
        while ((lsn = append(arg, WAL_SET, key, 16, val, vlen, NULL, 0, 0)) == -EAGAIN)
            usleep(50); /* backlog full: the sender (or the disk) is behind */
        if (lsn < 0) {
            free(val);
            return lsn;
        }
        last = lsn;
    }
    free(val);
    return last;
}
