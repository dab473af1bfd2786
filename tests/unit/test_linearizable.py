"""The linearizability checker the cluster's chaos tests use (tests/helpers/linearizable.py),
on histories whose answer is known."""
from helpers.linearizable import Op, check


def test_sequential_histories():
    assert check([Op("set", 1, 0, 1), Op("get", 1, 2, 3), Op("set", 2, 4, 5), Op("get", 2, 6, 7)]) is None
    assert check([Op("get", None, 0, 1)]) is None
    assert "not linearizable" in check([Op("get", 7, 0, 1)])  # a value nobody wrote
    assert "not linearizable" in check([Op("set", 1, 0, 1), Op("set", 2, 2, 3), Op("get", 1, 4, 5)])  # stale


def test_concurrent_operations_may_take_effect_in_either_order():
    assert check([Op("set", 1, 0, 10), Op("get", None, 1, 2), Op("get", 1, 3, 4)]) is None
    assert check([Op("set", 1, 0, 10), Op("set", 2, 0, 10), Op("get", 2, 11, 12), Op("get", 2, 13, 14)]) is None
    # once a read saw the write, a later read cannot miss it
    assert "not linearizable" in check([Op("set", 1, 0, 10), Op("get", 1, 2, 3), Op("get", None, 4, 5)])
    # two writers, readers see them in opposite orders: no single order explains both
    assert "not linearizable" in check([Op("set", 1, 0, 10), Op("set", 2, 0, 10), Op("get", 1, 11, 12),
                                        Op("get", 2, 13, 14), Op("get", 1, 15, 16)])


def test_an_unknown_outcome_may_or_may_not_have_happened():
    assert check([Op("set", 1, 0), Op("get", 1, 5, 6)]) is None
    assert check([Op("set", 1, 0), Op("get", None, 5, 6)]) is None
    assert "not linearizable" in check([Op("set", 1, 0), Op("get", 1, 5, 6), Op("get", None, 7, 8)])
    assert "not linearizable" in check([Op("set", 1, 5), Op("get", 1, 0, 1)])  # not before its call
    assert check([Op("get", 9, 0)]) is None  # a read whose answer never came tells nothing


def test_a_long_history_is_checked_quickly():
    h, t = [], 0.0
    for i in range(300):  # 300 writes, each read back
        h += [Op("set", i, t, t + 3), Op("get", i, t + 3.5, t + 4)]
        t += 4
    assert check(h) is None
    h.append(Op("get", 5, t + 1, t + 2))
    assert "not linearizable" in check(h)
