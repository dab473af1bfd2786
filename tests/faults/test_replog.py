"""The log shipping between a pair of nodes in `--durability remote` (ext/durability/replog.h,
ext/durability/REPLICATION.md): the sender falling back to local syncs when its peer is down or
stopped and catching it up after, the peer's copy fetched back (`recover --from-peer`, and at
every start in remote mode), and the receiver's protocol checks. Real processes, real faults
(SIGKILL, SIGSTOP, directories deleted), nothing mocked; the Pair and the writer model are in
helpers/pair.py. The loss of a machine or a process: test_remote_durability.py.
"""
import os
import re
import shutil
import signal
import time

import pytest

from helpers import replwire
from helpers.pair import FETCHED, PEER_TIMEOUT_MS, RECOVERED, Writers, cli, info, kv, read_node_id, stop_process, wait_for
from kvstore import Node

pytestmark = pytest.mark.timeout(120)


def degraded_writes(c, prefix, n, expect):
    """n SETs one by one in degraded mode (added to expect): most must not wait for the peer.
    Each one waiting out the peer timeout is the bug; a loaded machine slows some of them, so
    the check is on the fast half, not on a total time."""
    lat = []
    for i in range(n):
        t0 = time.monotonic()
        assert c.set(f"{prefix}{i}", f"v{i}") is True
        lat.append(time.monotonic() - t0)
        expect[f"{prefix}{i}".encode()] = f"v{i}".encode()
    fast = sum(dt < PEER_TIMEOUT_MS / 1000 for dt in lat)
    assert fast >= n // 2, f"degraded-mode writes kept waiting for the peer: {sorted(lat)}"
    return lat


# ---------------------------------------------------------------- 3. peer down

@pytest.mark.timeout(120)
def test_peer_down_writes_fall_back_to_local_sync_and_peer_catches_up(pair, tmp_path):
    pair.start_both()
    a = pair.nodes["a"]
    w = Writers("d:", nwriters=2, keys_per_writer=500)
    w.start(a.port)
    wait_for("writes acknowledged", lambda: w.total_acked() >= 200 or any(w.errors), timeout=60)
    t_kill = time.monotonic()
    pair.kill("b")
    time.sleep(1.5)  # writers keep going on A meanwhile (at least that long: longer on a loaded machine)
    wait_for("a write acknowledged after the kill",
             lambda: any(t0 >= t_kill for lw in w.lat for t0, _ in list(lw)) or any(w.errors))
    acked_at_kill = sum(1 for lw in w.lat for t0, _ in list(lw) if t0 >= t_kill)
    w.stop()
    assert not any(w.errors), f"writes to A failed while B was down: {w.errors}"
    after = [dt for lw in w.lat for t0, dt in lw if t0 >= t_kill]
    assert after, "no write was acknowledged after the peer went down"
    assert max(after) < 5.0, f"a write waited {max(after):.2f} s for a dead peer (timeout {PEER_TIMEOUT_MS} ms)"
    assert acked_at_kill > 0
    rep = wait_for("A to report the peer lost",
                   lambda: (lambda r: r if r["log_peer_degraded"] == 1 and r["log_peer_connected"] == 0 else None)(
                       info(a, "replication")))
    assert rep["log_peer_last_error"], rep
    # Further writes in degraded mode are acknowledged quickly, one by one.
    c = kv(a.port)
    extra = {}
    degraded_writes(c, "deg:", 30, extra)
    c.close()
    assert info(a, "persistence")["log_syncs"] > 0
    # Those writes are on A's disk: SIGKILL A and recover locally (B is still down).
    pair.kill("a")
    a = pair.start("a")
    assert RECOVERED.search(a.log()), a.log()
    w.verify(a.port, "after peer loss, then SIGKILL of A + local recovery", extra=extra)
    rep = info(a, "replication")
    assert rep["log_peer_degraded"] == 1 and rep["log_peer_connected"] == 0, rep
    c = kv(a.port)
    for i in range(30, 40):
        assert c.set(f"deg:{i}", f"v{i}") is True
        extra[f"deg:{i}".encode()] = f"v{i}".encode()
    c.close()
    catchup_before = info(a, "replication")["log_peer_catchup_records"]
    # B comes back: A reconnects, catches it up from its segment files, leaves degraded mode.
    pair.start("b")
    iw, ip, ir = pair.wait_in_sync("a")
    assert iw["log_peer_catchup_records"] > catchup_before, iw
    assert ir["log_receiver_held_lsn"] == ip["log_appended_lsn"]
    # And B's copy is complete: it rebuilds A's data set.
    check_peer_copy(pair, tmp_path / "fetched", a, w.all_keys() + list(extra))


