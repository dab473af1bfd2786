"""A node's identity and its empty starts (issue 12, item 2): a remote-mode node with no local
state never serves (nor takes writes under a new identity) until it has its state back.

  - lost disk, peer down: A is killed (-9) and its data dir deleted while B is down too; A
    starts, listens, answers INFO (loading:1, what it waits for) but refuses PING (as Redis
    does while loading), reads and writes with -LOADING; B comes back; A fetches its log, adopts its old identity and
    serves every acknowledged write.
  - no new node without --init: a node with an empty data dir whose peer holds nothing
    for it refuses to start, saying --init makes a new node.
  - --init refused when the peer holds this pair's node's log; --node-id recovers it.
  - --node-id that contradicts the data dir's identity is refused.

The faults are real (SIGKILL, rm -rf of the data dir); the Pair and the writer model are
helpers/pair.py's. Every wait has a deadline; loads are bounded in operations and time.
"""
import os
import random
import shutil

import pytest
import redis

from helpers.conn import Raw
from helpers.pair import SEED, Writers, info, kill_at_random_moment, kv, read_node_id, wait_for

pytestmark = pytest.mark.timeout(180)


def call(node, *args):
    with Raw(node.port, timeout=10) as r:
        return r.call(*args)


def refusal(node, timeout=60):
    """The start's end: the process exits by itself (non-zero) with the reason in its log."""
    try:
        rc = node.proc.wait(timeout)
    except Exception:
        node.kill()
        raise AssertionError(f"the node kept running; its log:\n{node.log()}") from None
    return rc, node.log()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("arch", ["poller", "threadpool"])
def test_lost_disk_with_peer_down_refuses_then_recovers_every_acknowledged_write(pair, arch):
    rng = random.Random(SEED)
    if arch == "threadpool":  # the log attached later must wake the pool's workers too
        pair.extra = dict(arch="threadpool", threads=8)
    pair.start_both()
    a_id = read_node_id(pair.dirs["a"])
    w = Writers("id:", nwriters=4, keys_per_writer=500)
    w.start(pair.nodes["a"].port, max_ops=40000, max_seconds=40)
    kill_at_random_moment(rng, w, min_acked=10000, low=0.2, high=1.0)
    pair.kill("a")
    w.join()
    pair.kill("b")  # the peer is down too
    shutil.rmtree(pair.dirs["a"])  # A's disk is lost, identity included
    acked = w.total_acked()
    assert acked >= 10000
    print(f"{arch}: {acked} acknowledged writes before the loss")

    a = pair.start("a", peer_startup_wait_ms=200)  # listens although it cannot reach its peer
    for cmd in (("PING",), ("SET", "id:new", "x"), ("GET", "id:0:1"), ("DBSIZE",), ("INCR", "id:0:2")):
        err = call(a, *cmd)
        assert isinstance(err, tuple) and err[1].startswith(b"LOADING "), (cmd, err)
        assert b"from the peer " + pair.addr("b").encode() in err[1], err
    c = kv(a.port)
    try:  # a real client sees Redis's loading error
        with pytest.raises(redis.BusyLoadingError):
            c.get("id:0:1")
    finally:
        c.close()
    ip = info(a, "persistence")
    assert ip["loading"] == 1, ip
    assert pair.addr("b") in ip["loading_waiting_for"], ip
    assert "loading_start_time" in ip and "loading_last_error" in ip, ip
    assert "waiting for" in a.log() and "-LOADING" in a.log(), a.log()
    wait_for("a second try at the peer", lambda: info(a, "persistence")["loading_fetch_attempts"] >= 2)
    assert info(a, "persistence")["loading"] == 1
    assert not os.path.exists(os.path.join(pair.dirs["a"], "node-id")), "a new identity was made while waiting"

    pair.start("b")  # the peer returns: A's log comes back from it
    wait_for("A to recover and serve", lambda: info(a, "persistence")["loading"] == 0, timeout=60)
    assert read_node_id(pair.dirs["a"]) == a_id, "the recovered node did not adopt its old identity"
    ip = info(a, "persistence")
    assert ip["node_id"] == a_id and ip["loading_fetch_attempts"] >= 2, ip
    w.verify(a.port, f"after the lost disk and the peer's return (seed {SEED}, {acked} acknowledged writes)")
    # and it serves writes again, replicated to B
    assert call(a, "SET", "id:after", "1") == b"OK"
    pair.wait_in_sync("a")


def test_no_new_node_without_init(pair):
    """A node with an empty data dir whose peer holds nothing for it is not made new silently."""
    pair.start("b", wait=False)  # B is new (--init): it waits for A's receiver
    a = pair.start("a", wait=False, init=False)
    rc, log = refusal(a)
    assert rc != 0, log
    assert "holds no state" in log and "--init" in log, log
    assert not os.path.exists(os.path.join(pair.dirs["a"], "log")), "the refused node made a log"


def test_init_refused_when_the_peer_holds_this_pairs_log_and_node_id_recovers_it(pair):
    pair.start_both()
    a_id = read_node_id(pair.dirs["a"])
    for i in range(200):
        assert call(pair.nodes["a"], "SET", f"k:{i}", f"v{i}") == b"OK"
    pair.wait_in_sync("a")
    pair.kill("a")
    shutil.rmtree(pair.dirs["a"])

    a = pair.start("a", wait=False, init=True)  # an operator's mistake: A's log is at B
    rc, log = refusal(a)
    assert rc != 0, log
    assert "--init refused" in log and a_id in log, log

    a = pair.start("a", node_id=a_id)  # its identity, given: recovered from B
    wait_for("A to serve", lambda: info(a, "persistence")["loading"] == 0)
    assert read_node_id(pair.dirs["a"]) == a_id
    assert call(a, "GET", "k:199") == b"v199" and call(a, "DBSIZE") == 200


def test_node_id_contradicting_the_data_dir_is_refused(pair):
    pair.start_both()
    a_id = read_node_id(pair.dirs["a"])
    pair.nodes["a"].stop()
    other = "0" * 31 + ("1" if a_id[-1] != "1" else "2")
    a = pair.start("a", wait=False, node_id=other)
    rc, log = refusal(a)
    assert rc != 0 and f"--node-id {other}" in log and a_id in log, log


def test_waiting_node_stops_when_the_returning_peer_holds_nothing_for_it(pair):
    """No --init, peer down: A waits (-LOADING); the peer comes back new and empty: A's state
    is nowhere, so A stops with the reason instead of serving empty."""
    a = pair.start("a", init=False, peer_startup_wait_ms=200)
    assert info(a, "persistence")["loading"] == 1
    pair.start("b")  # new (--init): A's receiver holds nothing of it either
    rc, log = refusal(a)
    assert rc != 0, log
    assert "cannot recover its state" in log and "--init" in log, log
