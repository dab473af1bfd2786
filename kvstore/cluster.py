"""The cluster's control plane, the parts each node runs: its identity, the slot map as etcd
holds it, and the agent that keeps the node's lease and map (ext/cmd/cluster.c serves by them).

etcd layout, under /kvstore/clusters/<name>/:
    map          the slot map (JSON: epoch, nodes [[id, host, port]], slots [[first, last, node
                 index]], moving [[slot, node index it goes to]]); written by the controller
                 with a compare-and-swap, so epochs only grow
    nodes/<id>   a live node (JSON: id, host, port, pid), put with the node's lease: it goes
                 when the node stops renewing it

The fence. The agent renews its etcd lease (TTL T seconds) every T/3 and, after each renewal
that etcd confirms, tells its node to serve keys until (time the renewal was sent) + T -
margin. etcd keeps the lease at least T after it received that renewal, and the controller
moves a node's slots only once etcd says the lease is gone. So a node cut off from etcd stops
serving before anyone else can be given its slots, as long as its clock and etcd's do not
drift apart by more than the margin over T (a quarter of T by default: far beyond any real
clock's rate error). The node's own lease is on the monotonic clock."""
import asyncio
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import redis

from kvstore.durability import node_id
from kvstore.errors import ConfigError, ServerError
from kvstore.etcd import Etcd, EtcdError, Watcher

SLOTS = 16384
log = logging.getLogger("kvstore")


def prefix(name):
    return f"/kvstore/clusters/{name}/"


def etcd_command(name, data_dir, client_url, peer_url):
    """argv of a one-member etcd for a cluster run here: heartbeat 50 ms and election timeout
    500 ms, so that it grants leases of 1 s (its least TTL is 1.5 election timeouts)."""
    return ["etcd", "--name", name, "--data-dir", data_dir, "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"{name}={peer_url}",
            "--heartbeat-interval", "50", "--election-timeout", "500"]


def live_nodes(etcd, name):
    """{id: {"id", "host", "port", "pid"}} of the nodes registered now (their leases alive)."""
    kvs, _ = etcd.get_prefix(prefix(name) + "nodes/")
    return {d["id"]: d for d in map(json.loads, kvs.values())}


def members(etcd, name):
    """The registered nodes as a slot map names them: sorted (id, host, port)."""
    return sorted((d["id"], d["host"], d["port"]) for d in live_nodes(etcd, name).values())


def cluster_id(node_id):
    """A node's cluster id (40 hex digits, as Redis Cluster's) from its identity (the 16 bytes
    of <data-dir>/node-id): stable across restarts, and kept by a node recovered from its peer."""
    return hashlib.sha1(b"kvstore-cluster-node:" + node_id).hexdigest()


@dataclass
class SlotMap:
    """Who owns which slots, in one configuration epoch."""
    epoch: int
    nodes: list                                   # [(id, host, port)]
    slots: list                                   # [(first, last, node index)]
    moving: list = field(default_factory=list)    # [(slot, node index)]: its owner is handing it there

    @classmethod
    def even(cls, epoch, nodes):
        """The slots split into len(nodes) ranges as even as can be, in order (as redis-cli
        --cluster create splits them)."""
        n = len(nodes)
        bounds = [round(i * SLOTS / n) for i in range(n + 1)]
        return cls(epoch, [tuple(x) for x in nodes], [(bounds[i], bounds[i + 1] - 1, i) for i in range(n)])

    def to_json(self):
        return json.dumps({"epoch": self.epoch, "nodes": [list(x) for x in self.nodes],
                           "slots": [list(x) for x in self.slots], "moving": [list(x) for x in self.moving]},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text):
        d = json.loads(text)
        return cls(int(d["epoch"]), [tuple(x) for x in d["nodes"]], [tuple(x) for x in d["slots"]],
                   [tuple(x) for x in d.get("moving", [])])

    def owner(self, slot):
        return next((idx for first, last, idx in self.slots if first <= slot <= last), None)

    def setmap_args(self, myid):
        """CLUSTER SETMAP's arguments for node myid: the whole map, and of the moving slots
        those it gives (MIGRATING, to their new node) and those it takes (IMPORTING, from
        their owner)."""
        me = next((i for i, n in enumerate(self.nodes) if n[0] == myid), None)
        args = ["CLUSTER", "SETMAP", self.epoch, myid, "NODES", len(self.nodes)]
        for nid, host, port in self.nodes:
            args += [nid, host, port]
        args += ["SLOTS", len(self.slots)]
        for first, last, idx in self.slots:
            args += [first, last, idx]
        giving = [(s, to) for s, to in self.moving if me is not None and self.owner(s) == me]
        taking = [(s, self.owner(s)) for s, to in self.moving if me is not None and to == me]
        for word, pairs in (("MIGRATING", giving), ("IMPORTING", taking)):
            if pairs:
                args += [word, len(pairs)] + [x for p in pairs for x in p]
        return args


