/* net.h - socket helpers shared by every front end (TCP listeners, UDP sockets):
 * binding with a probe against silently sharing someone else's port, and the
 * peer's address for CLIENT INFO. Control thread (bind) or any thread (addr). */
#ifndef KV_NET_H
#define KV_NET_H

#include <stddef.h>

/* A socket of type (SOCK_STREAM or SOCK_DGRAM, | SOCK_NONBLOCK) bound to bind_addr:*port,
 * with SO_REUSEPORT if reuseport (and SO_REUSEADDR for TCP). probe: first bind once without
 * SO_REUSEPORT, so that a port someone holds is refused rather than silently shared. *port 0
 * becomes the port the kernel picked. Returns the fd, or -errno with "cannot <what> addr:port:
 * reason" in err. */
int net_bind(int type, const char *bind_addr, int *port, int reuseport, int probe, const char *what, char *err,
             size_t errlen);

/* "ip:port" of the peer of a connected IPv4 socket ("?:0" if unknown) into dst. */
void net_peer_addr(int fd, char *dst, size_t n);

#endif
