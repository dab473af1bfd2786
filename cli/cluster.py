"""`kvstore cluster up|status|down|controller`: a local cluster of kvstore nodes that Redis
Cluster clients use, its truth in etcd (kvstore/cluster.py, kvstore/etcd.py)."""
import json
import os

import click

from kvstore.cluster import Cluster, Controller, status
from kvstore.errors import KVError
from kvstore.etcd import EtcdError
from kvstore.cli.main import _fail, main


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
    (the slots split evenly). `kvstore cluster down --dir DIR` stops it all; `up` again starts
    the same nodes with their data."""
    c = Cluster(nodes=n, dir=d, etcd_url=etcd_url, name=name, base_port=base_port, durability=durability,
                lease_ttl=lease_ttl)
    try:
        c.up(progress=click.echo)
    except (KVError, EtcdError, ValueError) as e:  # (ValueError: an --etcd that is not http://HOST:PORT)
        _fail(e)
    _print_status(c.status())
    click.echo(f"\nredis-cli -c -p {base_port}        # any node; -c follows the redirections")


@cluster.command("status")
@click.option("--dir", "d", default="cluster", show_default=True, help="The cluster `up` started there.")
@click.option("--etcd", "etcd_url", default=None, help="Or: etcd's client URL (with --name).")
@click.option("--name", default=None, help="The cluster's name (default: the one in --dir, else kvstore).")
@click.option("--json", "as_json", is_flag=True, help="JSON for scripts: each node's id, host, port, pid, slots.")
def status_cmd(d, etcd_url, name, as_json):
    """The cluster's nodes as etcd and the nodes see them: slots, liveness, keys, ops/s."""
    try:
        s = Cluster(dir=d).load().status() if etcd_url is None else status(etcd_url, name or "kvstore")
    except (KVError, EtcdError, ValueError) as ex:
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
    try:
        Cluster(dir=d).down(progress=click.echo)
    except KVError as e:
        _fail(e)


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