class Agent(threading.Thread):
    """Beside a node (a thread of its `kvstore serve`): registers it in etcd under a lease,
    renews the lease and pushes the fence to the node (CLUSTER LEASE), and pushes each slot map
    etcd gets (CLUSTER SETMAP). Never on the request path."""

    def __init__(self, etcd_url, name, node_id, host, port, client, ttl=2, margin=None):
        super().__init__(name="cluster-agent", daemon=True)
        self.etcd, self.name, self.id = Etcd(etcd_url, timeout=max(1.0, ttl / 3)), name, node_id
        self.host, self.port, self.client, self.ttl = host, port, client, ttl
        self.margin = ttl / 4 if margin is None else margin
        self.lease = None
        self.epoch = None               # of the map last pushed
        self._stopping = threading.Event()
        self._lock = threading.Lock()   # the node's connection: the renewals' and the watcher's pushes
        self._watcher = None
        self.renewed = 0                # renewals confirmed (tests and status)

    # ---- the node
    def _call(self, *args):
        with self._lock:
            return self.client.execute_command(*args)

    def _push_map(self, text):
        m = SlotMap.from_json(text)
        if self.epoch is not None and m.epoch < self.epoch:
            return
        try:
            self._call(*m.setmap_args(self.id))
            self.epoch = m.epoch
            log.info("cluster %s: slot map of epoch %d in force", self.name, m.epoch)
        except Exception as e:  # noqa: BLE001 - a refused map is logged; the next one may do
            log.warning("cluster %s: slot map of epoch %d refused: %s", self.name, m.epoch, e)

    def _on_event(self, key, value, revision):
        if key == prefix(self.name) + "map" and value:
            self._push_map(value)

    # ---- the lease
    def _register(self):
        self.lease = self.etcd.grant(self.ttl)
        self.etcd.put(prefix(self.name) + "nodes/" + self.id,
                      json.dumps({"id": self.id, "host": self.host, "port": self.port, "pid": os.getpid()}),
                      lease=self.lease)

    def run(self):
        while not self._stopping.is_set():
            sent = time.monotonic()
            try:
                if self.lease is None:
                    self._register()
                    text = self.etcd.get(prefix(self.name) + "map")
                    if text:
                        self._push_map(text)
                    if self._watcher is None:
                        _, rev = self.etcd.get_prefix(prefix(self.name) + "map")
                        self._watcher = Watcher(self.etcd, prefix(self.name) + "map", self._on_event, rev + 1,
                                                name="cluster-map-watch")
                        self._watcher.start()
                    ok = True
                else:
                    ok = self.etcd.keepalive(self.lease) > 0
                if ok:
                    left_ms = int((self.ttl - self.margin - (time.monotonic() - sent)) * 1000)
                    self._call("CLUSTER", "LEASE", max(0, left_ms))
                    self.renewed += 1
                else:
                    log.warning("cluster %s: lease of node %s expired; registering again", self.name, self.id)
                    self.lease = None
                    continue
            except (EtcdError, OSError) as e:
                log.warning("cluster %s: %s", self.name, e)
            except Exception as e:  # noqa: BLE001 - the node refused: keep trying while it runs
                log.warning("cluster %s: node: %s", self.name, e)
            self._stopping.wait(self.ttl / 3)

    def stop(self, revoke=True):
        """Stop renewing; with revoke, give the lease back so the controller sees the node
        gone at once (a clean stop)."""
        self._stopping.set()
        self.join(5)
        if self._watcher:
            self._watcher.stop()
        if revoke and self.lease is not None:
            try:
                self.etcd.revoke(self.lease)
            except EtcdError as e:
                log.warning("cluster %s: %s", self.name, e)


