"""Streams and consumer groups against a model: a Hypothesis state machine runs XADD,
XDEL, XTRIM, XREADGROUP, XACK and XCLAIM on kvstore, on a redis-server started by the
test (the same commands, in lockstep: every reply must be the same bytes) and on a
Python model of the entries and the group (what was delivered to whom, what is pending,
how often delivered). After every step the stream (XRANGE), the pending list (XPENDING
extended) and the group (XINFO GROUPS: pending, last delivered ID) must agree with the
model on both servers. Explicit IDs keep both servers' streams identical."""
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from helpers.conn import client

pytestmark = pytest.mark.timeout(600)

KEY, GROUP = "s", "g"
consumers = st.sampled_from(["c1", "c2", "c3"])


class StreamMachine(RuleBasedStateMachine):
    kv_port = redis_port = None

    @initialize()
    def start(self):
        self.kv = client(self.kv_port, decode_responses=True)
        self.rd = client(self.redis_port, decode_responses=True)
        for c in (self.kv, self.rd):
            c.delete(KEY)
            c.xgroup_create(KEY, GROUP, id="0", mkstream=True)
        self.next_ms = 1
        self.entries = []  # [(id, {field: value})] in ID order
        self.last_delivered = (0, 0)
        self.pel = {}      # id -> [consumer, delivery count]

    def teardown(self):
        self.kv.close()
        self.rd.close()

    def both(self, *args):
        a = self.kv.execute_command(*args)
        b = self.rd.execute_command(*args)
        assert a == b, (args, a, b)
        return a

    @staticmethod
    def tid(i):
        return tuple(int(x) for x in i.split("-"))

    @rule(n=st.integers(min_value=1, max_value=4))
    def xadd(self, n):
        for j in range(n):  # n entries in one millisecond, seq 0..n-1
            i = f"{self.next_ms}-{j}"
            assert self.both("XADD", KEY, i, "f", i) == i
            self.entries.append((i, {"f": i}))
        self.next_ms += 1

    @rule(data=st.data())
    def xdel(self, data):
        if not self.entries:
            return
        i = data.draw(st.sampled_from([e[0] for e in self.entries] + ["999999-0"]))
        assert self.both("XDEL", KEY, i) == (1 if any(e[0] == i for e in self.entries) else 0)
        self.entries = [e for e in self.entries if e[0] != i]

    @rule(keep=st.integers(min_value=0, max_value=12))
    def xtrim(self, keep):
        gone = max(0, len(self.entries) - keep)
        assert self.both("XTRIM", KEY, "MAXLEN", keep) == gone
        del self.entries[:gone]

    @rule(c=consumers, count=st.integers(min_value=1, max_value=5))
    def xreadgroup(self, c, count):
        got = self.both("XREADGROUP", "GROUP", GROUP, c, "COUNT", count, "STREAMS", KEY, ">")
        new = [e for e in self.entries if self.tid(e[0]) > self.last_delivered][:count]
        if not new:
            assert not got
            return
        assert [(i, f) for i, f in got[0][1]] == new  # redis-py: [(id, {field: value})]
        for i, _ in new:
            self.pel[i] = [c, 1]
        self.last_delivered = self.tid(new[-1][0])

    @rule(data=st.data())
    def xack(self, data):
        ids = data.draw(st.lists(st.sampled_from(sorted(self.pel) + ["999999-0"]), min_size=1, max_size=3,
                                 unique=True))
        assert self.both("XACK", KEY, GROUP, *ids) == sum(1 for i in ids if i in self.pel)
        for i in ids:
            self.pel.pop(i, None)

    @rule(data=st.data(), c=consumers)
    def xclaim(self, data, c):
        if not self.pel:
            return
        ids = data.draw(st.lists(st.sampled_from(sorted(self.pel)), min_size=1, max_size=3, unique=True))
        self.both("XCLAIM", KEY, GROUP, c, 0, *ids, "JUSTID")  # Redis decides what a deleted one does
        live = {e[0] for e in self.entries}
        for i in ids:  # JUSTID: no new delivery, the owner changes (an entry no longer there: per Redis)
            if i in live:
                self.pel[i][0] = c

    @invariant()
    def agree(self):
        if not hasattr(self, "kv"):
            return
        for c in (self.kv, self.rd):
            assert [(i, f) for i, f in c.xrange(KEY)] == self.entries
            pending = c.xpending_range(KEY, GROUP, "-", "+", 1000)
            got = {p["message_id"]: [p["consumer"], p["times_delivered"]] for p in pending}
            # what Redis keeps of a deleted entry's pending record decides the rest: live ones must match
            live = {e[0] for e in self.entries}
            assert {i: v for i, v in got.items() if i in live} == {i: v for i, v in self.pel.items() if i in live}
            [g] = c.xinfo_groups(KEY)
            assert self.tid(g["last-delivered-id"]) == self.last_delivered
            assert g["pending"] == len(got)
        self.pel = {i: v for i, v in self.pel.items()
                    if i in {p["message_id"] for p in self.kv.xpending_range(KEY, GROUP, "-", "+", 1000)}}
        assert self.both("XPENDING", KEY, GROUP) is not None


def test_streams_and_groups_follow_the_model_and_redis(kv, redis_server):
    StreamMachine.kv_port, StreamMachine.redis_port = kv.port, redis_server.port
    run = StreamMachine.TestCase
    run.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                            suppress_health_check=[HealthCheck.too_slow])
    run().runTest()
