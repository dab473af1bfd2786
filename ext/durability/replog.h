/* replog.h - synchronous log replication into a peer's memory (paper 000's remote logging).
 *
 * Sender (one thread per node in remote mode): at most every interval_us, and
 * once the previous batch is acknowledged (one batch in flight: the batch grows
 * with the round trip), it takes the records appended since the last round
 * (wal_ship_peek: in place in the log's memory, the same copy the log thread
 * writes to disk) and ships them in BATCH frames of at most max_batch_records;
 * idle, it sleeps until an append wakes it (wal_ship_sleep). The peer's ACK frames carry the
 * highest LSN it holds, which becomes the durable LSN (wal_publish_durable), so
 * a write is acknowledged once both memories hold it. If an ack is overdue by
 * timeout_ms, or the peer cannot be reached, the sender falls back: the local
 * log syncs every group (disk mode) until the peer is back and caught up from
 * the local segment files. Receiver (one thread per node that serves as a
 * peer): stores each sender's records, verbatim, as segment files under
 * <peer_dir>/<node id>/ (write() = in the peer's memory, the page cache; synced
 * to its disk every sync_ms), acks, and streams them back to a recovering node
 * (FETCH). Every connection starts with a handshake in which both ends prove
 * they hold the pair's key (derived from --repl-secret-file); every later frame
 * carries a MAC under a per-connection session key and a sequence number. The
 * wire format is described in ext/durability/REPLICATION.md. Frames come from
 * the network: lengths, CRCs and MACs are checked before use.
 */
#ifndef KV_REPLOG_H
#define KV_REPLOG_H

#include <stddef.h>
#include <stdint.h>

struct wal;
struct rl_sender;
struct rl_receiver;

/* --repl-tls: the PEM files of this node's certificate, its key and the CA the
 * peer's certificate must chain to (the RESP port's --tls-* files). Every
 * replication connection then runs inside TLS and both ends present and verify a
 * certificate; the handshake and MACs below still run inside it. cert_file NULL
 * or "": plain TCP. */
struct rl_tls_files {
    const char *cert_file, *key_file, *ca_file;
};

struct rl_sender_config {
    const char *host;          /* the peer's receiver, IPv4 */
    int port;
    uint8_t node_id[16];       /* names this node's log at the peer */
    uint8_t key[32];           /* the pair's key: SHA-256 of the replication secret file */
    uint32_t interval_us;      /* ship at most this often (default 100); a batch waits for the
                                  previous one's ack at most 10 intervals */
    uint32_t max_batch_records;/* at most this many records per BATCH frame (default 65536) */
    uint32_t timeout_ms;       /* an ack overdue this long = peer lost (default 1000) */
    struct rl_tls_files tls;   /* --repl-tls (files read at start: an error fails rl_sender_start) */
};

struct rl_sender_stats {
    uint64_t batches, records, bytes, acked_lsn, sent_lsn;
    uint64_t connects, disconnects, catchup_records;
    uint64_t auth_failures;    /* handshakes that failed (a wrong secret, or not the peer; TLS or HMAC) */
    int connected, degraded;   /* degraded: local per-group sync in place of the peer */
    char last_error[256];
};

int rl_sender_start(struct rl_sender **out, struct wal *w, const struct rl_sender_config *cfg,
                    char *err, size_t errlen);
void rl_sender_stop(struct rl_sender *s);
void rl_sender_get_stats(struct rl_sender *s, struct rl_sender_stats *st);

struct rl_receiver_stats {
    uint64_t batches, records, bytes, held_lsn, syncs, fetches;
    uint64_t auth_failures;    /* connections refused: failed TLS or HMAC handshake, bad MAC, out of role */
    int peers_connected;
};

/* Listen on bind:port (port 0 = any; see rl_receiver_port) and store peers' logs
 * under peer_dir. sync_ms: how often the stored logs are synced to disk. key:
 * the pair's key (32 bytes); a connection that does not prove it holds it is
 * refused (an ERROR frame) and logged. tls: --repl-tls (NULL or no cert_file:
 * plain TCP); a connection without a certificate the CA verifies is refused too. */
int rl_receiver_start(struct rl_receiver **out, const char *bind, int port, const char *peer_dir,
                      uint32_t sync_ms, const uint8_t *key, const struct rl_tls_files *tls, char *err,
                      size_t errlen);
int rl_receiver_port(struct rl_receiver *r);
/* This node's own id (16 bytes; any thread, once it is known: the identity may
 * be adopted from the peer after the receiver started). The receiver then
 * refuses a handshake naming it: a connection from this very node (its sender
 * redirected to its own --repl-port, a reflection) must never be acknowledged
 * as if another machine held the log. */
void rl_receiver_set_self(struct rl_receiver *r, const uint8_t node_id[16]);
void rl_receiver_stop(struct rl_receiver *r);
void rl_receiver_get_stats(struct rl_receiver *r, struct rl_receiver_stats *st);

/* Recovery: fetch the copy of node_id's log that the peer at host:port holds
 * into dest_dir (created; segment files as the peer has them). An all-zero
 * node_id asks for the only log the peer holds and is set to that log's id.
 * key: the pair's key (32 bytes), proved in the handshake. tls: --repl-tls (NULL:
 * plain TCP). Returns the highest LSN fetched (0 if the peer holds nothing) or
 * -errno with a message. */
int64_t rl_fetch(const char *host, int port, const uint8_t *key, uint8_t node_id[16], const char *dest_dir,
                 uint32_t timeout_ms, const struct rl_tls_files *tls, char *err, size_t errlen);

#endif
