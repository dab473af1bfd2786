"""ext/ldu.c through the cffi binding: the sequential semantics of LDU.

A hypothesis state machine drives producers' ldu_log calls and a consumer that takes
a batch and claims / releases its nodes one step at a time, so logs land between a
claim and its release (the second claim's case). It mirrors the marks, used bits,
queue order and push counter in a plain Python model, and checks the property that
matters: the applied set plus the pending marks always says what the last logged
operation of each object says, and after a final drain the applied set equals it.

Objects 0-2 follow the paper's alternation (insert, remove, insert, ...) with
absorb=1; object 3 gets any operation, repeats included, with absorb=0 (a later
operation supersedes a pending one; apply is idempotent).
"""
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvstore._native import ffi, lib

INSERT, REMOVE = 0, 1  # enum in ldu.h (not declared to cffi)
ABSORB_OBJS = [0, 1, 2]
SUPERSEDE_OBJ = 3
NOBJ = 4


class Ldu:
    """One queue and NOBJ objects, with node pointers mapped back to (object, op)."""

    def __init__(self, nobj=NOBJ):
        self.q = ffi.new("struct ldu_queue *")
        lib.ldu_queue_init(self.q)
        self.objs = [ffi.new("struct ldu_obj *") for _ in range(nobj)]
        for o in self.objs:
            lib.ldu_obj_init(o)
        self.node_of = {}
        for i, o in enumerate(self.objs):
            for op in (INSERT, REMOVE):
                self.node_of[(i, op)] = ffi.addressof(o[0], "node", op)
        self.key_of = {int(ffi.cast("uintptr_t", n)): k for k, n in self.node_of.items()}

    def log(self, i, op, absorb):
        return lib.ldu_log(self.q, self.objs[i], op, absorb)

    def take(self):
        """ldu_take + ldu_reverse, as (object, op) keys in push order."""
        n = lib.ldu_reverse(lib.ldu_take(self.q))
        out = []
        while n != ffi.NULL:
            out.append(self.key_of[int(ffi.cast("uintptr_t", n))])
            n = n.next
        return out

    def claim(self, key):
        return lib.ldu_claim(self.node_of[key])

    def release(self, key):
        return lib.ldu_release(self.objs[key[0]], self.node_of[key])

    def mark(self, i, op):
        return self.objs[i].node[op].mark

    def used(self, i):
        return self.objs[i].used

    @property
    def pushes(self):
        return self.q.pushes

    def drain(self, applied):
        """A whole consumer round, repeated until the queue is empty; applies to `applied`."""
        while batch := self.take():
            for key in batch:
                if self.claim(key):
                    applied[key[0]] = key[1] == INSERT
                if self.release(key):
                    applied[key[0]] = key[1] == INSERT


class LduMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.c = Ldu()
        self.want = [False] * NOBJ        # last logged op: True = inserted
        self.applied = [False] * NOBJ     # the consumer's structure
        self.mark = {(i, op): 0 for i in range(NOBJ) for op in (INSERT, REMOVE)}
        self.used = {(i, op): 0 for i in range(NOBJ) for op in (INSERT, REMOVE)}
        self.queue = []                   # pushed, not yet taken, in push order
        self.batch = []                   # taken, not yet claimed
        self.current = None               # claimed, not yet released
        self.pushes = 0

    # ---- producers
    def _log(self, i, op, absorb):
        me, other = (i, op), (i, 1 - op)
        if absorb and self.mark[other]:
            self.mark[other] = 0
            expect = 0                    # absorbed: the pair nets to nothing
        else:
            self.mark[other] = 0          # absorb=0: superseded
            self.mark[me] = 1
            if self.used[me]:
                expect = 0                # reuse: the queued node carries the new mark
            else:
                self.used[me] = 1
                self.queue.append(me)
                self.pushes += 1
                expect = 1
        self.want[i] = op == INSERT
        got = self.c.log(i, op, absorb)
        assert got == expect, f"ldu_log(obj {i}, {'remove' if op else 'insert'}, absorb={absorb})"
        assert self.c.pushes == self.pushes

    @rule(i=st.sampled_from(ABSORB_OBJS))
    def log_alternating(self, i):
        self._log(i, REMOVE if self.want[i] else INSERT, 1)

    @rule(op=st.sampled_from([INSERT, REMOVE]))
    def log_supersede(self, op):
        self._log(SUPERSEDE_OBJ, op, 0)

    # ---- the consumer, one step at a time
    def _apply(self, key):
        i, op = key
        if i in ABSORB_OBJS:  # absorbing keeps applied ops alternating
            assert self.applied[i] != (op == INSERT), f"object {i}: {key} applied twice or out of order"
        self.applied[i] = op == INSERT

    @precondition(lambda self: not self.batch and self.current is None)
    @rule()
    def take(self):
        got = self.c.take()
        assert got == self.queue, "ldu_take + ldu_reverse must give push order"
        self.batch, self.queue = got, []

    @precondition(lambda self: self.batch and self.current is None)
    @rule()
    def claim(self):
        key = self.batch.pop(0)
        expect, self.mark[key] = self.mark[key], 0
        assert self.c.claim(key) == expect
        if expect:
            self._apply(key)
        self.current = key

    @precondition(lambda self: self.current is not None)
    @rule()
    def release(self):
        key, self.current = self.current, None
        self.used[key] = 0
        expect, self.mark[key] = self.mark[key], 0
        assert self.c.release(key) == expect, f"second claim of {key}"
        if expect:
            self._apply(key)

    @rule()
    def drain(self):
        if self.current is not None:
            self.release()
        while self.batch or self.queue:
            if not self.batch:
                self.take()
            while self.batch:
                self.claim()
                self.release()
        assert self.applied == self.want, "after a drain the applied state is the last op of each object"
        for i in range(NOBJ):
            assert self.c.used(i) == 0 and self.c.mark(i, INSERT) == 0 and self.c.mark(i, REMOVE) == 0

    # ---- invariants
    @invariant()
    def c_matches_model(self):
        for (i, op), m in self.mark.items():
            assert self.c.mark(i, op) == m, f"mark of object {i} node {op}"
        for i in range(NOBJ):
            assert self.c.used(i) == self.used[(i, INSERT)] | self.used[(i, REMOVE)] << 1
        assert self.c.pushes == self.pushes

    @invariant()
    def applied_plus_pending_is_the_last_op(self):
        for i in range(NOBJ):
            mi, mr = self.mark[(i, INSERT)], self.mark[(i, REMOVE)]
            assert not (mi and mr), f"object {i}: both marks set"
            state = True if mi else False if mr else self.applied[i]
            assert state == self.want[i], f"object {i}: applied {self.applied[i]} + marks {mi}/{mr} != last op"

    def teardown(self):
        self.drain()


LduMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None,
                                        derandomize=True, suppress_health_check=[HealthCheck.too_slow])
TestLdu = LduMachine.TestCase


# ---------------------------------------------------------------- worked examples

def test_absorbing_insert_then_remove_costs_nothing():
    c = Ldu(1)
    assert c.log(0, INSERT, 1) == 1
    assert c.log(0, REMOVE, 1) == 0          # absorbed: no push ...
    assert c.pushes == 1
    assert c.take() == [(0, INSERT)]         # ... the insert node is garbage:
    assert c.claim((0, INSERT)) == 0         # the consumer finds no mark
    assert c.release((0, INSERT)) == 0
    assert c.used(0) == 0 and c.take() == []


def test_reuse_of_a_queued_node_does_not_push_again():
    c = Ldu(1)
    assert c.log(0, INSERT, 1) == 1
    assert c.log(0, REMOVE, 1) == 0          # absorbed, insert node still queued (garbage)
    assert c.log(0, INSERT, 1) == 0          # reused: mark set again, no second push
    assert c.pushes == 1
    assert c.take() == [(0, INSERT)]
    assert c.claim((0, INSERT)) == 1
    assert c.release((0, INSERT)) == 0


