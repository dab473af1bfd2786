"""Our NBD server's own bounds and log lines, beyond what the protocol document asks (the
conformance checks are in test_nbd_protocol.py): memory a client that never reads its replies
can pin, GO/INFO answers of bounded size, and log lines that name the client."""
import os
import time

import pytest

from helpers import nbdwire as w
from helpers.servers import rss_bytes

SIZE = 64 << 20
PIN_CAP = 256 << 20   # as test_nbd_protocol.py: what one connection may make the server hold, generously


@pytest.fixture(scope="module")
def target():
    t = w.start("kvstore", size=SIZE)
    yield t
    t.stop()


def test_a_unix_client_is_named_in_the_log(target):
    """Over a unix socket the peer address says nothing: the log line names the client's pid."""
    with target.open() as c:
        mark = target.log_mark()
        assert c.request(0x7777).error == w.EINVAL
        log = target.log_since(mark)
    assert f"unix:pid {os.getpid()}" in log, log


def test_go_sends_each_information_item_once(target):
    """64 NBD_INFO_NAME requests in one GO (the most one may carry) get one NAME reply: the
    replies of one option stay small, so the handshake's bound on unsent replies holds."""
    with target.connect() as c:
        c.greeting()
        c.client_flags()
        replies, exp = c.info(target.export, (w.INFO_NAME,) * 64, go=True)
        assert exp is not None, replies
        names = [r for r in replies if r.type == w.REP_INFO and r.data[:2] == w.INFO_NAME.to_bytes(2, "big")]
        assert len(names) == 1, f"{len(names)} NBD_INFO_NAME replies"
        assert c.read(0, 512).error == 0


@pytest.mark.slow
def test_small_reads_never_read_cannot_pin_unbounded_memory(target):
    """512-byte READs (28 bytes each way in, 528 out) sent while no reply is read: each holds a
    buffer larger than its payload until its reply is sent, and the in-flight bound must count
    that buffer, not the 512 bytes asked for."""
    batch = b"".join(w.request(w.CMD_READ, (i % 64) * 4096, 512, handle=i) for i in range(100))
    base = rss_bytes(target.pid)
    grew = total = sampled = 0
    stalled_since = None
    with target.open() as c:
        c.sock.settimeout(1)
        while total < 2_000_000 * 28 and grew <= PIN_CAP:
            try:
                total += c.sock.send(batch[total % len(batch):])
                stalled_since = None
            except TimeoutError:
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > 3:
                    break   # the server stopped reading: back-pressure
            if total - sampled >= 256 << 10:
                sampled, grew = total, rss_bytes(target.pid) - base
        grew = max(grew, rss_bytes(target.pid) - base)
    n = max(total // 28, 1)
    assert grew <= PIN_CAP, f"{n} READs of 512 bytes, no reply read, grew the server by {grew >> 20} MiB"
    assert target.alive()
    with target.open() as fresh:   # and the server still serves
        assert fresh.read(0, 512).error == 0
