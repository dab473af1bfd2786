"""TxWriter: a client thread running transactions whose halves would show, for the tests of
EXEC's durability (kill -9 during EXECs: each is all there or not at all)."""
import threading

import redis

from .conn import client


class TxWriter(threading.Thread):
    """Runs MULTI / SET g:a n / SET g:b n / INCR g:c / EXEC for n = start+1, start+2, ...
    until stop is set or the server goes away. After any whole number of transactions
    g:a == g:b == n, and g:c counts them (== n when g:c started at start). acked: the last
    n whose EXEC reply arrived."""

    def __init__(self, port, group, stop=None, start=0):
        super().__init__(daemon=True)
        self.port, self.group, self.acked = port, group, start
        self.stop = stop or threading.Event()

    def run(self):
        g = self.group
        try:
            with client(self.port, socket_timeout=10) as c:
                n = self.acked
                last = n + 100000
                while not self.stop.is_set() and n < last:
                    n += 1
                    with c.pipeline(transaction=True) as p:
                        p.set(f"{g}:a", n).set(f"{g}:b", n).incr(f"{g}:c")
                        p.execute()
                    self.acked = n
        except (redis.ConnectionError, redis.TimeoutError, ConnectionError, OSError):
            pass  # the server was killed
