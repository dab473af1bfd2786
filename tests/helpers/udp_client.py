"""A checking client of the UDP front end (--arch udp/dpdk), run as a script (inside a
test host's namespace for dpdk): SET then GET of each key with a window of requests in
flight, every reply matched by id and compared with the exact bytes expected; then odd
datagrams (too short, flagged, too large a reply, two requests in one). Prints a JSON
summary. Usage: udp_client.py HOST PORT N WINDOW"""
import json
import socket
import struct
import sys
import time


def main():
    host, port, n, window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((host, port))
    s.settimeout(0.5)
    reqs = []
    for i in range(n):
        k, v = b"dk:%06d" % i, b"value-%d-" % i + b"x" * (i % 50)
        reqs.append((b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, len(v), v), b"+OK\r\n"))
    for i in range(n):
        k, v = b"dk:%06d" % i, b"value-%d-" % i + b"x" * (i % 50)
        reqs.append((b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k), b"$%d\r\n%s\r\n" % (len(v), v)))
    reqs.append((b"*2\r\n$3\r\nGET\r\n", None))  # malformed: an error reply with the ERROR flag
    ok, bad, lost, pending, nxt = 0, [], 0, {}, 0
    deadline = time.monotonic() + 60
    def send(i):
        s.send(struct.pack(">IHH", i, 0, 0) + reqs[i][0])
        pending[i] = (time.monotonic(), 0)
    while (nxt < len(reqs) or pending) and time.monotonic() < deadline:
        while nxt < len(reqs) and len(pending) < window and (nxt < n or not any(j < n for j in pending)):
            send(nxt); nxt += 1   # every SET answered before the first GET goes out
        try:
            r = s.recv(4096)
        except socket.timeout:
            for i, (t, tries) in list(pending.items()):  # a lost datagram: resend (idempotent here)
                if tries >= 3:
                    del pending[i]; lost += 1
                else:
                    send(i); pending[i] = (time.monotonic(), tries + 1)
            continue
        rid, seq, flags = struct.unpack(">IHH", r[:8])
        if rid not in pending:
            continue
        del pending[rid]
        want = reqs[rid][1]
        if want is None:
            good = flags == 3 and r[8:] == b"-ERR invalid request: incomplete RESP request in datagram\r\n"
        else:
            good = flags == 1 and seq == 0 and r[8:] == want
        if good:
            ok += 1
        elif len(bad) < 5:
            bad.append([rid, flags, repr(r[8:80])])
        else:
            bad.append(rid)
    # odd datagrams: too short and flagged ones are dropped; the others get exact error replies
    s.send(b"abc")
    s.send(struct.pack(">IHH", 900001, 0, 1) + b"*1\r\n$4\r\nPING\r\n")
    big = b"v" * 1400
    s.send(struct.pack(">IHH", 900005, 0, 0) + b"*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n$1400\r\n" + big + b"\r\n")
    while struct.unpack(">I", s.recv(4096)[:4])[0] != 900005:  # the SET first, then a reply too large
        pass
    s.send(struct.pack(">IHH", 900002, 0, 0) + b"*3\r\n$4\r\nMGET\r\n$3\r\nbig\r\n$3\r\nbig\r\n")
    s.send(struct.pack(">IHH", 900003, 0, 0) + b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n")
    s.send(struct.pack(">IHH", 900004, 0, 0) + b"*1\r\n$4\r\nPING\r\n")
    odd, end = {}, time.monotonic() + 1.0
    while time.monotonic() < end:
        try:
            r = s.recv(4096)
        except socket.timeout:
            break
        rid, seq, flags = struct.unpack(">IHH", r[:8])
        if rid >= 900000:
            odd[rid] = [flags, r[8:].decode()]
            if len(odd) == 3:
                break
    print(json.dumps({"ok": ok, "bad": bad, "lost": lost, "unsent": len(reqs) - nxt, "total": len(reqs), "odd": odd}))



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
    with node.client(socket_timeout=5) as c:
        assert c.get("dk:000007") == b"value-7-" + b"x" * 7
        st = c.info("stats")
    assert st["udp_requests"] == 2 * n + 3 and st["udp_bad_frames"] == 2, st  # + SET, MGET, PING; "abc", flagged
    # the load generator's UDP mode, every reply verified
    bench = run([sys.executable, "-m", "kvstore.cli", "bench", "--udp", "--host", host, "-p", str(port), "-t", "1",
                 "-c", "4", "-P", "8", "-n", "20000", "--ratio", "1:1", "-r", "2000", "-d", "64", "--check",
                 "--json"], capture_output=True, text=True, timeout=90)
    assert bench.returncode == 0, bench.stderr
    b = json.loads(bench.stdout)
    assert b["errors"] == 0, b
    assert b["requests"] + b["timeouts"] == 20000
    assert b["timeouts"] <= 20, b  # a veth on a loaded machine may lose a few datagrams, not more
    assert b["sets"] > 0 and b["hits"] > 0
    return st


if __name__ == "__main__":
    main()
