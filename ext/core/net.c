/* net.c - socket helpers (see net.h). Library code: errors come back as -errno
 * with a message, nothing is printed. */
#include "core/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int net_bind(int type, const char *bind_addr, int *port, int reuseport, int probe, const char *what, char *err,
             size_t errlen)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port)};
    if (inet_pton(AF_INET, bind_addr, &sa.sin_addr) != 1) {
        snprintf(err, errlen, "invalid bind address '%s': expected an IPv4 address such as 127.0.0.1", bind_addr);
        return -EINVAL;
    }
    int stream = (type & 0xf) == SOCK_STREAM; /* TCP: SO_REUSEADDR, or TIME_WAIT blocks a restart */
    int fd = -1, one = 1;
    if (probe) {
        /* SO_REUSEPORT would let us silently join another server's port (same
         * uid) and split its traffic. A plain bind first fails if anyone holds it. */
        fd = socket(AF_INET, (type & 0xf) | SOCK_CLOEXEC, 0);
        if (fd < 0)
            goto err;
        if (stream)
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa))
            goto err;
        close(fd);
    }
    fd = socket(AF_INET, type | SOCK_CLOEXEC, 0);
    if (fd < 0)
        goto err;
    if (stream)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one))
        goto err;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa))
        goto err;
    if (*port == 0) { /* later sockets must share the port the kernel picked */
        socklen_t sl = sizeof sa;
        getsockname(fd, (struct sockaddr *)&sa, &sl);
        *port = ntohs(sa.sin_port);
    }
    return fd;
err:;
    int e = errno;
    snprintf(err, errlen, "cannot %s %s:%d: %s", what, bind_addr, *port, strerror(e));
    if (fd >= 0)
        close(fd);
    return -e;
}

void net_peer_addr(int fd, char *dst, size_t n)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    char ip[INET_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) == 0 && sa.sin_family == AF_INET)
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
    else
        sa.sin_port = 0;
    snprintf(dst, n, "%s:%u", ip, (unsigned)ntohs(sa.sin_port));
}
