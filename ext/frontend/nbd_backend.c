/* nbd_backend.c - the table of the block device's KV backends (see nbd_backend.h). */
#include "frontend/nbd_backend.h"

#include <errno.h>
#include <string.h>

#include "proto/resp.h"

static const struct nbd_backend_ops *const backends[] = {
    &nbd_be_embedded,
    &nbd_be_kvstore,
    &nbd_be_redis,
    &nbd_be_memcached,
};

const struct nbd_backend_ops *nbd_backend_find(const char *url)
{
    if (!url)
        return NULL;
    const char *sep = strstr(url, "://");
    size_t n = sep ? (size_t)(sep - url) : strlen(url);
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (strlen(backends[i]->scheme) == n && !strncmp(backends[i]->scheme, url, n))
            return backends[i];
    return NULL;
}

int nbd_key(char *dst, size_t cap, const char *prefix, uint64_t block)
{
    char digits[24]; /* once per block operation: no snprintf */
    int nd = resp_ll2str(digits, (long long)block); /* a block number is below 2^62 (nbd.c bounds the size) */
    size_t pl = strlen(prefix);
    if (pl + (size_t)nd >= cap)
        return -ENAMETOOLONG;
    memcpy(dst, prefix, pl);
    memcpy(dst + pl, digits, (size_t)nd);
    dst[pl + (size_t)nd] = '\0';
    return (int)pl + nd;
}