def check_peer_copy(pair, tmp_dir, a, keys):
    """`kvstore recover --from-peer` into an empty dir, then a disk-mode node on it: the same
    data as A (on every key of keys, the keys the test wrote; kvstore has no KEYS/SCAN)."""
    r = cli("recover", "--data-dir", tmp_dir, "--from-peer", pair.addr("b"), "--repl-secret-file", pair.secret)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"keys: ([\d,]+)", r.stdout)
    assert m, r.stdout
    ca = kv(a.port)
    try:
        n = ca.dbsize()
        assert int(m.group(1).replace(",", "")) == n, (r.stdout, n)
        want = dict(zip(keys, ca.mget(keys)))
    finally:
        ca.close()
    node = Node(port=0, data_dir=str(tmp_dir), durability="disk", threads=1,
                log_path=str(tmp_dir) + ".stderr")
    node.start()
    try:
        cr = kv(node.port)
        got = dict(zip(keys, cr.mget(keys)))
        assert cr.dbsize() == n
        cr.close()
    finally:
        node.stop()
    diff = [k for k in keys if got.get(k) != want[k]]
    assert not diff, f"the peer's copy differs from A on {len(diff)} keys, e.g. {diff[:5]}"
    return r.stdout


# ---------------------------------------------------------------- 4. peer slow (stopped)

@pytest.mark.timeout(120)
def test_stopped_peer_times_out_into_degraded_mode_and_catches_up_after(pair, tmp_path):
    pair.start_both()
    a, b = pair.nodes["a"], pair.nodes["b"]
    c = kv(a.port)
    expect = {}
    for i in range(100):
        assert c.set(f"s:{i}", f"v{i}") is True
        expect[f"s:{i}".encode()] = f"v{i}".encode()
    pair.wait_in_sync("a")
    # on a loaded machine an ack may have been late already: start from a healthy link
    wait_for("A's link to its peer to be up", lambda: info(a, "replication")["log_peer_degraded"] == 0)
    try:
        stop_process(b.pid)  # kill() returning is not the peer stopped: it may still ack for a moment
        t0 = time.monotonic()
        assert c.set("s:slow", "x") is True  # socket timeout 10 s bounds the wait
        dt = time.monotonic() - t0
        expect[b"s:slow"] = b"x"
        assert dt < 5.0, f"a write waited {dt:.2f} s on a stopped peer (timeout {PEER_TIMEOUT_MS} ms)"
        assert dt > PEER_TIMEOUT_MS / 1000 * 0.5, f"acknowledged after {dt:.3f} s although the peer is stopped"
        rep = info(a, "replication")
        assert rep["log_peer_degraded"] == 1, rep
        # "did not acknowledge LSN ..." (or, once it retried, a failed handshake with the stopped peer)
        assert pair.addr("b") in rep["log_peer_last_error"], rep
        degraded_writes(c, "s2:", 50, expect)
        time.sleep(1.0)  # the sender keeps trying the stopped peer meanwhile
        assert info(a, "replication")["log_peer_degraded"] == 1
    finally:
        os.kill(b.pid, signal.SIGCONT)
    iw, ip, ir = pair.wait_in_sync("a")
    assert iw["log_peer_degraded"] == 0 and iw["log_peer_connected"] == 1
    for i in range(20):  # back in remote mode
        assert c.set(f"s3:{i}", f"z{i}") is True
        expect[f"s3:{i}".encode()] = f"z{i}".encode()
    c.close()
    pair.wait_in_sync("a")
    # B's copy is complete: lose machine A entirely and rebuild it from B.
    pair.kill("a")
    shutil.rmtree(pair.dirs["a"])
    a = pair.start("a", from_peer=True)
    assert FETCHED.search(a.log()), a.log()
    c = kv(a.port)
    keys = list(expect)
    got = dict(zip(keys, c.mget(keys)))
    assert c.dbsize() == len(expect)
    c.close()
    missing = [k for k in keys if got[k] != expect[k]]
    assert not missing, f"lost after SIGSTOP/SIGCONT of the peer: {missing[:10]}"


# ---------------------------------------------------------------- 5. the peer holds A's log