def test_second_claim_picks_up_a_reuse_that_raced_with_the_apply():
    c = Ldu(1)
    c.log(0, INSERT, 1)
    c.log(0, REMOVE, 1)                      # absorbed: the queued insert node is garbage
    assert c.take() == [(0, INSERT)]
    assert c.claim((0, INSERT)) == 0         # consumer: nothing to apply ...
    assert c.log(0, INSERT, 1) == 0          # ... producer reuses the node meanwhile (used still set)
    assert c.release((0, INSERT)) == 1       # the second claim is the only place it is seen
    assert c.used(0) == 0 and c.pushes == 1 and c.take() == []


def test_log_after_release_pushes_again():
    c = Ldu(1)
    c.log(0, INSERT, 1)
    c.take()
    assert c.claim((0, INSERT)) == 1 and c.release((0, INSERT)) == 0
    assert c.log(0, REMOVE, 1) == 1
    assert c.log(0, INSERT, 1) == 0          # absorbs the remove
    assert c.log(0, REMOVE, 1) == 0          # reuses the queued remove node
    assert c.pushes == 2
    applied = {0: True}
    c.drain(applied)
    assert applied[0] is False


def test_take_gives_push_order_across_objects():
    c = Ldu(3)
    for i in (2, 0, 1):
        c.log(i, INSERT, 1)
    c.log(0, REMOVE, 1)                      # absorbed
    c.log(2, REMOVE, 1)                      # absorbed
    c.log(2, INSERT, 1)                      # reused
    assert c.take() == [(2, INSERT), (0, INSERT), (1, INSERT)]


def test_supersede_without_absorb():
    c = Ldu(1)
    assert c.log(0, INSERT, 0) == 1
    assert c.log(0, REMOVE, 0) == 1          # not absorbed: insert mark cleared, remove pushed
    assert c.mark(0, INSERT) == 0 and c.mark(0, REMOVE) == 1
    applied = {0: False}
    c.drain(applied)
    assert applied[0] is False


def test_defer_requeues_a_taken_node_once_with_its_mark_untouched():
    """ldu_defer is for consumers that read the object's state (kvstore's flusher): the node goes
    back on the queue as it is, its used bit still set, so producers reuse it instead of pushing."""
    c = Ldu(1)
    c.log(0, INSERT, 1)
    assert c.take() == [(0, INSERT)]
    assert c.claim((0, INSERT)) == 1         # claimed, but the consumer cannot apply now
    lib.ldu_defer(c.q, c.node_of[(0, INSERT)])
    assert c.mark(0, INSERT) == 0 and c.used(0) & 1
    assert c.log(0, INSERT, 1) == 0           # reused: it is still queued
    assert c.take() == [(0, INSERT)]         # exactly once


def test_defer_does_not_revive_an_op_cancelled_meanwhile():
    c = Ldu(1)
    assert c.log(0, INSERT, 1) == 1
    assert c.take() == [(0, INSERT)]
    assert c.claim((0, INSERT)) == 1         # consumer claims the insert, decides to defer it
    assert c.log(0, REMOVE, 1) == 1          # producer: no insert mark to absorb -> remove pushed
    lib.ldu_defer(c.q, c.node_of[(0, INSERT)])
    assert c.mark(0, INSERT) == 0 and c.mark(0, REMOVE) == 1
    applied = {0: False}
    c.drain(applied)
    assert applied[0] is False, "last op was remove, but the deferred insert was applied after it"


def test_defer_of_an_absorbed_op_applies_nothing():
    c = Ldu(1)
    c.log(0, INSERT, 1)
    c.log(0, REMOVE, 1)                      # absorbed: last op is remove, nothing to apply
    assert c.take() == [(0, INSERT)]
    lib.ldu_defer(c.q, c.node_of[(0, INSERT)])   # consumer defers the batch unread
    applied = {0: False}
    c.drain(applied)
    assert applied[0] is False, "the absorbed insert was applied"
