"""The cluster under faults, with a recorded load: every history of SET/GET on each key must be
linearizable (tests/helpers/linearizable.py) and every acknowledged write readable after.

  - etcd stops answering for a few seconds (SIGSTOP): the nodes' fences run out, they refuse
    keys (-CLUSTERDOWN) rather than serve what the controller could have moved, and serve again
    once their agents renew.

Loads are bounded in time and operations; every wait has a deadline."""
import random
import threading
import time

import pytest
import redis
from redis.crc import key_slot

from kvstore.cluster import SlotMap, members, prefix
from kvstore.etcd import Etcd

from helpers.linearizable import Op, check
from helpers.pair import wait_for
from helpers.servers import EtcdServer, need, start_node, stop_node

pytestmark = pytest.mark.timeout(180)

KEYS = [f"chaos:{i}" for i in range(6)]


class Recorder:
    """Worker threads doing SET (a value of their own) and GET on KEYS through the key's
    owner, each operation recorded with its call and return times (about 100 a second each)."""

    def __init__(self, clients, owner_of, seconds, workers=4, seed=1):
        self.clients, self.owner_of, self.seconds = clients, owner_of, seconds
        self.ops = {k: [] for k in KEYS}
        self.refused = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.work, args=(w, random.Random(seed + w))) for w in range(workers)]

    def work(self, w, rng):
        conns = [redis.Redis(host="127.0.0.1", port=c, socket_timeout=2, protocol=2) for c in self.clients]
        end, n = time.monotonic() + self.seconds, 0
        while time.monotonic() < end:
            key = rng.choice(KEYS)
            c = conns[self.owner_of[key]]
            write = rng.random() < 0.5
            value = f"w{w}-{n}".encode()
            n += 1
            call = time.monotonic()
            try:
                got = c.set(key, value) if write else c.get(key)
                op = Op("set", value, call, time.monotonic()) if write else Op("get", got, call, time.monotonic())
            except redis.ResponseError as e:  # refused before it ran: not in the history
                assert str(e).startswith(("The cluster is down", "CLUSTERDOWN")), e
                with self.lock:
                    self.refused += 1
                time.sleep(0.01)
                continue
            except (redis.TimeoutError, redis.ConnectionError):
                op = Op("set", value, call) if write else None  # outcome unknown
            if op:
                with self.lock:
                    self.ops[key].append(op)
            time.sleep(0.01)  # bounded histories: a few hundred operations a key for the checker
        for c in conns:
            c.close()

    def run(self):
        for t in self.threads:
            t.start()

    def join(self):
        for t in self.threads:
            t.join(self.seconds + 30)
            assert not t.is_alive()


def test_etcd_stopped_for_seconds_fences_the_nodes_and_histories_stay_linearizable():
    need("etcd")
    etcd = EtcdServer().start()
    name = "chaos"
    # (durability none: the fence is what is under test, and no node restarts)
    nodes = [start_node(cluster_enabled=True, cluster_etcd=etcd.url, cluster_name=name, cluster_lease_ttl=1)
             for _ in range(3)]
    try:
        e = Etcd(etcd.url)

        joined = wait_for("3 nodes registered", lambda: len(members(e, name)) == 3 and members(e, name))
        m = SlotMap.even(1, joined)
        assert e.replace(prefix(name) + "map", None, m.to_json())
        ports = [p for _, _, p in joined]
        for p in ports:
            wait_for("the map in force", lambda p=p: redis.Redis(port=p, protocol=2).cluster("INFO")[
                "cluster_state"] == "ok")
        owner_of = {k: m.owner(key_slot(k.encode())) for k in KEYS}
        rec = Recorder(ports, owner_of, seconds=7)
        rec.run()
        time.sleep(1.5)
        etcd.pause()
        time.sleep(2.5)  # longer than the 1 s lease: every node fences itself
        etcd.resume()
        rec.join()
        assert rec.refused > 0, "no node refused a key while etcd was stopped: the fence did not work"
        done = sum(len(v) for v in rec.ops.values())
        assert done >= 100, f"only {done} operations completed"
        # every acknowledged write is there: the last reads are part of each key's history
        for k in KEYS:
            c = redis.Redis(port=ports[owner_of[k]], protocol=2)
            wait_for("serving again", lambda c=c, k=k: c.get(k) or True)
            call = time.monotonic()
            rec.ops[k].append(Op("get", c.get(k), call, time.monotonic()))
            c.close()
        for k in KEYS:
            assert check(rec.ops[k]) is None, (k, check(rec.ops[k]))
    finally:
        for n in nodes:
            stop_node(n)
        etcd.stop()