class Controller(threading.Thread):
    """The cluster's controller: any number may run; the one holding the `controller` key (put
    under its own lease, created only if absent) acts, the others wait to take over. Acting:
    once `nodes` nodes have registered and there is no map yet, it writes the first one (epoch
    1, the slots split evenly over the nodes in id order)."""

    def __init__(self, etcd_url, name, nodes, ttl=2, who=None):
        super().__init__(name="cluster-controller", daemon=True)
        self.etcd, self.name, self.want, self.ttl = Etcd(etcd_url, timeout=max(1.0, ttl / 3)), name, nodes, ttl
        self.who = who or f"controller-{id(self):x}"
        self.lease = None
        self.leader = False
        self._stopping = threading.Event()

    def _campaign(self):
        if self.lease is None or self.etcd.keepalive(self.lease) <= 0:
            self.lease = self.etcd.grant(self.ttl)
            self.leader = False
        if not self.leader:
            self.leader = self.etcd.create(prefix(self.name) + "controller", self.who, lease=self.lease)
            if self.leader:
                log.info("cluster %s: %s is the controller", self.name, self.who)

    def _act(self):
        p = prefix(self.name)
        if self.etcd.get(p + "map") is not None:
            return
        nodes = members(self.etcd, self.name)
        if len(nodes) >= self.want:
            m = SlotMap.even(1, nodes[:self.want])
            if self.etcd.replace(p + "map", None, m.to_json()):
                log.info("cluster %s: slot map of epoch 1 written: %d nodes", self.name, self.want)

    def run(self):
        while not self._stopping.is_set():
            try:
                self._campaign()
                if self.leader:
                    self._act()
            except (EtcdError, OSError, ValueError) as e:
                log.warning("cluster %s: controller: %s", self.name, e)
                self.leader = False
            self._stopping.wait(min(0.2, self.ttl / 3))

    def stop(self):
        self._stopping.set()
        self.join(5)
        if self.lease is not None:
            try:
                self.etcd.revoke(self.lease)  # the controller key goes: another takes over at once
            except EtcdError as e:
                log.warning("cluster %s: %s", self.name, e)


def status(etcd_url, name, password=None):
    """The cluster as etcd and its nodes see it: {"name", "epoch", "controller", "nodes": [{"id",
    "host", "port", "live", "slots", "ranges", "keys", "ops_per_sec", "state"}]}."""
    e = Etcd(etcd_url)
    p = prefix(name)
    text = e.get(p + "map")
    m = SlotMap.from_json(text) if text else None
    live = live_nodes(e, name)
    ctl = e.get(p + "controller")
    rows = []
    ids = [n[0] for n in m.nodes] if m else []
    ids += sorted(i for i in live if i not in ids)
    for i, nid in enumerate(ids):
        host, port = (m.nodes[i][1], m.nodes[i][2]) if m and i < len(m.nodes) else (live[nid]["host"],
                                                                                      live[nid]["port"])
        ranges = [(a, b) for a, b, idx in (m.slots if m else []) if idx == i and m and i < len(m.nodes)]
        row = {"id": nid, "host": host, "port": port, "live": nid in live, "pid": live.get(nid, {}).get("pid"),
               "slots": sum(b - a + 1 for a, b in ranges), "ranges": ranges, "keys": None, "ops_per_sec": None,
               "state": None}
        try:
            with redis.Redis(host=host, port=port, socket_timeout=1, protocol=2, password=password) as c:
                row["keys"] = c.dbsize()
                row["ops_per_sec"] = c.info("stats").get("instantaneous_ops_per_sec")
                row["state"] = c.execute_command("CLUSTER", "INFO").decode().split("\r\n")[0].split(":")[1]
        except Exception as ex:  # noqa: BLE001 - a node down is what status must show
            row["state"] = f"unreachable ({type(ex).__name__})"
        rows.append(row)
    return {"name": name, "epoch": m.epoch if m else None, "controller": ctl.decode() if ctl else None,
            "nodes": rows}


