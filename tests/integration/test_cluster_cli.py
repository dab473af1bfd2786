"""`kvstore cluster up|status|down|controller` (cli/cluster.py) and the controller's election
(kvstore/cluster.py), as a user runs them: real processes (etcd, the nodes, the controller),
real clients. Every wait has a deadline; every process started is stopped."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from redis.cluster import RedisCluster

from kvstore.cluster import SLOTS, Controller, prefix
from kvstore.experiments import common
from kvstore.etcd import Etcd

from helpers.pair import wait_for
from helpers.servers import EtcdServer, need

pytestmark = pytest.mark.timeout(180)


def kv(*args, timeout=90):
    return subprocess.run([sys.executable, "-m", "kvstore.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_up_status_down_and_up_again_with_the_data(tmp_path):
    need("etcd")
    d = str(tmp_path / "c")
    base = common.free_port_run(3)
    r = kv("cluster", "up", "--nodes", "3", "--dir", d, "--base-port", str(base))
    state = json.load(open(os.path.join(d, "cluster.json"))) if os.path.exists(os.path.join(d, "cluster.json")) else None
    try:
        assert r.returncode == 0, r.stderr + r.stdout
        assert "waiting for every node to serve the slot map" in r.stdout and f"redis-cli -c -p {base}" in r.stdout
        rc = RedisCluster(host="127.0.0.1", port=base + 1, socket_timeout=10)
        for i in range(300):
            assert rc.set(f"k{i}", i)
        rc.close()
        s = kv("cluster", "status", "--dir", d, "--json")
        assert s.returncode == 0, s.stderr
        st = json.loads(s.stdout)
        assert st["epoch"] == 1 and st["controller"]
        assert sorted(x["port"] for x in st["nodes"]) == [base, base + 1, base + 2]
        assert all(x["live"] and x["state"] == "ok" and len(x["id"]) == 40 and alive(x["pid"]) for x in st["nodes"])
        assert sum(x["slots"] for x in st["nodes"]) == SLOTS and sum(x["keys"] for x in st["nodes"]) == 300
        table = kv("cluster", "status", "--dir", d)
        assert table.returncode == 0 and "cluster kvstore: epoch 1" in table.stdout and table.stdout.count(" ok") == 3
        again = kv("cluster", "up", "--nodes", "3", "--dir", d, "--base-port", str(base))
        assert again.returncode != 0 and "holds a cluster already" in again.stderr
        down = kv("cluster", "down", "--dir", d)
        assert down.returncode == 0, down.stderr
        assert "etcd: stopped" in down.stdout and "controller: stopped" in down.stdout
        pids = [state["etcd_pid"], state["controller_pid"]] + [x["pid"] for x in state["nodes"]]
        assert not any(alive(p) for p in pids)
        # the same nodes again: their data (durability disk) and the map (etcd's data) kept
        r = kv("cluster", "up", "--nodes", "3", "--dir", d, "--base-port", str(base))
        assert r.returncode == 0, r.stderr + r.stdout
        assert "start again with their data" in r.stdout
        state = json.load(open(os.path.join(d, "cluster.json")))
        rc = RedisCluster(host="127.0.0.1", port=base, socket_timeout=10)
        assert [int(rc.get(f"k{i}")) for i in range(300)] == list(range(300))
        rc.close()
    finally:
        if os.path.exists(os.path.join(d, "cluster.json")):
            kv("cluster", "down", "--dir", d)
        for p in ([state["etcd_pid"], state["controller_pid"]] + [x["pid"] for x in state["nodes"]] if state else []):
            if alive(p):
                os.kill(p, signal.SIGKILL)
    assert "no cluster in" in kv("cluster", "status", "--dir", str(tmp_path / "none")).stderr
    bad = kv("cluster", "up", "--etcd", "nope", "--dir", str(tmp_path / "bad"))
    assert bad.returncode == 1 and "etcd URL: expected http://HOST:PORT, got 'nope'" in bad.stderr


def test_one_controller_leads_and_another_takes_over():
    need("etcd")
    etcd = EtcdServer().start()
    try:
        name = "election"
        cs = [Controller(etcd.url, name, nodes=99, ttl=1, who=f"c{i}") for i in range(2)]
        for c in cs:
            c.start()
        e = Etcd(etcd.url)
        wait_for("a leader", lambda: sum(c.leader for c in cs) == 1)
        time.sleep(1.5)  # renewals of the lease keep the same one leading
        leader = next(c for c in cs if c.leader)
        assert sum(c.leader for c in cs) == 1 and e.get(prefix(name) + "controller") == leader.who.encode()
        leader.stop()  # its lease given back: the other takes over
        other = next(c for c in cs if c is not leader)
        wait_for("the other leading", lambda: other.leader and e.get(prefix(name) + "controller") == other.who.encode(),
                 timeout=10)
        other.stop()
    finally:
        etcd.stop()


def test_the_same_from_python_with_asyncio(tmp_path):
    """kvstore.AsyncCluster (and Cluster under it): up, status, down from an event loop."""
    need("etcd")
    import asyncio

    import kvstore

    base = common.free_port_run(2)
    said = []

    async def run():
        c = kvstore.AsyncCluster(nodes=2, dir=str(tmp_path / "py"), base_port=base, durability="none")
        await c.up(progress=said.append)
        try:
            st = await c.status()
            assert [x["slots"] for x in st["nodes"]] == [8192, 8192] and st["epoch"] == 1
            rc = RedisCluster(host="127.0.0.1", port=base, socket_timeout=10)
            assert rc.set("{a}x", 1) and rc.set("{b}x", 2) and rc.get("{b}x") == b"2"
            rc.close()
            with pytest.raises(kvstore.ConfigError, match="holds a cluster already"):
                kvstore.Cluster(nodes=2, dir=str(tmp_path / "py"), base_port=base).up()
        finally:
            await c.down(progress=said.append)
        gone = json.load(open(tmp_path / "py" / "cluster.json.down"))
        assert not any(alive(p) for p in [gone["etcd_pid"], gone["controller_pid"]] + [x["pid"] for x in gone["nodes"]])

    asyncio.run(asyncio.wait_for(run(), 120))
    assert "waiting for every node to serve the slot map ..." in said and "etcd: stopped" in " ".join(said)


def test_throughput_experiment_quick(tmp_path):
    """kv_cluster_throughput at its --quick scale: a cluster of 1 and of 2 nodes, SET and GET."""
    need("etcd")
    need("redis-benchmark")
    env = {k: v for k, v in os.environ.items() if k != "KVSTORE_RESULTS"}
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "experiment", "run", "kv_cluster_throughput", "--quick",
                        "--", "--out", str(tmp_path)], capture_output=True, text=True, timeout=170, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = common.read_csv(tmp_path / "kv_cluster_throughput.csv")
    assert {(x["nodes"], x["op"]) for x in rows} == {(n, op) for n in ("1", "2") for op in ("SET", "GET")}
    for x in rows:
        assert float(x["throughput"]) > 0 and x["requests"] == "20000" and float(x["server_cpu_s"]) >= 0, x
    assert (tmp_path / "kv_cluster_throughput.png").read_bytes().startswith(b"\x89PNG")
    assert "req per CPU-second" in r.stdout
