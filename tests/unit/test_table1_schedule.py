"""p000_table1's measuring order and its reading of the rounds: the rows N and NH run side by
side (their ratio compares points measured seconds apart, not minutes apart, on a VM whose
speed drifts), every thread-pool size is a unit of its own, and the pool is reported at its
best per row."""
from kvstore.experiments import p000_table1 as t1


def test_n_and_nh_alternate_per_unit_in_every_round():
    us = ["threadpool-8", "threadpool-32", "poller-direct"]
    sched = t1.schedule(["N", "NH", "NHD"], us, 3)
    assert [g for g, _ in sched] == [["N", "NH"], ["NHD"]]
    pts = sched[0][1]
    assert len(pts) == 3 * 2 * len(us)
    for rnd in range(3):
        order = [(row, u) for r, row, u in pts if r == rnd]
        # each unit's N and NH points are next to each other
        for k in range(0, len(order), 2):
            assert {order[k][0], order[k + 1][0]} == {"N", "NH"}
            assert order[k][1] == order[k + 1][1]
    # every other round reversed: no unit is always measured first
    assert pts[0][2] != [u for r, _, u in pts if r == 1][0]


def test_one_row_of_the_pair_is_a_group_of_its_own():
    assert t1.groups(["NH", "NHL"]) == [["NH"], ["NHL"]]


def test_every_pool_size_is_measured_and_the_best_is_reported_per_row():
    class A:
        archs, workers = ["threadpool", "udp"], [8, 128]
    assert t1.units(A) == ["threadpool-8", "threadpool-128", "udp"]
    rows = [{"row": row, "arch": u, "round": str(rnd), "throughput": str(v)}
            for row, u, vals in (("NH", "threadpool-8", (300, 310, 290)), ("NH", "threadpool-128", (200, 220, 500)),
                                 ("NHL", "threadpool-8", (40, 42, 41)), ("NHL", "threadpool-128", (90, 95, 20)),
                                 ("NH", "udp", (999, 999, 999)))
            for rnd, v in enumerate(vals)]
    # by median, not by the best round (NH: 128's 500 is one round)
    assert t1.best_pool(rows) == {"NH": "threadpool-8", "NHL": "threadpool-128"}


def test_x_over_nh_pairs_rounds_by_their_number_not_their_place_in_the_csv():
    """After --resume/--rerun the CSV's rows are not in round order: round 1 of NHD must be
    divided by round 1 of NH, and a round only one side has is left out."""
    rows = [{"row": "NH", "arch": "udp", "round": "0", "throughput": "100"},
            {"row": "NH", "arch": "udp", "round": "1", "throughput": "200"},
            {"row": "NHD", "arch": "udp", "round": "1", "throughput": "100"},  # rerun: written first
            {"row": "NHD", "arch": "udp", "round": "0", "throughput": "50"},
            {"row": "NHD", "arch": "udp", "round": "2", "throughput": "70"}]  # no NH of round 2
    assert t1.ratios_to_nh(rows, ["udp"], ["NHD"], {}) == {("NHD", "udp"): [0.5, 0.5]}
