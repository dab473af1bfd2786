"""Fault injection for `--durability remote`: a symmetric pair of nodes, each the other's log peer.

    A: serve --repl-port RA --durability remote --peer 127.0.0.1:RB --data-dir A
    B: serve --repl-port RB --durability remote --peer 127.0.0.1:RA --data-dir B

A write is acknowledged once it is in this node's memory and the peer acked it
(ext/durability/REPLICATION.md). The faults are real: SIGKILL, SIGSTOP/SIGCONT, a data
directory deleted, a log directory deleted; the clients are real redis-py clients
(RESP2, no retries) and raw sockets; nothing is mocked.

Model of a writer (the loss-of-a-machine tests): several threads, each the only
writer of its own keys, one request in flight at a time. Every acknowledged write
is recorded; the single request in flight when the node died may or may not have
been applied. After recovery each key must hold its last acknowledged value, or
(for the one key per writer with a request in flight) the value that request
would have produced.

Every load is bounded in operations and in time; every wait has a deadline.
KVSTORE_FAULT_SEED=N changes the random kill points (default: fixed). The Pair and the
writer model are in helpers/pair.py; the log shipping protocol itself (sender, receiver,
fetch): test_replog.py.
"""
import random
import re
import shutil
import time

import pytest

from helpers.pair import (FETCHED, RECOVERED, SEED, Writers, b_writes, cli, info, kill_at_random_moment, kv,
                          read_node_id)

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- 1. loss of one machine

@pytest.mark.timeout(150)
def test_machine_loss_recovers_every_acknowledged_write_from_the_peer(pair):
    rng = random.Random(SEED)
    pair.start_both()
    b_keys = b_writes(pair)
    pair.wait_in_sync("b")
    a_id = read_node_id(pair.dirs["a"])
    w = Writers("m:")
    for it in range(3):
        w.start(pair.nodes["a"].port)
        kill_at_random_moment(rng, w)
        pair.kill("a")
        w.join()
        assert w.total_acked() > 0
        # The machine is gone: its whole data directory, identity included.
        shutil.rmtree(pair.dirs["a"])
        a = pair.start("a", from_peer=True)
        log = a.log()
        m = FETCHED.search(log)
        assert m, f"iteration {it}: no 'fetched the log' line:\n{log}"
        assert m.group(1) == pair.addr("b") and m.group(3) == "0" and m.group(4) == "it replaces the local log", log
        assert read_node_id(pair.dirs["a"]) == a_id, "the recovered node did not adopt its old identity"
        ip = info(a, "persistence")
        assert ip["durability"] == "remote"
        assert ip["log_appended_lsn"] == int(m.group(2)), (ip, log)
        w.verify(a.port, f"iteration {it} (seed {SEED}), after machine loss + --from-peer")
        # The recovered node replicates again (no LSN reuse refusal), and B's log, which
        # lived in the lost directory, is shipped to A again from B's own segments.
        pair.wait_in_sync("a")
        pair.wait_in_sync("b")
    b_info = info(pair.nodes["b"], "replication")
    assert b_info["log_peer_catchup_records"] > 0, b_info
    # B's own data was never touched.
    c = kv(pair.nodes["b"].port)
    try:
        assert dict(zip(b_keys, c.mget(list(b_keys)))) == b_keys
    finally:
        c.close()


def test_machine_loss_with_writes_over_the_udp_front_end(pair):
    """The UDP front end (--arch udp) acknowledges a write only once the peer's memory
    holds it too: the machine is lost (kill -9, directory deleted), and the node rebuilt
    from its peer holds every acknowledged write."""
    rng = random.Random(SEED + 1)
    pair.extra = dict(arch="udp", udp_port=0)
    pair.start_both()
    w = Writers("u:", udp=True)
    for it in range(2):
        w.start(pair.nodes["a"].udp_port)
        kill_at_random_moment(rng, w)
        st = info(pair.nodes["a"], "stats")
        assert st["udp_held_for_log"] > 0, st  # replies waited for the peer's ack
        pair.kill("a")
        w.join()
        shutil.rmtree(pair.dirs["a"])
        a = pair.start("a", from_peer=True)
        assert FETCHED.search(a.log()), a.log()
        w.verify(a.port, f"iteration {it} (seed {SEED + 1}), UDP writes, after machine loss + --from-peer")
        pair.wait_in_sync("a")


