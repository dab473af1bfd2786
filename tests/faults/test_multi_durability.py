"""EXEC is one unit in the log: a server killed with SIGKILL while clients run
transactions comes back with each transaction all there or not at all, and
every acknowledged one there (disk mode, with and without the data file).

Each writer owns a group of keys g:a, g:b, g:c and runs, over and over,
    MULTI / SET g:a n / SET g:b n / INCR g:c / EXEC
so that after any whole number of transactions g:a == g:b == n and g:c counts
the transactions. Half a transaction shows as g:a != g:b or g:c != g:a.
"""
import threading
import time

import pytest
import redis

from helpers.conn import client

pytestmark = pytest.mark.timeout(180)

WRITERS = 3


class TxWriter(threading.Thread):
    def __init__(self, port, group, stop):
        super().__init__(daemon=True)
        self.port, self.group, self.stop = port, group, stop
        self.acked = 0  # transactions whose EXEC reply arrived

    def run(self):
        g = self.group
        try:
            with client(self.port, socket_timeout=10) as c:
                n = 0
                while not self.stop.is_set() and n < 100000:
                    n += 1
                    with c.pipeline(transaction=True) as p:
                        p.set(f"{g}:a", n).set(f"{g}:b", n).incr(f"{g}:c")
                        p.execute()
                    self.acked = n
        except (redis.ConnectionError, redis.TimeoutError, ConnectionError, OSError):
            pass  # the server was killed


@pytest.mark.parametrize("data_file", [False, True], ids=["log", "log+datafile"])
def test_kill_during_execs(nodes, data_dir, data_file):
    settings = {"data_file": data_file}
    if data_file:
        settings["max_memory"] = "64mb"
    n = nodes(data_dir, **settings)
    stop = threading.Event()
    ws = [TxWriter(n.port, f"w{i}", stop) for i in range(WRITERS)]
    for w in ws:
        w.start()
    deadline = time.time() + 20
    while time.time() < deadline and min(w.acked for w in ws) < 200:
        time.sleep(0.05)
    assert min(w.acked for w in ws) > 0, "no transaction was acknowledged"
    n.kill()  # SIGKILL, mid-transactions
    stop.set()
    for w in ws:
        w.join(timeout=15)
    m = nodes(data_dir, **settings)
    with client(m.port) as c:
        for w in ws:
            a, b, cnt = (c.get(f"{w.group}:{x}") for x in "abc")
            assert a == b == cnt, f"{w.group}: half a transaction survived: a={a} b={b} c={cnt}"
            assert int(a) >= w.acked, f"{w.group}: acknowledged transaction {w.acked} lost (have {a})"