@pytest.mark.timeout(180)  # 1,500 writes, each waiting for the peer: ~5 s idle, several times that under load
def test_peer_holds_the_log_and_recover_from_peer_rebuilds_the_data(pair, tmp_path):
    pair.start_both()
    a = pair.nodes["a"]
    w = Writers("h:", nwriters=2, keys_per_writer=400)
    w.start(a.port, max_ops=1500)
    w.join(timeout=120)
    assert not any(w.errors), w.errors
    w.verify(a.port, "A itself")
    iw, ip, ir = pair.wait_in_sync("a")
    assert ir["log_receiver_held_lsn"] == iw["log_peer_acked_lsn"] == ip["log_appended_lsn"] > 0
    # B stores A's log under B/peer/<A's id>/ as ordinary segment files.
    a_id = read_node_id(pair.dirs["a"])
    pdir = os.path.join(pair.dirs["b"], "peer", a_id)
    segs = [n for n in os.listdir(pdir) if re.fullmatch(r"wal-[0-9a-f]{16}\.log", n)]
    assert segs, os.listdir(pdir)
    out = check_peer_copy(pair, tmp_path / "fetched", a, w.all_keys())
    assert f"up to LSN {ip['log_appended_lsn']} (local log ended at 0); it replaces the local log" in out, out
    assert read_node_id(str(tmp_path / "fetched")) == a_id
    expected_keys = sum(v is not None for v in w.model.values())
    assert re.search(rf"keys: {expected_keys:,}\b", out), out


# ---------------------------------------------------------------- 6. log lost, identity kept

def read_keys(port, keys):
    c = kv(port)
    try:
        return dict(zip(keys, c.mget(keys)))
    finally:
        c.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("new_writes", ["fewer", "more"])
def test_lost_log_with_identity_kept_never_loses_acknowledged_writes(pair, new_writes):
    """A's log directory is lost but its node-id remains; A restarts WITHOUT --from-peer.
    Remote mode compares logs with the peer at every start, so A comes back with its old
    writes and its new records continue after them (reusing LSNs would corrupt B's copy);
    then every acknowledged write, from before the loss and after it, must survive (a) a
    restart with --from-peer and (b) the loss of machine A, recovered from B's copy.
    new_writes: A acknowledges fewer / more new writes after the loss than the peer holds
    records of its old log."""
    pair.start_both()
    a = pair.nodes["a"]
    c = kv(a.port)
    acked = {}
    for i in range(100):
        assert c.set(f"old:{i}", f"o{i}") is True
        acked[f"old:{i}".encode()] = f"o{i}".encode()
    c.close()
    _, ip, _ = pair.wait_in_sync("a")
    n_old = ip["log_appended_lsn"]
    pair.kill("a")
    shutil.rmtree(os.path.join(pair.dirs["a"], "log"))
    a = pair.start("a")  # no --from-peer: remote mode compares with the peer at every start
    log = a.log()
    assert f"up to LSN {n_old} (local log ended at 0); it replaces the local log" in log, log
    # A is back with its old writes, and its new records continue after them (no LSN reuse).
    n_new = n_old // 2 if new_writes == "fewer" else n_old * 2
    c = kv(a.port)
    served = c.dbsize()
    for i in range(n_new):
        assert c.set(f"new:{i}", f"n{i}") is True
        acked[f"new:{i}".encode()] = f"n{i}".encode()
    c.close()
    _, ip, ir = pair.wait_in_sync("a")
    lsn_after = ip["log_appended_lsn"]
    assert lsn_after == n_old + n_new and ir["log_receiver_held_lsn"] == lsn_after, (ip, ir)
    story = [f"old log LSN 1..{n_old} held by B; A's log dir deleted, node-id kept; A restarted without "
             f"--from-peer, served {served} keys and acknowledged {n_new} new writes (LSN up to {lsn_after})"]
    problems = []
    if served != 100:
        problems.append(f"A served {served} keys after its restart, not the 100 it had acknowledged")

    def check(when, port, log):
        got = read_keys(port, list(acked))
        lost = {p: sorted(k for k in acked if k.startswith(p) and got[k] != acked[k]) for p in (b"old:", b"new:")}
        story.append(f"{when}: {(FETCHED.search(log) or [log.strip()])[0]}")
        if lost[b"old:"] or lost[b"new:"]:
            problems.append(f"{when}: acknowledged writes lost: {len(lost[b'old:'])} of {n_old} from before the "
                            f"log loss, {len(lost[b'new:'])} of {n_new} acknowledged after it "
                            f"(e.g. {(lost[b'old:'][:2] + lost[b'new:'][:2])})")

    # (a) A subsequent restart with --from-peer.
    pair.kill("a")
    a = pair.start("a", from_peer=True)
    check("restart with --from-peer", a.port, a.log())
    # (b) Then machine A is lost and rebuilt from B's copy.
    wait_for("A's sender to settle", lambda: info(a, "replication")["log_peer_last_error"] != ""
             or info(a, "replication")["log_peer_degraded"] == 0)
    pair.kill("a")
    shutil.rmtree(pair.dirs["a"])
    a = pair.start("a", from_peer=True)
    check("machine A lost, rebuilt with --from-peer", a.port, a.log())
    assert not problems, "\n  ".join(problems + ["-- what happened:"] + story)


