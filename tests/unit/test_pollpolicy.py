"""The EPOLLOUT interest policies (ext/pollpolicy.c) on scripted event sequences.

A small simulator plays what a poller does with one connection: each round either a
reply is queued (the poller asks want_out with pending=1 and registers EPOLLOUT if
the answer is yes), or EPOLLOUT fires (the reply is written; want_out with pending=0,
spurious=0), or EPOLLOUT fires with nothing to send (spurious=1). It counts the
epoll_ctl calls the answers cause — the cost the policies differ in."""

from kvstore._native import ffi, lib

FLEX = lib.PP_FLEX_ROUNDS


class Conn:
    def __init__(self, policy):
        self.pol = lib.pp_find(policy.encode())
        assert self.pol != ffi.NULL
        self.st = ffi.new("struct pp_conn *")
        self.out = False      # EPOLLOUT registered
        self.pending = False  # a reply waits to be written
        self.ctl = 0
        self.round = 0

    def _set(self, want):
        if bool(want) != self.out:
            self.out = bool(want)
            self.ctl += 1

    def step(self, reply):
        """One poll round: a reply arrives (reply=True) or not; EPOLLOUT events as the set says."""
        self.round += 1
        if self.out:  # level-triggered: a writable socket is reported every round
            spurious = not self.pending
            self.pending = False
            self._set(self.pol.want_out(self.st, 0, int(spurious), self.round))
        if reply:
            self.pending = True
            self._set(self.pol.want_out(self.st, 1, 0, self.round))

    def run(self, pattern, rounds):
        for i in range(rounds):
            self.step(pattern(i))
        return self


def test_policies_are_found_by_name_and_unknown_names_are_not():
    assert ffi.string(lib.pp_find(b"flexpoll").name) == b"flexpoll"
    assert lib.pp_find(b"flexpoll").write_at_round_end == 0
    assert lib.pp_find(b"direct").write_at_round_end == 1
    assert lib.pp_find(b"fast") == ffi.NULL


def test_strict_pays_two_epoll_ctl_per_reply():
    c = Conn("strict").run(lambda i: i % 2 == 0, 200)  # a reply every other round
    assert c.ctl == 200  # add on the reply, remove once it is written: 100 replies x 2


def test_flexpoll_keeps_epollout_under_load():
    c = Conn("flexpoll").run(lambda i: True, 1000)  # a reply every round
    assert c.ctl == 1  # registered once, never removed


def test_flexpoll_with_a_reply_every_few_rounds_keeps_it_too():
    c = Conn("flexpoll").run(lambda i: i % (FLEX // 2) == 0, 1000)
    assert c.ctl <= 2


def test_flexpoll_drops_epollout_after_the_load_goes_away():
    c = Conn("flexpoll").run(lambda i: True, 100)
    assert c.out
    for _ in range(FLEX - 1):
        c.step(False)
    assert c.out, "dropped before PP_FLEX_ROUNDS spurious rounds"
    for _ in range(2):
        c.step(False)
    assert not c.out, "still registered after PP_FLEX_ROUNDS rounds without a reply"


def test_flexpoll_turns_into_strict_for_rare_replies():
    """A reply every 50 rounds: keeping EPOLLOUT would cost ~50 spurious events per reply;
    once the mean gap is learnt the policy drops it right after each reply, as strict does."""
    c = Conn("flexpoll").run(lambda i: i % 50 == 0, 2000)
    strict = Conn("strict").run(lambda i: i % 50 == 0, 2000)
    late = Conn("flexpoll")
    late.run(lambda i: i % 50 == 0, 1000)
    before = late.ctl
    late.run(lambda i: i % 50 == 0, 1000)
    assert late.ctl - before == 40  # 20 replies, 2 epoll_ctl each, like strict
    assert c.ctl <= strict.ctl + 4


def test_flexpoll_adapts_when_a_quiet_connection_becomes_busy():
    c = Conn("flexpoll").run(lambda i: i % 50 == 0, 1000)  # quiet: learnt a long gap
    busy_from = c.ctl
    c.run(lambda i: True, 1000)                            # then a reply every round
    assert c.ctl - busy_from <= 16  # a few replies to relearn, then no epoll_ctl at all
    assert c.out
