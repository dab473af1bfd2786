"""Our NBD server's own bounds and log lines, beyond what the protocol document asks (the
conformance checks, and the memory a client that never reads its replies can pin, are in
test_nbd_protocol.py): GO/INFO answers of bounded size, and log lines that name the client."""
import os
import time

import pytest

from helpers import nbdwire as w

SIZE = 64 << 20


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
def test_a_connection_that_never_finishes_its_handshake_is_closed(target):
    """Connections that say nothing (or stop mid-negotiation) are closed 10 s after their
    accept, with a log line, so that they cannot hold every client slot; a connection in
    transmission stays, however idle."""
    mark = target.log_mark()
    with target.open() as idle, target.connect(timeout=30) as silent, target.connect(timeout=30) as half:
        half.greeting()
        half.client_flags()
        t0 = time.monotonic()
        assert silent.closed_by_server(timeout=25) and half.closed_by_server(timeout=5)
        assert time.monotonic() - t0 >= 5, "closed long before the handshake's time limit"
        assert idle.read(0, 512).error == 0
    assert "handshake not finished" in target.log_since(mark)
