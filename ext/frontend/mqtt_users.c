/* mqtt_users.c - the MQTT password file (--mqtt-users): lines "user:hash" as
 * mosquitto_passwd writes them, so one file serves both brokers:
 *   $7$<iterations>$<base64 salt>$<base64 PBKDF2-HMAC-SHA512(password, salt)>
 *   $6$<base64 salt>$<base64 SHA-512(password || salt)>   (mosquitto's older form)
 * Empty lines and lines starting with '#' are skipped; anything else that is not one
 * of these refuses the start, naming the line. Read once when the broker is created;
 * checked (constant time) per CONNECT on any poller: read-only after load. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "frontend/mqtt_int.h"

#define MAX_USERS 100000
#define MAX_ITERATIONS 10000000

struct mq_user {
    char *name;
    int kind;                    /* 6 or 7 */
    int iterations;
    unsigned char salt[64], hash[64];
    size_t saltlen, hashlen;
};

struct mq_users {
    struct mq_user *v;
    size_t n;
};

/* base64 (with padding) into out[cap]: its length, or -1. */
static int b64(const char *s, size_t n, unsigned char *out, size_t cap)
{
    unsigned char tmp[128];
    if (n == 0 || n % 4 || n / 4 * 3 > sizeof tmp)
        return -1;
    int len = EVP_DecodeBlock(tmp, (const unsigned char *)s, (int)n);
    if (len < 0)
        return -1;
    for (size_t i = n; i > 0 && s[i - 1] == '='; i--)
        len--; /* EVP_DecodeBlock counts the padding as bytes */
    if ((size_t)len > cap)
        return -1;
    memcpy(out, tmp, (size_t)len);
    return len;
}

/* "$7$it$salt$hash" or "$6$salt$hash" into u: 0, or -1. */
static int parse_hash(char *h, struct mq_user *u)
{
    char *part[5];
    int n = 0;
    for (char *p = h; n < 5; n++) {
        part[n] = p;
        char *d = strchr(p, '$');
        if (!d) {
            n++;
            break;
        }
        *d = 0;
        p = d + 1;
    }
    if (part[0][0])
        return -1; /* it starts with '$' */
    int sl, hl;
    if (n == 5 && !strcmp(part[1], "7")) {
        char *end;
        long it = strtol(part[2], &end, 10);
        if (*end || it < 1 || it > MAX_ITERATIONS)
            return -1;
        u->kind = 7;
        u->iterations = (int)it;
        sl = b64(part[3], strlen(part[3]), u->salt, sizeof u->salt);
        hl = b64(part[4], strlen(part[4]), u->hash, sizeof u->hash);
    } else if (n == 4 && !strcmp(part[1], "6")) {
        u->kind = 6;
        sl = b64(part[2], strlen(part[2]), u->salt, sizeof u->salt);
        hl = b64(part[3], strlen(part[3]), u->hash, sizeof u->hash);
    } else {
        return -1;
    }
    if (sl <= 0 || hl != 64)
        return -1;
    u->saltlen = (size_t)sl;
    u->hashlen = (size_t)hl;
    return 0;
}

void mq_users_free(struct mq_users *us)
{
    if (!us)
        return;
    for (size_t i = 0; i < us->n; i++) {
        OPENSSL_cleanse(us->v[i].hash, sizeof us->v[i].hash);
        free(us->v[i].name);
    }
    free(us->v);
    free(us);
}

int mq_users_load(const char *path, struct mq_users **out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        int rc = -errno;
        snprintf(err, errlen, "mqtt-users: cannot read %s: %s", path, strerror(errno));
        return rc;
    }
    struct mq_users *us = calloc(1, sizeof *us);
    char line[1024];
    int lineno = 0, rc = us ? 0 : -ENOMEM;
    size_t cap = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strcspn(line, "\r\n");
        if (line[len] == 0 && !feof(f)) {
            snprintf(err, errlen, "mqtt-users: %s line %d is longer than %zu bytes", path, lineno, sizeof line - 2);
            rc = -EINVAL;
            break;
        }
        line[len] = 0;
        if (!line[0] || line[0] == '#')
            continue;
        char *colon = strchr(line, ':');
        if (us->n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            struct mq_user *v = nc <= MAX_USERS ? realloc(us->v, nc * sizeof *v) : NULL;
            if (!v) {
                snprintf(err, errlen, "mqtt-users: %s: more than %d users, or out of memory", path, MAX_USERS);
                rc = -ENOMEM;
                break;
            }
            us->v = v;
            cap = nc;
        }
        struct mq_user *u = &us->v[us->n];
        memset(u, 0, sizeof *u);
        if (!colon || colon == line || parse_hash(colon + 1, u)) {
            snprintf(err, errlen, "mqtt-users: %s line %d: expected user:$7$iterations$salt$hash or user:$6$salt$hash "
                                  "(as mosquitto_passwd writes them)", path, lineno);
            rc = -EINVAL;
            break;
        }
        *colon = 0;
        if (!(u->name = strdup(line))) {
            rc = -ENOMEM;
            break;
        }
        us->n++;
    }
    fclose(f);
    OPENSSL_cleanse(line, sizeof line);
    if (rc) {
        mq_users_free(us);
        return rc;
    }
    *out = us;
    return 0;
}

int mq_users_check(const struct mq_users *us, const void *user, size_t ulen, const void *pass, size_t plen)
{
    for (size_t i = 0; i < us->n; i++) {
        const struct mq_user *u = &us->v[i];
        if (strlen(u->name) != ulen || memcmp(u->name, user, ulen))
            continue;
        unsigned char got[64];
        int ok;
        if (u->kind == 7) {
            ok = PKCS5_PBKDF2_HMAC(pass, (int)plen, u->salt, (int)u->saltlen, u->iterations, EVP_sha512(), 64, got);
        } else {
            EVP_MD_CTX *ctx = EVP_MD_CTX_new();
            unsigned int n = 0;
            ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha512(), NULL) && EVP_DigestUpdate(ctx, pass, plen) &&
                 EVP_DigestUpdate(ctx, u->salt, u->saltlen) && EVP_DigestFinal_ex(ctx, got, &n) && n == 64;
            EVP_MD_CTX_free(ctx);
        }
        int match = ok && CRYPTO_memcmp(got, u->hash, 64) == 0;
        OPENSSL_cleanse(got, sizeof got);
        return match;
    }
    return 0;
}
