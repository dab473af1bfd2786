/* nbd_meta.c - the block device's record in its KV store (see nbd_backend.h):
 * what it holds against how the device is served now. Shared by every backend. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "frontend/nbd_backend.h"

int nbd_meta_check(const char *have, size_t have_len, const struct nbd_backend_cfg *cfg, char *rec, size_t cap,
                   char *err, size_t errlen)
{
    snprintf(rec, cap, "kvstore-blockdev size=%" PRIu64 " block_size=%" PRIu32, cfg->size, cfg->block_size);
    const char *prefix = cfg->key_prefix ? cfg->key_prefix : "";
    if (!have)
        return cfg->read_only ? 0 : 1;
    char text[NBD_META_MAX + 1];
    uint64_t size = 0;
    uint32_t bs = 0;
    int used = 0;
    if (have_len <= NBD_META_MAX) {
        memcpy(text, have, have_len);
        text[have_len] = 0;
    }
    char again[NBD_META_MAX + 1]; /* only the form this file writes: no sign, spaces, zeros or overflow */
    if (have_len > NBD_META_MAX ||
        sscanf(text, "kvstore-blockdev size=%" SCNu64 " block_size=%" SCNu32 "%n", &size, &bs, &used) != 2 ||
        (size_t)used != have_len ||
        snprintf(again, sizeof again, "kvstore-blockdev size=%" PRIu64 " block_size=%" PRIu32, size, bs) < 0 ||
        strcmp(again, text)) {
        snprintf(err, errlen, "key \"%s" NBD_META_SUFFIX "\" holds something other than a kvstore block device's "
                 "record: the key prefix \"%s\" is in use by other data; choose another key prefix (--key-prefix, "
                 "or --export for the default one)",
                 prefix, prefix);
        return -EINVAL;
    }
    if (bs != cfg->block_size || size > cfg->size) {
        snprintf(err, errlen, "the store holds a block device of %" PRIu64 " bytes in %" PRIu32 "-byte blocks "
                 "under key prefix \"%s\"; served as %" PRIu64 " bytes in %" PRIu32 "-byte blocks, %s. Serve it "
                 "with --size %" PRIu64 " --block-size %" PRIu32 " (or larger --size: a device may grow), or use "
                 "another key prefix (--key-prefix, or --export for the default one), or delete its keys (\"%s\" "
                 "followed by a block number, and \"%s" NBD_META_SUFFIX "\") to start over",
                 size, bs, prefix, cfg->size, cfg->block_size,
                 bs != cfg->block_size ? "its blocks would read garbled"
                                       : "its blocks past the new end would be out of reach",
                 size, bs, prefix, prefix);
        return -EINVAL;
    }
    if (size == cfg->size || cfg->read_only)
        return 0;
    kvlog(KVLOG_NOTICE, "blockdev: the device under key prefix \"%s\" is served larger: its record goes from %" PRIu64
          " to %" PRIu64 " bytes", prefix, size, cfg->size);
    return 1;
}
