"""A small etcd v3 client over etcd's JSON gateway (POST /v3/..., keys and values base64), for
the cluster's control plane: keys, prefixes, a compare-and-create transaction, leases and
watches. Standard library only; every call has a timeout and raises EtcdError with what etcd
said. Not on any request path: agents and the controller call it a few times a second."""
import base64
import http.client
import json
import socket
import threading
import urllib.parse


class EtcdError(Exception):
    """etcd could not be reached, or refused the request (its message is the text)."""


def _b64(v):
    return base64.b64encode(v.encode() if isinstance(v, str) else v).decode()


def _unb64(v):
    return base64.b64decode(v) if v else b""


def _prefix_end(prefix):
    """The range end that makes [prefix, end) every key starting with prefix (etcd's rule)."""
    p = bytearray(prefix.encode() if isinstance(prefix, str) else prefix)
    for i in range(len(p) - 1, -1, -1):
        if p[i] < 0xFF:
            p[i] += 1
            return bytes(p[:i + 1])
    return b"\0"


class Etcd:
    """etcd at url ("http://127.0.0.1:2379"). Thread-safe: each call opens its own connection."""

    def __init__(self, url, timeout=5.0):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"etcd URL: expected http://HOST:PORT, got {url!r}")
        self.url, self.host, self.port, self.timeout = url, u.hostname, u.port or 2379, timeout

    def _post(self, path, body, timeout=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException) as e:
            raise EtcdError(f"etcd at {self.url}: {e}") from e
        finally:
            conn.close()
        try:
            out = json.loads(data or b"{}")
        except ValueError:
            raise EtcdError(f"etcd at {self.url}: {path}: not JSON: {data[:200]!r}") from None
        if r.status != 200 or "error" in out:
            raise EtcdError(f"etcd at {self.url}: {path}: {out.get('message') or out.get('error') or r.status}")
        return out

    # ---- keys
    def put(self, key, value, lease=None):
        """Set key; returns the store's revision after it."""
        body = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        return int(self._post("/v3/kv/put", body)["header"]["revision"])

    def get(self, key):
        """The value of key (bytes), or None."""
        kvs = self._post("/v3/kv/range", {"key": _b64(key)}).get("kvs", [])
        return _unb64(kvs[0].get("value")) if kvs else None

    def get_prefix(self, prefix):
        """({key: value} of every key under prefix, the revision it was read at)."""
        out = self._post("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))})
        kvs = {_unb64(kv["key"]).decode(): _unb64(kv.get("value")) for kv in out.get("kvs", [])}
        return kvs, int(out["header"]["revision"])

    def delete(self, key, prefix=False):
        body = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(_prefix_end(key))
        return int(self._post("/v3/kv/deleterange", body).get("deleted", 0))

    def create(self, key, value, lease=None):
        """Put key only if it does not exist (a transaction on its create revision): True if
        this call made it."""
        put = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        out = self._post("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": put}]})
        return bool(out.get("succeeded"))

    def replace(self, key, old, new):
        """Set key to new only if it holds old (bytes; None: only if it does not exist). True if
        it did: the compare-and-swap that orders writers of one key (the slot map's epoch)."""
        if old is None:
            return self.create(key, new)
        out = self._post("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "target": "VALUE", "result": "EQUAL", "value": _b64(old)}],
            "success": [{"request_put": {"key": _b64(key), "value": _b64(new)}}]})
        return bool(out.get("succeeded"))

    # ---- leases
    def grant(self, ttl):
        """A new lease of ttl seconds: its id."""
        return int(self._post("/v3/lease/grant", {"TTL": int(ttl)})["ID"])

    def keepalive(self, lease):
        """Renew lease: its TTL now (seconds), 0 if it has expired (or never was)."""
        out = self._post("/v3/lease/keepalive", {"ID": str(lease)})
        return int(out.get("result", {}).get("TTL", 0))

    def revoke(self, lease):
        try:
            self._post("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as e:
            if "not found" not in str(e):
                raise

    # ---- watch
    def watch(self, prefix, on_event, start_revision=None, on_open=None):
        """Call on_event(key, value or None when deleted, revision) for every change under
        prefix from start_revision on, in order, until the connection ends (EtcdError).
        Blocking: run it in a thread; on_open(conn) gets the connection, whose socket another
        thread may shut down to end the watch."""
        create = {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))}
        if start_revision:
            create["start_revision"] = str(start_revision)
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("POST", "/v3/watch", json.dumps({"create_request": create}),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status != 200:
                raise EtcdError(f"etcd at {self.url}: watch: HTTP {r.status}")
            conn.sock.settimeout(None)  # events come when they come
            if on_open:
                on_open(conn)
            buf = b""
            while True:
                chunk = r.read1(65536)
                if not chunk:
                    raise EtcdError(f"etcd at {self.url}: watch ended")
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    msg = json.loads(line).get("result", {})
                    for ev in msg.get("events", []):
                        kv = ev["kv"]
                        value = None if ev.get("type") == "DELETE" else _unb64(kv.get("value"))
                        on_event(_unb64(kv["key"]).decode(), value, int(kv.get("mod_revision", 0)))
        except (OSError, ValueError, http.client.HTTPException) as e:
            raise EtcdError(f"etcd at {self.url}: watch: {e}") from e
        finally:
            conn.close()


class Watcher(threading.Thread):
    """watch() in a daemon thread that reconnects (from the revision after the last event it
    saw) until stop() is called."""

    def __init__(self, etcd, prefix, on_event, start_revision=None, name="etcd-watch"):
        super().__init__(name=name, daemon=True)
        self.etcd, self.prefix, self.on_event = etcd, prefix, on_event
        self.next_revision = start_revision
        self._stopping = threading.Event()
        self._conn = None

    def _seen(self, key, value, revision):
        self.next_revision = revision + 1
        self.on_event(key, value, revision)

    def _opened(self, conn):
        self._conn = conn
        if self._stopping.is_set():
            self._shut()

    def _shut(self):
        c = self._conn
        if c is not None and c.sock is not None:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def run(self):
        while not self._stopping.is_set():
            try:
                self.etcd.watch(self.prefix, self._seen, self.next_revision, self._opened)
            except EtcdError:
                self._stopping.wait(0.2)  # etcd away, or stopping: try again unless stopping

    def stop(self):
        self._stopping.set()
        self._shut()
        self.join(5)
