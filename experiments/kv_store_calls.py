"""Calls into the embedded Store per second: the old cffi path against the Cython one.

What a notebook user does with kvstore.Store: a Python loop of single get / set, and
batches of 1,000 keys. Measured on one Store (unbounded, no server, keys already
present, --value-size bytes each):
  get, set     a loop of single calls over the 1,000 keys (ops/s = keys/s)
  mget, mset   one call per 1,000 keys (Cython); the cffi path has no batch call, so
               its figure is what a user had before: a loop of single calls
cffi is Store's code before kvstore/_ext_store.pyx (commit d8b0d26), kept below as
the baseline; cython is today's Store. The two alternate (A B, B A, ...) for every
op in every round; medians with min-max over --rounds; os.getloadavg() is recorded
with every run (the machine may be shared).

    kvstore experiment run kv_store_calls           -> OUT/kv_store_calls.{csv,png}
    kvstore experiment run kv_store_calls --quick   (3 rounds of 100,000 keys)
"""
import errno
import os
import statistics
import sys
import time

from kvstore import Store, errors
from kvstore._native import ffi, lib
from kvstore.experiments import common

NAME = "kv_store_calls"
QUICK = ["--rounds", "3", "--calls", "100000"]
OPS = ["get", "set", "mget", "mset"]
PATHS = ["cffi", "cython"]
BATCH = 1000


class CffiPath:
    """Store.get / Store.set as they were through cffi (kvstore/store.py at d8b0d26),
    on the same table: the baseline."""

    def __init__(self, store):
        self._t = store._t

    @staticmethod
    def _b(x, what="key"):
        if isinstance(x, bytes):
            return x
        if isinstance(x, str):
            return x.encode()
        if isinstance(x, (bytearray, memoryview)):
            return bytes(x)
        if isinstance(x, int) and not isinstance(x, bool):
            return str(x).encode()
        raise TypeError(f"{what} must be bytes, str or int, not {type(x).__name__}")

    def _op(self, fn, k, *args):
        while True:
            rc = fn(self._t, k, len(k), *args)
            if rc == -errno.ENODATA:
                errors.raise_for(lib.kvt_load_sync(self._t, k, len(k)))
            elif rc != -errno.ENOMEM or lib.kvt_wait_memory(self._t) < 0:
                return rc

    def get(self, key, default=None):
        k = self._b(key)
        cap = 256
        while True:
            buf = ffi.new("char[]", cap)
            n = self._op(lib.kvt_get_copy, k, buf, cap)
            if n == -errno.ENOENT:
                return default
            if n <= cap:
                return ffi.buffer(buf, n)[:]
            cap = n

    def set(self, key, value, *, nx=False, xx=False, ex=None, px=None, keepttl=False):
        if nx and xx:
            raise errors.ConfigError("nx and xx are mutually exclusive")
        if (ex is not None) + (px is not None) + bool(keepttl) > 1:
            raise errors.ConfigError("use at most one of ex, px and keepttl")
        k, v = self._b(key), self._b(value, "value")
        expire = 0
        if ex is not None or px is not None:
            ms = int(ex * 1000) if ex is not None else int(px)
            if ms <= 0:
                raise errors.ConfigError(f"expire time must be positive, got {ex if ex is not None else px!r}")
            expire = int(time.time() * 1000) + ms
        flags = (1 if nx else 0) | (2 if xx else 0) | (4 if keepttl else 0)
        rc = self._op(lib.kvt_set, k, v, len(v), flags, expire, ffi.NULL, ffi.NULL)
        errors.raise_for(rc)
        return rc == 1

    # no batch calls before: what a user wrote instead
    def mget(self, keys):
        return [self.get(k) for k in keys]

    def mset(self, mapping):
        for k, v in mapping.items():
            self.set(k, v)


def run(api, op, keys, mapping, reps):
    """Seconds for reps passes over the 1,000 keys."""
    if op == "get":
        get = api.get
        t = time.perf_counter()
        for _ in range(reps):
            for k in keys:
                get(k)
    elif op == "set":
        set_ = api.set
        v = mapping[keys[0]]
        t = time.perf_counter()
        for _ in range(reps):
            for k in keys:
                set_(k, v)
    elif op == "mget":
        mget = api.mget
        t = time.perf_counter()
        for _ in range(reps):
            mget(keys)
    else:
        mset = api.mset
        t = time.perf_counter()
        for _ in range(reps):
            mset(mapping)
    return time.perf_counter() - t


