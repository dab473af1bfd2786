/* nbd_backend.c - the table of the block device's KV backends (see nbd_backend.h). */
#include "frontend/nbd_backend.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

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
    /* once per block operation: no snprintf */
    char digits[20];
    int nd = 0;
    do {
        digits[nd++] = (char)('0' + block % 10);
        block /= 10;
    } while (block);
    size_t pl = strlen(prefix);
    if (pl + (size_t)nd >= cap)
        return -ENAMETOOLONG;
    memcpy(dst, prefix, pl);
    for (int i = 0; i < nd; i++)
        dst[pl + (size_t)i] = digits[nd - 1 - i];
    dst[pl + (size_t)nd] = '\0';
    return (int)pl + nd;
}
