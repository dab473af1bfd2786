"""A checking client of the UDP front end (--arch udp/dpdk), run as a script (inside a
test host's namespace for dpdk): SET then GET of each key with a window of requests in
flight, every reply matched by id and compared with the exact bytes expected; then odd
datagrams (too short, flagged, too large a reply, two requests in one). An unanswered
request is re-sent (after 0.5 s, backing off): the summary says how many datagrams went
out for how many requests, so that checks of the server's counters can allow for copies.
Prints a JSON summary. Usage: udp_client.py HOST PORT N WINDOW"""
import json
import socket
import struct
import sys
import time

RESEND_S = 0.5     # first re-send of an unanswered request; doubles up to RESEND_MAX_S
RESEND_MAX_S = 4.0
GIVE_UP_S = 30.0   # a request unanswered this long after its first send is lost
RUN_S = 80.0       # the whole run (check() waits 90 s for the process)


class Sender:
    """A connected UDP socket that counts every datagram sent: `requests` distinct request
    ids, `sent` datagrams. Each re-send (a lost datagram, or only a late reply on a loaded
    machine) reaches the server as one more request, so the server's udp_requests lies
    between the distinct requests and the datagrams sent."""

    def __init__(self, host, port):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.s.connect((host, port))
        self.s.settimeout(RESEND_S)
        self.ids, self.sent = set(), 0

    def send(self, rid, body, flags=0):
        self.s.send(struct.pack(">IHH", rid, 0, flags) + body)
        self.ids.add(rid)
        self.sent += 1

    def recv(self):
        """(id, seq, flags, reply) of the next datagram, or None after RESEND_S of silence."""
        try:
            r = self.s.recv(4096)
        except socket.timeout:
            return None
        rid, seq, flags = struct.unpack(">IHH", r[:8])
        return rid, seq, flags, r[8:]


def main():
    host, port, n, window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    s = Sender(host, port)
    reqs = []
    for i in range(n):
        k, v = b"dk:%06d" % i, b"value-%d-" % i + b"x" * (i % 50)
        reqs.append((b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v), b"+OK\r\n"))
    for i in range(n):
        k, v = b"dk:%06d" % i, b"value-%d-" % i + b"x" * (i % 50)
        reqs.append((b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k), b"$%d\r\n%s\r\n" % (len(v), v)))
    reqs.append((b"*2\r\n$3\r\nGET\r\n", None))  # malformed: an error reply with the ERROR flag
    ok, bad, lost, nxt = 0, [], 0, 0
    pending = {}  # id -> (first sent, last sent, wait before the next re-send)
    deadline = time.monotonic() + RUN_S
    while (nxt < len(reqs) or pending) and time.monotonic() < deadline:
        while nxt < len(reqs) and len(pending) < window and (nxt < n or not any(j < n for j in pending)):
            s.send(nxt, reqs[nxt][0])   # every SET answered before the first GET goes out
            now = time.monotonic()
            pending[nxt] = (now, now, RESEND_S)
            nxt += 1
        got = s.recv()
        now = time.monotonic()
        # Re-send what waited too long (idempotent here), backing off so that a server that is
        # only slow (flusher stall, loaded machine) is not flooded with copies.
        for i, (first, last, wait) in list(pending.items()):
            if now - first > GIVE_UP_S:
                del pending[i]
                lost += 1
            elif now - last > wait:
                s.send(i, reqs[i][0])
                pending[i] = (first, now, min(2 * wait, RESEND_MAX_S))
        if got is None:
            continue
        rid, seq, flags, body = got
        if rid not in pending:
            continue  # the reply to a copy of a request already answered
        del pending[rid]
        want = reqs[rid][1]
        if want is None:
            good = flags == 3 and body == b"-ERR invalid request: incomplete RESP request in datagram\r\n"
        else:
            good = flags == 1 and seq == 0 and body == want
        if good:
            ok += 1
        elif len(bad) < 5:
            bad.append([rid, flags, repr(body[:72])])
        else:
            bad.append(rid)
    # odd datagrams: too short and flagged ones are dropped; the others get exact error replies
    s.s.send(b"abc")
    s.s.send(struct.pack(">IHH", 900001, 0, 1) + b"*1\r\n$4\r\nPING\r\n")
    big = b"v" * 1400
    odd_reqs = {900005: b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$1400\r\n" + big + b"\r\n",
                900002: b"*3\r\n$4\r\nMGET\r\n$3\r\nbig\r\n$3\r\nbig\r\n",
                900003: b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n",
                900004: b"*1\r\n$4\r\nPING\r\n"}
    odd = {}
    end = time.monotonic() + GIVE_UP_S
    for group in ((900005,), (900002, 900003, 900004)):  # the SET first, then a reply too large
        for rid in group:
            s.send(rid, odd_reqs[rid])
        while time.monotonic() < end and not all(rid in odd for rid in group):
            got = s.recv()
            if got is None:  # re-send the unanswered ones (each is idempotent)
                for rid in group:
                    if rid not in odd:
                        s.send(rid, odd_reqs[rid])
                continue
            rid, seq, flags, body = got
            if rid >= 900000:  # 900001 (flagged) must stay unanswered: check() asserts it
                odd[rid] = [flags, body.decode()]
    odd.pop(900005, None)  # (were it unanswered, MGET would find no "big": check() sees that)
    print(json.dumps({"ok": ok, "bad": bad, "lost": lost, "unsent": len(reqs) - nxt, "total": len(reqs),
                      "odd": odd, "requests": len(s.ids), "sent": s.sent, "resent": s.sent - len(s.ids)}))