@pytest.mark.timeout(150)
def test_loss_of_either_machine_of_a_pair_writing_on_both_sides(pair):
    """Writers on both nodes. Machine B is lost (SIGKILL, data dir deleted) while A keeps
    writing: B is rebuilt from A's copy of its log, A ships its whole log to the new B
    (catch-up from LSN 1), and that copy then suffices to rebuild A after A's loss."""
    rng = random.Random(SEED + 2)
    pair.start_both()
    a, b = pair.nodes["a"], pair.nodes["b"]
    b_id = read_node_id(pair.dirs["b"])
    wa = Writers("ea:", nwriters=2, keys_per_writer=750)
    wb = Writers("eb:", nwriters=2, keys_per_writer=750)
    wa.start(a.port)
    wb.start(b.port)
    kill_at_random_moment(rng, wb)
    pair.kill("b")
    wb.join()
    shutil.rmtree(pair.dirs["b"])
    time.sleep(rng.uniform(0.2, 0.8))  # A writes on without its peer
    b = pair.start("b", from_peer=True)
    m = FETCHED.search(b.log())
    assert m and m.group(3) == "0" and m.group(4) == "it replaces the local log", b.log()
    assert read_node_id(pair.dirs["b"]) == b_id
    wb.verify(b.port, f"B after machine loss + --from-peer (seed {SEED + 2})")
    time.sleep(rng.uniform(0.1, 0.5))
    wa.stop()
    assert not any(wa.errors), f"writes to A failed while its peer was lost: {wa.errors}"
    iw, ip, ir = pair.wait_in_sync("a")
    assert iw["log_peer_catchup_records"] > 0, iw
    pair.wait_in_sync("b")
    wa.verify(a.port, "A, after its peer was lost and rebuilt")
    # Now lose A: the new B's copy of A's log (shipped again from scratch) must be complete.
    pair.kill("a")
    shutil.rmtree(pair.dirs["a"])
    a = pair.start("a", from_peer=True)
    assert FETCHED.search(a.log()), a.log()
    wa.verify(a.port, "A rebuilt from the rebuilt B's copy")
    pair.wait_in_sync("a")
    pair.wait_in_sync("b")
    wb.verify(b.port, "B at the end")


# ---------------------------------------------------------------- 2. process crash, disk kept

@pytest.mark.timeout(150)
def test_process_crash_local_recovery_holds_every_acknowledged_write(pair):
    rng = random.Random(SEED + 1)
    pair.start_both()
    w = Writers("p:")
    for it in range(3):
        w.start(pair.nodes["a"].port)
        kill_at_random_moment(rng, w)
        pair.kill("a")
        w.join()
        held_by_b = info(pair.nodes["b"], "replication")["log_receiver_held_lsn"]
        a = pair.start("a")  # same data dir, no --from-peer
        log = a.log()
        # The local log lags (it is written every disk_log_interval_ms): remote mode
        # compares it with the peer's copy at every start and takes the longer one.
        local_lsn = int(re.search(r"local log ended at (\d+)", log).group(1))
        if held_by_b > local_lsn:
            assert "it replaces the local log" in log, log
        assert RECOVERED.search(log), log
        recovered = info(a, "persistence")["log_appended_lsn"]
        try:
            w.verify(a.port, f"iteration {it} (seed {SEED + 1}), after SIGKILL + local recovery")
        except AssertionError as e:
            rep = info(a, "replication")
            raise AssertionError(
                f"{e}\n  local log recovered up to LSN {recovered}; the peer holds A's log up to LSN {held_by_b}; "
                f"A's sender: connected={rep['log_peer_connected']} degraded={rep['log_peer_degraded']} "
                f"last_error={rep['log_peer_last_error']!r}\n  A's stderr:\n{log}") from None
        pair.wait_in_sync("a")


# ---------------------------------------------------------------- 7. misconfiguration

@pytest.mark.timeout(60)
def test_remote_without_peer_is_refused(tmp_path):
    r = cli("serve", "--port", "0", "--durability", "remote", "--data-dir", tmp_path / "d", timeout=30)
    assert r.returncode != 0
    assert "listening on" not in r.stdout
    assert "--peer" in r.stderr, r.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("peer", ["nonsense", "127.0.0.1", "127.0.0.1:notaport", "127.0.0.1:0", "1.2.3:7380"])
def test_remote_with_malformed_peer_is_refused(tmp_path, peer):
    r = cli("serve", "--port", "0", "--durability", "remote", "--peer", peer, "--data-dir", tmp_path / "d",
            timeout=30)
    assert r.returncode != 0
    assert "listening on" not in r.stdout
    assert "peer" in r.stderr and peer in r.stderr, r.stderr
    assert re.search(r"\b(HOST|IPV4|IPv4):PORT\b", r.stderr), r.stderr  # the expected form
    assert re.search(r"\d+\.\d+\.\d+\.\d+:\d+", r.stderr), r.stderr  # with an example