class Cluster:
    """A local cluster from Python, as `kvstore cluster up|status|down` run it: etcd (unless
    etcd_url names one), `nodes` nodes on base_port.. and a controller, each a process of its
    own that outlives this object; what was started is in <dir>/cluster.json.

    >>> c = Cluster(nodes=3, dir="cluster").up()   # returns once every node serves
    >>> c.status()["nodes"][0]["slots"]
    >>> c.down()
    AsyncCluster is the same for asyncio (a notebook's event loop)."""

    STATE = "cluster.json"

    def __init__(self, nodes=3, dir="cluster", etcd_url=None, name="kvstore", base_port=7000, durability="disk",
                 lease_ttl=2, serve_args=()):
        self.n, self.dir, self.etcd_url, self.name = nodes, os.path.abspath(dir), etcd_url, name
        self.base_port, self.durability, self.lease_ttl = base_port, durability, lease_ttl
        self.serve_args = list(serve_args)  # more `kvstore serve` options for every node (e.g. --threads 1)
        self.state = None

    def _path(self, *p):
        return os.path.join(self.dir, *p)

    def load(self):
        """The cluster `up` started in dir (its etcd URL and name too). ConfigError if none."""
        try:
            with open(self._path(self.STATE)) as f:
                self.state = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"no cluster in {self.dir} ({self.STATE} not found): start one with "
                              f"`kvstore cluster up --dir {self.dir}`") from None
        self.etcd_url, self.name = self.state["etcd"], self.state["name"]
        return self

    @staticmethod
    def _spawn(argv, log_path):
        with open(log_path, "ab") as out:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True).pid

    def _wait(self, what, pred, timeout, children=()):
        deadline = time.monotonic() + timeout
        while not pred():
            for who, pid, log_path in children:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    with open(log_path, errors="replace") as f:
                        tail = f.read()[-600:]
                    raise ServerError(f"{who} exited while waiting for {what}; the end of {log_path}:\n{tail}")
            if time.monotonic() > deadline:
                raise ServerError(f"{what}: not after {timeout:.0f} s (the logs are in {self.dir})")
            time.sleep(0.1)

    def up(self, progress=None, timeout=60):
        """Start it (or start it again: the same nodes of this dir, with their data and map)."""
        say = progress or (lambda text: None)
        if os.path.exists(self._path(self.STATE)):
            raise ConfigError(f"{self.dir} holds a cluster already ({self.STATE}): `kvstore cluster down --dir "
                              f"{self.dir}` first, or another dir")
        os.makedirs(self.dir, exist_ok=True)
        st = {"name": self.name, "dir": self.dir, "etcd": self.etcd_url, "etcd_pid": None, "nodes": [],
              "controller_pid": None}
        if self.etcd_url is None:
            if not shutil.which("etcd"):
                raise ConfigError("etcd is not installed (Debian: apt-get install etcd-server), and no etcd URL "
                                  "was given")
            ports = []
            for _ in range(2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    ports.append(s.getsockname()[1])
            url, peer = f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"
            self.etcd_url = st["etcd"] = url
            st["etcd_pid"] = self._spawn(etcd_command("kvstore", self._path("etcd"), url, peer),
                                         self._path("etcd.log"))
            say(f"etcd: {url} (pid {st['etcd_pid']})")
        e = Etcd(self.etcd_url, timeout=2)

        def etcd_up():
            try:
                e.get("/")
                return True
            except EtcdError:
                return False
        self._wait("etcd answering", etcd_up, 30,
                   [("etcd", st["etcd_pid"], self._path("etcd.log"))] if st["etcd_pid"] else [])
        text = e.get(prefix(self.name) + "map")
        if text is not None:  # this cluster again (its data kept), or another one of that name
            mine = [(cluster_id(node_id(self._path(f"node{i}"), create=False)), "127.0.0.1", self.base_port + i)
                    for i in range(self.n) if os.path.exists(self._path(f"node{i}", "node-id"))]
            if sorted(SlotMap.from_json(text).nodes) != sorted(mine):
                raise ConfigError(f"etcd at {self.etcd_url} holds a cluster named {self.name!r} whose nodes are not "
                                  f"the {self.n} at ports {self.base_port}.. in {self.dir}: another name, or the "
                                  f"same nodes and base port as before")
            say(f"cluster {self.name!r} found in etcd: its {self.n} nodes start again with their data")
        for i in range(self.n):
            nd = self._path(f"node{i}")
            os.makedirs(nd, exist_ok=True)
            port = self.base_port + i
            pid = self._spawn([sys.executable, "-m", "kvstore.cli", "serve", "--port", str(port), "--data-dir", nd,
                               "--durability", self.durability, "--cluster-enabled", "--cluster-etcd", self.etcd_url,
                               "--cluster-name", self.name, "--cluster-lease-ttl", str(self.lease_ttl),
                               *self.serve_args], self._path(f"node{i}.log"))
            st["nodes"].append({"port": port, "pid": pid, "dir": nd})
            say(f"node {i}: 127.0.0.1:{port} (pid {pid})")
        st["controller_pid"] = self._spawn([sys.executable, "-m", "kvstore.cli", "cluster", "controller", "--etcd",
                                            self.etcd_url, "--name", self.name, "--nodes", str(self.n),
                                            "--lease-ttl", str(self.lease_ttl)], self._path("controller.log"))
        self.state = st
        with open(self._path(self.STATE), "w") as f:
            json.dump(st, f, indent=2)

        def serving():
            s = self.status()
            return s["epoch"] is not None and sum(r["state"] == "ok" for r in s["nodes"]) == self.n
        say("waiting for every node to serve the slot map ...")
        children = [(f"node {i}", x["pid"], self._path(f"node{i}.log")) for i, x in enumerate(st["nodes"])]
        children.append(("the controller", st["controller_pid"], self._path("controller.log")))
        self._wait("the cluster serving", serving, timeout, children)
        return self

    def status(self):
        """status() of this cluster (see the function)."""
        if self.state is None and self.etcd_url is None:
            self.load()
        return status(self.etcd_url, self.name)

    def down(self, progress=None):
        """Stop the controller, the nodes (each gives its lease back) and etcd, last. The data
        directories stay."""
        say = progress or (lambda text: None)
        st = self.state or self.load().state
        pids = [("controller", st["controller_pid"])] + [(f"node {i}", x["pid"]) for i, x in enumerate(st["nodes"])]
        pids += [("etcd", st["etcd_pid"])] if st["etcd_pid"] else []
        for what, pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                say(f"{what}: not running")
                continue
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        break
                except ChildProcessError:  # not our child (another process started it): poll
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
            say(f"{what}: stopped (pid {pid})")
        os.replace(self._path(self.STATE), self._path(self.STATE + ".down"))
        self.state = None


class AsyncCluster:
    """Cluster for asyncio: the same methods, awaited (each runs in a worker thread)."""

    def __init__(self, **kw):
        self.sync = Cluster(**kw)

    async def up(self, progress=None, timeout=60):
        await asyncio.to_thread(self.sync.up, progress, timeout)
        return self

    async def status(self):
        return await asyncio.to_thread(self.sync.status)

    async def down(self, progress=None):
        await asyncio.to_thread(self.sync.down, progress)