def check(run, node, host, port, n=3000):
    """Run this client (run: subprocess.run-like, possibly inside a namespace) and
    kvstore bench --udp --check against node's UDP front end at host:port; assert that
    every reply was right, and that the TCP control path sees the same table."""
    r = run([sys.executable, __file__, host, str(port), str(n), "32"], capture_output=True, text=True,
            timeout=90)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["bad"] == [] and res["unsent"] == 0, res
    assert res["lost"] == 0, res
    assert res["ok"] == res["total"] == 2 * n + 1
    odd = {int(k): v for k, v in res["odd"].items()}
    assert set(odd) == {900002, 900003, 900004}, odd  # 900001 (flagged) is dropped, unanswered
    assert odd[900002][0] == 3 and odd[900002][1].startswith("-ERR reply too large for a UDP datagram ("), odd
    assert odd[900003] == [3, "-ERR invalid request: more than one request in datagram\r\n"]
    assert odd[900004] == [1, "+PONG\r\n"]
    # the same table through the TCP control path
    with node.client(socket_timeout=30) as c:
        assert c.get("dk:000007") == b"value-7-" + b"x" * 7
        st = c.info("stats")
    # Every SET and GET, + SET big, MGET, PING (not the malformed one, nor two in one datagram),
    # each counted once it ran; a re-sent copy runs again, so up to res["resent"] more.
    counted = 2 * n + 3
    assert counted <= st["udp_requests"] <= counted + res["resent"], (st, res)
    assert st["udp_bad_frames"] == 2, st  # "abc" and the flagged one
    # The load generator's UDP mode, every reply verified. Its timeout is for lost datagrams;
    # 5 s keeps a reply that is only late (a loaded machine) from counting as one.
    bench = run([sys.executable, "-m", "kvstore.cli", "bench", "--udp", "--host", host, "-p", str(port), "-t", "1",
                 "-c", "4", "-P", "8", "-n", "20000", "--ratio", "1:1", "-r", "2000", "-d", "64", "--check",
                 "--timeout-ms", "5000", "--json"], capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0, bench.stderr
    b = json.loads(bench.stdout)
    assert b["errors"] == 0, b
    assert b["requests"] + b["timeouts"] == 20000
    assert b["timeouts"] <= 20, b  # a veth may lose a few datagrams, not more
    assert b["sets"] > 0 and b["hits"] > 0
    return st


if __name__ == "__main__":
    main()
