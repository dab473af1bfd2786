"""The EPOLLOUT interest policies (ext/pollpolicy.c) on scripted event sequences.

A small simulator plays what a poller does with one connection: each round either a
reply is queued (the poller asks want_out with pending=1 and registers EPOLLOUT if
the answer is yes), or EPOLLOUT fires (the reply is written; want_out with pending=0,
spurious=0), or EPOLLOUT fires with nothing to send (spurious=1). `busy` says whether
the poller's previous round read anything (other clients keep it busy, or not). It
counts the epoll_ctl calls the answers cause — the cost the policies differ in — and
the spurious wake-ups — the cost of keeping EPOLLOUT."""
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
        self.spurious = 0
        self.round = 0

    def _set(self, want):
        if bool(want) != self.out:
            self.out = bool(want)
            self.ctl += 1

    def step(self, reply, busy=True):
        """One poll round: a reply arrives (reply=True) or not; EPOLLOUT events as the set says."""
        self.round += 1
        idle = int(not busy)
        if self.out:  # level-triggered: a writable socket is reported every round
            spurious = not self.pending
            self.spurious += spurious
            self.pending = False
            self._set(self.pol.want_out(self.st, 0, int(spurious), self.round, idle))
        if reply:
            self.pending = True
            self._set(self.pol.want_out(self.st, 1, 0, self.round, idle))

    def run(self, pattern, rounds, busy=True):
        for i in range(rounds):
            self.step(pattern(i), busy)
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


def test_flexpoll_with_a_reply_every_few_busy_rounds_keeps_it_too():
    c = Conn("flexpoll").run(lambda i: i % (FLEX // 2) == 0, 1000)
    assert c.ctl == 1
    assert c.spurious <= 1000  # the price: a spurious event in the busy rounds between replies


def test_flexpoll_drops_epollout_at_once_when_the_poller_goes_idle():
    c = Conn("flexpoll").run(lambda i: True, 100)
    assert c.out
    c.step(False, busy=False)
    assert not c.out, "kept EPOLLOUT on an idle poller: it would spin"


def test_flexpoll_drops_epollout_for_a_quiet_client_on_a_busy_poller():
    c = Conn("flexpoll").run(lambda i: True, 100)
    for _ in range(FLEX - 2):
        c.step(False)
    assert c.out, "dropped before PP_FLEX_ROUNDS rounds without a reply"
    for _ in range(3):
        c.step(False)
    assert not c.out, "still registered after PP_FLEX_ROUNDS rounds without a reply"


def test_flexpoll_is_strict_for_rare_replies_and_at_low_load():
    rare = Conn("flexpoll").run(lambda i: i % 50 == 0, 2000)
    assert rare.ctl == 80 and rare.spurious <= 40 * FLEX  # 40 replies: strict's 2 ctl each
    idle = Conn("flexpoll").run(lambda i: i % 3 == 0, 300, busy=False)
    assert idle.ctl == Conn("strict").run(lambda i: i % 3 == 0, 300).ctl
    assert idle.spurious == 0


def test_flexpoll_follows_a_connection_from_quiet_to_busy_at_once():
    c = Conn("flexpoll").run(lambda i: i % 50 == 0, 1000)
    before = c.ctl
    c.run(lambda i: True, 1000)
    assert c.ctl - before <= 1 and c.out
