"""A linearizability checker for histories of one register (a key under SET and GET), in the
manner of Wing & Gong with Lowe's memoization (the search Knossos and Porcupine run): is
there an order of the operations, each taking effect at one instant between its call and its
return, in which every GET returns the value of the last SET before it?

An operation is Op(kind "set" or "get", value, call, ret): value is what SET wrote or what GET
returned (None: the key did not exist); call and ret are times from one monotonic clock, ret
None when the outcome is unknown (the client timed out, the connection broke): such a SET may
have taken effect at any time after its call or never, and such a GET tells nothing and is
left out. An operation refused before it ran (-MOVED, -CLUSTERDOWN, ...) is not in the
history at all.

Exponential in the worst case: keep histories bounded (a few hundred operations per key,
few concurrent clients). check() returns None when linearizable, else a message naming the
operations no order could place."""
from dataclasses import dataclass

INF = float("inf")


@dataclass(frozen=True)
class Op:
    kind: str        # "set" | "get"
    value: object    # SET's value, or what GET returned (None: absent)
    call: float
    ret: float = None  # None: the outcome is not known

    def __repr__(self):
        r = "?" if self.ret is None else f"{self.ret:.6f}"
        return f"{self.kind}({self.value!r}) [{self.call:.6f}, {r}]"


def check(history, initial=None):
    ops = [o for o in history if not (o.kind == "get" and o.ret is None)]
    ops.sort(key=lambda o: o.call)
    n = len(ops)
    ret = [INF if o.ret is None else o.ret for o in ops]
    must = (1 << n) - 1  # every completed operation must be placed; an unknown SET may be skipped
    for i, o in enumerate(ops):
        if o.ret is None:
            must &= ~(1 << i)
    seen = set()
    best = [0]

    def search(done, value):
        if done & must == must:
            return True
        key = (done, value)
        if key in seen:
            return False
        seen.add(key)
        if bin(done).count("1") > bin(best[0]).count("1"):
            best[0] = done
        # the candidates: operations not placed whose call precedes every unplaced
        # operation's return (one of them must take effect next)
        horizon = min((ret[i] for i in range(n) if not done >> i & 1), default=INF)
        for i in range(n):
            if done >> i & 1:
                continue
            if ops[i].call > horizon:
                break  # sorted by call: none after this one can go next
            o = ops[i]
            if o.kind == "set":
                if search(done | 1 << i, o.value):
                    return True
            elif o.value == value and search(done | 1 << i, value):
                return True
        return False

    import sys
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * n + 100))
    try:
        if search(0, initial):
            return None
    finally:
        sys.setrecursionlimit(limit)
    stuck = [ops[i] for i in range(n) if not best[0] >> i & 1]
    return f"not linearizable: no order places {stuck[:6]!r} (of {n} operations)"
