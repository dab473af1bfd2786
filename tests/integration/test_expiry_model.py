"""Expiry against a model, with a clock the test moves.

An in-process kvstore.Server (its C threads share this process, so the table's
clock offset, kvt_set_clock_offset, moves the server's time) runs SET [PX],
EXPIRE/PEXPIRE with NX/XX/GT/LT, PERSIST, GETEX, GET, TTL/PTTL, DEL and full
SCANs while the test jumps the clock forward by whole seconds; a model of
Redis's semantics predicts every reply. TTLs and jumps are whole seconds, so
the real milliseconds that pass between requests never move a key across its
expiry (a key whose TTL equals the time jumped is already expired on both
sides); PTTL is compared within a second, TTL with PTTL's rounding. (Real time
adds up within an example only: each starts at offset 0 with an empty keyspace.)
"""
import pytest
import redis
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from helpers.conn import client
from kvstore import Server
from kvstore._native import lib

pytestmark = pytest.mark.timeout(300)

KEYS = ["e1", "e2", "e3", "e4"]
keys = st.sampled_from(KEYS)
secs = st.integers(min_value=1, max_value=5)


class ExpiryMachine(RuleBasedStateMachine):
    port = None

    @initialize()
    def start(self):
        lib.kvt_set_clock_offset(0)
        self.offset = 0
        self.r = client(self.port, decode_responses=True)
        self.r.flushall()
        self.model = {}  # key -> [value, expire in model ms or None]

    def teardown(self):
        lib.kvt_set_clock_offset(0)
        self.r.close()

    # model time: the clock offset; a key expires when its time is reached
    def live(self, k):
        v = self.model.get(k)
        if v is not None and v[1] is not None and v[1] <= self.offset:
            del self.model[k]
            v = None
        return v

    @rule(k=keys, v=st.sampled_from(["a", "b"]), ttl=st.none() | secs)
    def set(self, k, v, ttl):
        assert self.r.set(k, v, px=ttl * 1000 if ttl else None) is True
        self.model[k] = [v, self.offset + ttl * 1000 if ttl else None]

    @rule(k=keys, ttl=st.integers(min_value=-1, max_value=5),
          flag=st.sampled_from([None, "NX", "XX", "GT", "LT"]), ms=st.booleans())
    def expire(self, k, ttl, flag, ms):
        args = ["PEXPIRE" if ms else "EXPIRE", k, ttl * 1000 if ms else ttl] + ([flag] if flag else [])
        got = self.r.execute_command(*args)
        cur = self.live(k)
        if cur is None:
            assert got == 0
            return
        new = self.offset + ttl * 1000
        old = cur[1]
        ok = {None: True, "NX": old is None, "XX": old is not None,
              "GT": old is not None and new > old, "LT": old is None or new < old}[flag]
        if flag in ("GT", "LT") and new == old:
            ok = bool(got)  # the server's new time is later by the real ms passed since: either answer
        assert got == int(ok)
        if ok:
            if ttl <= 0:
                del self.model[k]
            else:
                cur[1] = new

    @rule(k=keys)
    def persist(self, k):
        cur = self.live(k)
        assert self.r.persist(k) == (cur is not None and cur[1] is not None)
        if cur is not None:
            cur[1] = None

    @rule(k=keys, how=st.sampled_from(["plain", "PX", "PERSIST"]), ttl=secs)
    def getex(self, k, how, ttl):
        args = {"plain": (), "PX": ("PX", ttl * 1000), "PERSIST": ("PERSIST",)}[how]
        got = self.r.execute_command("GETEX", k, *args)
        cur = self.live(k)
        assert got == (cur[0] if cur else None)
        if cur is not None and how == "PX":
            cur[1] = self.offset + ttl * 1000
        elif cur is not None and how == "PERSIST":
            cur[1] = None

    @rule(k=keys)
    def get(self, k):
        cur = self.live(k)
        assert self.r.get(k) == (cur[0] if cur else None)

    @rule(k=keys)
    def delete(self, k):
        assert self.r.delete(k) == (1 if self.live(k) else 0)
        self.model.pop(k, None)

    @rule(k=keys)
    def ttl(self, k):
        cur = self.live(k)
        want = -2 if cur is None else -1 if cur[1] is None else None
        got, pgot = self.r.ttl(k), self.r.pttl(k)
        if want is not None:
            assert (got, pgot) == (want, want)
        else:
            left = cur[1] - self.offset
            # TTL is PTTL rounded half up (Redis); the real ms passed since the SET (more of them
            # on a loaded machine) may round it down, never up, and TTL is asked just before PTTL
            assert (pgot + 500) // 1000 <= got <= left // 1000, (got, pgot, left)
            assert left - 1000 < pgot <= left

    @rule(jump=secs)
    def advance(self, jump):
        self.offset += jump * 1000
        lib.kvt_set_clock_offset(self.offset)

    @invariant()
    def scan_sees_live_keys(self):
        if not hasattr(self, "r"):
            return
        got = set(self.r.scan_iter(count=2))
        assert got == {k for k in KEYS if self.live(k)}


def test_expiry_state_machine():
    with Server(port=0, threads=2, durability="none") as srv:
        ExpiryMachine.port = srv.port
        run = ExpiryMachine.TestCase
        run.settings = settings(max_examples=120, stateful_step_count=40, deadline=None,
                                suppress_health_check=[HealthCheck.too_slow])  # a loaded machine
        try:
            run().runTest()
        finally:
            lib.kvt_set_clock_offset(0)
