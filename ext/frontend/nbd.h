/* nbd.h - a block device over the key-value store, served by the NBD protocol
 * (paper 001: key = block number, value = one block).
 *
 * An NBD server (newstyle fixed handshake, multi-conn) whose threads each run an
 * epoll loop over their client connections and over their own connections to the
 * KV backend (nbd_backend.h): "embedded" (the engine in this process, no network),
 * or a kvstore node, Redis or memcached over the network. A request is split into
 * block operations (a 128 KiB READ of 4 KiB blocks = 32 KV GETs, pipelined) and
 * its reply reassembled from their completions; an unaligned write is a
 * read-modify-write of its edge blocks, serialized against every other write of
 * those blocks (on any connection, any thread). A block never written, trimmed or
 * zeroed is absent from the KVS and reads as zeros.
 * The protocol bytes are parsed by proto/nbd.h (untrusted input, bounded).
 * Threads: nbd_create/start/stop/destroy on the control thread; the stats getter
 * from any thread (relaxed counters).
 */
#ifndef KV_NBD_H
#define KV_NBD_H

#include <stddef.h>
#include <stdint.h>

struct kv_engine;
struct nbd_server;

#define NBD_MAX_THREADS 64
#define NBD_MAX_CONNS_PER_THREAD 16

/* What the control plane (Python: kvstore.BlockDevice, `kvstore blockdev serve`)
 * fills. nbd_create copies every string; the struct may go away afterwards. */
struct nbd_config {
    const char *bind;         /* IPv4 address of the TCP listener, e.g. "127.0.0.1" */
    int port;                 /* TCP port; 0 = any free port; -1 = no TCP listener */
    const char *unix_path;    /* unix socket path, or NULL / "" = none (at least one listener) */
    const char *export_name;  /* the one export's name ("" from a client means this one) */
    const char *description;  /* NBD_INFO_DESCRIPTION, or NULL */
    uint64_t size;            /* device size in bytes, > 0, a multiple of block_size */
    uint32_t block_size;      /* bytes per KV value: a power of two from 512 to 1 MiB */
    int threads;              /* worker threads (each its own epoll loop), 1..NBD_MAX_THREADS */
    int conns_per_thread;     /* network backends: KV connections per thread, 1..NBD_MAX_CONNS_PER_THREAD */
    int read_only;            /* 1: NBD_FLAG_READ_ONLY, writes get EPERM */
    int max_clients;          /* NBD connections beyond this are closed at accept */
    const char *backend;      /* "embedded", "kvstore://[:PASSWORD@]HOST:PORT",
                                 "redis://[:PASSWORD@]HOST:PORT[/DB]", "memcached://HOST:PORT" */
    const char *key_prefix;   /* prefix of every block's key; the key is prefix + the block
                                 number in decimal, e.g. "nbd:disk:" + "1234" */
    /* TLS (NBD_OPT_STARTTLS; all zero/NULL = off). x509: the server presents
     * tls_cert_file/tls_key_file; tls_auth_clients ("yes" (NULL too), "no", "optional",
     * as the node's setting) says whether a client must present a certificate that
     * chains to tls_ca_cert_file. PSK instead: tls_psk_file, lines "identity:hexkey" (nbdkit's
     * --tls-psk, GnuTLS psktool's format); no certificate then. */
    int tls;                  /* NBD_TLS_OFF, NBD_TLS_ON (offered), NBD_TLS_REQUIRE (every
                                 option but STARTTLS and ABORT refused before it) */
    const char *tls_cert_file, *tls_key_file, *tls_ca_cert_file, *tls_psk_file;
    const char *tls_auth_clients;
    /* A TCP listener on an address other than loopback (127.0.0.0/8) without
     * NBD_TLS_REQUIRE lets anyone who reaches it read and write the device: refused
     * unless this is set (Redis's "protected-mode no"). */
    int allow_plain_remote;
    /* After a round that did work, poll the thread's sockets without sleeping
     * for up to this many microseconds (0 = always sleep in epoll_wait): at queue
     * depth 1 the client's next request arrives a few microseconds after the
     * reply, and a sleep and wake-up costs more than that. Not while requests
     * wait for a network backend, and not again after a few windows in a row
     * found nothing (nbd_conn.c's next_events), so an idle or slow client costs
     * no CPU. 0..NBD_MAX_BUSY_POLL_US. */
    int busy_poll_us;
};

#define NBD_MAX_BUSY_POLL_US 1000

enum { NBD_TLS_OFF = 0, NBD_TLS_ON = 1, NBD_TLS_REQUIRE = 2 };

/* Counters (relaxed, monotonic since start unless said). */
struct nbd_stats {
    uint64_t connections, total_connections, rejected_connections, protocol_errors;
    uint64_t reads, writes, flushes, trims, zeroes, fua, errors;   /* NBD requests by kind */
    uint64_t bytes_read, bytes_written;
    uint64_t kv_gets, kv_puts, kv_dels, kv_syncs;                  /* backend operations */
    uint64_t rmw;                                                  /* writes that read-modified-wrote */
    uint64_t inflight;             /* NBD requests accepted and not yet replied (now) */
    uint64_t inflight_sum, inflight_samples; /* queue depth: sum and count of samples */
    uint64_t backend_errors, backend_reconnects;
};

/* Create the server: parse and check cfg (errors name the setting and what is
 * accepted), bind the listeners, connect the backend (embedded: eng, which must
 * outlive the server; network: eng NULL, each thread's connections are opened
 * here so that a wrong address or password fails now, with its message).
 * Nothing runs until nbd_start. 0 or -errno with a message in err. */
int nbd_create(struct nbd_server **out, const struct nbd_config *cfg, struct kv_engine *eng, char *err,
               size_t errlen);
/* Start the threads. 0 or -errno with a message (what started is stopped). */
int nbd_start(struct nbd_server *s, char *err, size_t errlen);
/* Stop and join the threads: no more input is read; the requests in flight get
 * up to 2 s (NBD_DRAIN_MS) to finish and be answered; what remains is dropped
 * with its connection. Idempotent. */
void nbd_stop(struct nbd_server *s);
void nbd_destroy(struct nbd_server *s);
/* The TCP port bound (the one picked for port 0), or -1 without a TCP listener. */
int nbd_port(const struct nbd_server *s);
void nbd_get_stats(struct nbd_server *s, struct nbd_stats *st);

#endif