def measure(args):
    store = Store()
    apis = {"cffi": CffiPath(store), "cython": store}
    keys = [b"key:%06d" % i for i in range(BATCH)]
    mapping = {k: b"v" * args.value_size for k in keys}
    store.mset(mapping)
    assert apis["cffi"].mget(keys) == store.mget(keys) == list(mapping.values())
    rows = []
    for rnd in range(args.rounds):
        for op in OPS:
            reps = args.calls // BATCH
            for path in (PATHS if (rnd + OPS.index(op)) % 2 == 0 else PATHS[::-1]):
                run(apis[path], op, keys, mapping, max(1, reps // 20))  # warm up
                s = run(apis[path], op, keys, mapping, reps)
                n_keys = reps * BATCH
                calls = n_keys // BATCH if op in ("mget", "mset") and path == "cython" else n_keys
                rows.append({"round": rnd, "op": op, "path": path, "keys": n_keys, "calls": calls,
                             "seconds": f"{s:.6f}", "keys_per_s": f"{n_keys / s:.0f}",
                             "calls_per_s": f"{calls / s:.0f}", "ns_per_key": f"{s / n_keys * 1e9:.1f}",
                             "value_size": args.value_size, "load1": f"{os.getloadavg()[0]:.2f}"})
                common.log(f"round {rnd} {op:4s} {path:6s} {n_keys / s / 1e6:7.2f} M keys/s")
            common.write_csv(args.csv, rows)
    return rows


def spread(rows, op, path, field="keys_per_s"):
    v = [float(r[field]) for r in rows if r["op"] == op and r["path"] == path]
    return statistics.median(v), min(v), max(v)


def report(rows):
    loads = [float(r["load1"]) for r in rows]
    print(f"{len({r['round'] for r in rows})} rounds, {rows[0]['value_size']}-byte values, "
          f"1-min load average {min(loads):.2f}-{max(loads):.2f} during the runs")
    print(f"{'op':5s} {'path':7s} {'M keys/s median (min-max)':>28s} {'ns/key':>7s} {'calls/s':>12s}   cython/cffi (paired)")
    for op in OPS:
        for path in PATHS:
            med, lo, hi = spread(rows, op, path)
            calls = spread(rows, op, path, "calls_per_s")[0]
            ratio = common.paired(rows, "path", "cython", "cffi", field="keys_per_s", op=op) if path == "cython" else None
            print(f"{op:5s} {path:7s} {med / 1e6:12.2f} ({lo / 1e6:5.2f}-{hi / 1e6:5.2f})      {1e9 / med:7.0f} "
                  f"{calls:12,.0f}" + (f"   {ratio:.1f}x" if ratio else ""))


def draw(rows, path_png):
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    w = 0.38
    for i, path in enumerate(PATHS):
        st = [spread(rows, op, path) for op in OPS]
        xs = [x + (i - 0.5) * w for x in range(len(OPS))]
        med = [m / 1e6 for m, _, _ in st]
        err = [[(m - lo) / 1e6 for m, lo, _ in st], [(hi - m) / 1e6 for m, _, hi in st]]
        ax.bar(xs, med, w, yerr=err, capsize=3, label=path)
        for x, m in zip(xs, med):
            ax.text(x, m, f"{m:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(OPS)))
    ax.set_xticklabels(["get (single)", "set (single)", f"mget ({BATCH} keys)", f"mset ({BATCH} keys)"])
    ax.set_ylabel("M keys/s (median, min-max)")
    ax.set_title("kvstore.Store from Python: cffi path vs Cython path (cffi has no batch call: a loop)",
                 fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    common.save_figure(fig, path_png)


def add_args(ap):
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=1_000_000, help="keys per run (single calls, or batches x 1,000)")
    ap.add_argument("--value-size", type=int, default=32)


def check_args(args):
    if args.calls < BATCH:
        raise SystemExit(f"{NAME}: --calls must be at least {BATCH}, got {args.calls}")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