# ---------------------------------------------------------------- receiver robustness

@pytest.mark.timeout(90)
def test_a_ghost_connection_does_not_lock_the_node_out(pair):
    """A connection that said HELLO with A's id and then went silent (a machine that
    vanished without a FIN) must not keep A's restarted sender from replicating; a
    second HELLO on one connection is a protocol error (no descriptor leak)."""
    pair.start_both()
    a = pair.nodes["a"]
    c = kv(a.port)
    c.set("before", "1")
    c.close()
    pair.wait_in_sync("a")
    with open(os.path.join(pair.dirs["a"], "node-id")) as f:
        nid = bytes.fromhex(f.read().strip())
    rport = pair.rport["b"]
    ghost = replwire.Link(rport).handshake(replwire.pair_key(), replwire.ROLE_SENDER, nid)
    ghost.send(replwire.HELLO, replwire.VERSION, 0, nid)  # HELLO as A, then silence
    assert ghost.recv()[0] == replwire.HELLO_ACK
    pair.kill("a")
    a = pair.start("a")
    c = kv(a.port)
    c.set("after", "2")
    c.close()
    _, ip, ir = pair.wait_in_sync("a")
    assert ir["log_receiver_held_lsn"] == ip["log_appended_lsn"]
    # the replaced ghost was closed by the receiver
    ghost.sock.settimeout(5)
    assert ghost.sock.recv(100) == b""
    ghost.close()
    # a repeated HELLO on one connection: closed, not served
    nid = os.urandom(16)
    s = replwire.Link(rport).handshake(replwire.pair_key(), replwire.ROLE_SENDER, nid)
    s.send(replwire.HELLO, replwire.VERSION, 0, nid)
    assert s.recv()[0] == replwire.HELLO_ACK
    s.send(replwire.HELLO, replwire.VERSION, 0, nid)
    s.sock.settimeout(5)
    assert s.sock.recv(100) == b""
    s.close()


# ---------------------------------------------------------------- sender wake-ups

def thread_switches(pid, name):
    """Context switches (voluntary + not) of pid's threads named name, from /proc."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except FileNotFoundError:
            continue
    return total


@pytest.mark.timeout(90)
def test_an_idle_sender_sleeps_until_a_write_and_ships_it(pair):
    """Caught up and idle, the log sender sleeps until an append wakes it (it used to wake
    every --ship-interval-us, 100 µs: thousands of times a second with nothing to do); a write
    then, and a MULTI unit (its COMMIT wakes the sender), are still shipped and acknowledged."""
    pair.start_both()
    a = pair.nodes["a"]
    c = kv(a.port)
    c.set("warm", "1")
    pair.wait_in_sync("a")
    time.sleep(0.3)  # past the catch-up: idle now
    s0, t0 = thread_switches(a.pid, "kv-logsend"), time.monotonic()
    time.sleep(1.0)
    s1, dt = thread_switches(a.pid, "kv-logsend"), time.monotonic() - t0
    # idle wake-ups: ~10 a second (IDLE_WAKE_US); a 100 µs timer gives thousands
    assert s1 - s0 < 500 * dt, f"the idle sender woke {s1 - s0} times in {dt:.1f} s"
    assert c.set("after-idle", "2") is True
    p = c.pipeline(transaction=True)
    p.set("unit-1", "a")
    p.set("unit-2", "b")
    assert p.execute() == [True, True]
    c.close()
    _, ip, ir = pair.wait_in_sync("a")
    assert ir["log_receiver_held_lsn"] == ip["log_appended_lsn"]
