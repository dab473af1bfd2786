"""`kvstore cluster up|status|down|controller`: a local cluster of kvstore nodes that Redis
Cluster clients use, its truth in etcd (kvstore/cluster.py, kvstore/etcd.py)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import click

from kvstore.cluster import Controller, SlotMap, cluster_id, prefix, status
from kvstore.durability import node_id
from kvstore.etcd import Etcd, EtcdError
from kvstore.cli.main import _fail, main

STATE = "cluster.json"  # in --dir: what `up` started, for `status` and `down`


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(argv, log_path):
    """A detached child (its own session: it outlives this command), output to log_path."""
    with open(log_path, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True).pid


def _wait(what, pred, timeout, children=()):
    """Until pred(); fails after timeout, or at once when one of children ((name, pid, log)) exits."""
    deadline = time.monotonic() + timeout
    while not pred():
        for name, pid, log_path in children:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                with open(log_path, errors="replace") as f:
                    tail = f.read()[-600:]
                _fail(f"{name} exited while waiting for {what}; the end of {log_path}:\n{tail}")
        if time.monotonic() > deadline:
            _fail(f"{what}: not after {timeout:.0f} s (see the logs in the cluster's directory)")
        time.sleep(0.1)


def _state(d):
    try:
        with open(os.path.join(d, STATE)) as f:
            return json.load(f)
    except FileNotFoundError:
        _fail(f"no cluster in {d} ({STATE} not found): start one with `kvstore cluster up --dir {d}`")


@click.group()
def cluster():
    """A sharded cluster that Redis Cluster clients use unchanged (redis-cli -c, redis-py
    RedisCluster, redis-benchmark --cluster): 16,384 slots spread over kvstore nodes, the slot
    map, the nodes' leases and the controller's election in etcd."""


@cluster.command()
@click.option("--nodes", "n", type=click.IntRange(1, 64), default=3, show_default=True, help="Nodes to start.")
@click.option("--dir", "d", default="cluster", show_default=True,
              help="Where the nodes' data directories, the logs and cluster.json go.")
@click.option("--etcd", "etcd_url", default=None,
              help="etcd's client URL (http://HOST:PORT); default: start one, its data in --dir.")
@click.option("--name", default="kvstore", show_default=True, help="The cluster's name (its keys in etcd).")
@click.option("--base-port", type=click.IntRange(1, 65535 - 64), default=7000, show_default=True,
              help="Node i listens on base-port + i.")
@click.option("--durability", type=click.Choice(["none", "disk"]), default="disk", show_default=True,
              help="Each node's durability mode.")
@click.option("--lease-ttl", type=click.IntRange(1, 60), default=2, show_default=True,
              help="Seconds of a node's lease in etcd (see kvstore serve --cluster-lease-ttl).")
def up(n, d, etcd_url, name, base_port, durability, lease_ttl):
    """Start a local cluster: etcd (unless --etcd), NODES nodes and a controller, each a
    process of its own that outlives this command; returns once every node serves the slot map
    (the slots split evenly). `kvstore cluster down --dir DIR` stops it all."""
    d = os.path.abspath(d)
    if os.path.exists(os.path.join(d, STATE)):
        _fail(f"{d} holds a cluster already ({STATE}): `kvstore cluster down --dir {d}` first, or another --dir")
    os.makedirs(d, exist_ok=True)
    st = {"name": name, "dir": d, "etcd": etcd_url, "etcd_pid": None, "nodes": [], "controller_pid": None}
    if etcd_url is None:
        if not shutil.which("etcd"):
            _fail("etcd is not installed (Debian: apt-get install etcd-server), and no --etcd URL was given")
        client, peer = _free_port(), _free_port()
        etcd_url = st["etcd"] = f"http://127.0.0.1:{client}"
        st["etcd_pid"] = _spawn(["etcd", "--name", "kvstore", "--data-dir", os.path.join(d, "etcd"),
                                 "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                                 "--initial-cluster", f"kvstore=http://127.0.0.1:{peer}",
                                 "--heartbeat-interval", "50", "--election-timeout", "500"],
                                os.path.join(d, "etcd.log"))
        click.echo(f"etcd: {etcd_url} (pid {st['etcd_pid']})")
    e = Etcd(etcd_url, timeout=2)

    def etcd_up():
        try:
            e.get("/")
            return True
        except EtcdError:
            return False
    _wait("etcd answering", etcd_up, 30,
          [("etcd", st["etcd_pid"], os.path.join(d, "etcd.log"))] if st["etcd_pid"] else [])
    text = e.get(prefix(name) + "map")
    if text is not None:  # this cluster again (its data kept), or another one of that name
        mine = [(cluster_id(node_id(os.path.join(d, f"node{i}"), create=False) or b""), "127.0.0.1", base_port + i)
                for i in range(n) if os.path.exists(os.path.join(d, f"node{i}", "node-id"))]
        if sorted(SlotMap.from_json(text).nodes) != sorted(mine):
            _fail(f"etcd at {etcd_url} holds a cluster named {name!r} whose nodes are not the --nodes {n} at ports "
                  f"{base_port}.. in {d}: another --name, or the same --nodes and --base-port as before")
        click.echo(f"cluster {name!r} found in etcd: its {n} nodes start again with their data")
    for i in range(n):
        nd = os.path.join(d, f"node{i}")
        os.makedirs(nd, exist_ok=True)
        port = base_port + i
        argv = [sys.executable, "-m", "kvstore.cli", "serve", "--port", str(port), "--data-dir", nd,
                "--durability", durability, "--cluster-enabled", "--cluster-etcd", etcd_url, "--cluster-name", name,
                "--cluster-lease-ttl", str(lease_ttl)]
        pid = _spawn(argv, os.path.join(d, f"node{i}.log"))
        st["nodes"].append({"port": port, "pid": pid, "dir": nd})
        click.echo(f"node {i}: 127.0.0.1:{port} (pid {pid})")
    st["controller_pid"] = _spawn([sys.executable, "-m", "kvstore.cli", "cluster", "controller", "--etcd", etcd_url,
                                   "--name", name, "--nodes", str(n), "--lease-ttl", str(lease_ttl)],
                                  os.path.join(d, "controller.log"))
    with open(os.path.join(d, STATE), "w") as f:
        json.dump(st, f, indent=2)

    def serving():
        s = status(etcd_url, name)
        return s["epoch"] is not None and sum(r["state"] == "ok" for r in s["nodes"]) == n
    click.echo("waiting for every node to serve the slot map ...")
    children = [(f"node {i}", x["pid"], os.path.join(d, f"node{i}.log")) for i, x in enumerate(st["nodes"])]
    children.append(("the controller", st["controller_pid"], os.path.join(d, "controller.log")))
    _wait("the cluster serving", serving, 60, children)
    _print_status(status(etcd_url, name))
    click.echo(f"\nredis-cli -c -p {base_port}        # any node; -c follows the redirections")


@cluster.command("status")
@click.option("--dir", "d", default="cluster", show_default=True, help="The cluster `up` started there.")
@click.option("--etcd", "etcd_url", default=None, help="Or: etcd's client URL (with --name).")
@click.option("--name", default=None, help="The cluster's name (default: the one in --dir, else kvstore).")
@click.option("--json", "as_json", is_flag=True, help="JSON for scripts: each node's id, host, port, pid, slots.")
def status_cmd(d, etcd_url, name, as_json):
    """The cluster's nodes as etcd and the nodes see them: slots, liveness, keys, ops/s."""
    if etcd_url is None:
        st = _state(os.path.abspath(d))
        etcd_url, name = st["etcd"], name or st["name"]
    try:
        s = status(etcd_url, name or "kvstore")
    except EtcdError as ex:
        _fail(ex)
    if as_json:
        click.echo(json.dumps(s, indent=2))
    else:
        _print_status(s)


def _print_status(s):
    click.echo(f"cluster {s['name']}: epoch {s['epoch']}, controller {s['controller'] or 'none'}")
    click.echo(f"{'node id':<42} {'address':<21} {'pid':>7} {'live':<5} {'slots':>6} {'keys':>8} {'ops/s':>7}  "
               f"ranges / state")
    for r in s["nodes"]:
        ranges = ",".join(f"{a}-{b}" for a, b in r["ranges"]) or "-"
        click.echo(f"{r['id']:<42} {r['host'] + ':' + str(r['port']):<21} {str(r['pid'] or '-'):>7} "
                   f"{'yes' if r['live'] else 'NO':<5} {r['slots']:>6} {str(r['keys'] if r['keys'] is not None else '-'):>8} "
                   f"{str(r['ops_per_sec'] if r['ops_per_sec'] is not None else '-'):>7}  {ranges} {r['state']}")


@cluster.command()
@click.option("--dir", "d", default="cluster", show_default=True, help="The cluster `up` started there.")
def down(d):
    """Stop what `up` started: the controller, the nodes (each gives its lease back), etcd.
    The data directories stay; remove --dir to forget the cluster."""
    d = os.path.abspath(d)
    st = _state(d)
    pids = [("controller", st["controller_pid"])] + [(f"node {i}", x["pid"]) for i, x in enumerate(st["nodes"])]
    pids += [("etcd", st["etcd_pid"])] if st["etcd_pid"] else []
    for what, pid in pids:  # etcd last: the nodes give their leases back to it
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            click.echo(f"{what}: not running")
            continue
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
        click.echo(f"{what}: stopped (pid {pid})")
    os.rename(os.path.join(d, STATE), os.path.join(d, STATE + ".down"))


@cluster.command("controller")
@click.option("--etcd", "etcd_url", required=True, help="etcd's client URL (http://HOST:PORT).")
@click.option("--name", default="kvstore", show_default=True, help="The cluster's name.")
@click.option("--nodes", "n", type=click.IntRange(1, 1024), required=True,
              help="Nodes the first slot map spreads the slots over (it waits for that many).")
@click.option("--lease-ttl", type=click.IntRange(1, 60), default=2, show_default=True,
              help="Seconds of the controller's lease (its leadership).")
def controller_cmd(etcd_url, name, n, lease_ttl):
    """Run a controller in the foreground until SIGINT/SIGTERM. Several may run: one leads
    (elected through etcd), the others take over when its lease expires."""
    from kvstore import log
    from kvstore.server import serve_until_signal
    log.configure("notice", "")
    c = Controller(etcd_url, name, n, ttl=lease_ttl, who=f"pid {os.getpid()}")
    serve_until_signal(c.start, c.stop)


main.add_command(cluster)
