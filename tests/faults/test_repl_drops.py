"""Every connection the log receiver drops says why in its log (replog_recv.c, rconn_drop).

A peer's sender that only sees "Connection reset by peer" needs the receiver's side of
the story: a batch with a gap or a range its records do not carry, a second HELLO, a
frame of the wrong kind, a connection replaced by a newer one of the same node, the
sender closing. Before, these paths closed the connection and logged nothing."""
import os
import re

import pytest

from helpers import faultlib as fl
from helpers import replwire as rw
from helpers.pair import two_free_ports, wait_for
from kvstore import Node


@pytest.fixture
def receiver(tmp_path):
    """A node whose only job is to be a log receiver (secret: replwire's): the Node."""
    n = Node(port=0, data_dir=str(tmp_path / "receiver"), durability="none", repl_port=two_free_ports()[0],
             repl_secret_file=rw.write_secret(tmp_path / "repl.secret"), log_path=str(tmp_path / "receiver.stderr"))
    n.start()
    n.rport = n.settings["repl_port"]
    yield n
    n.kill()


def drops(node):
    return re.findall(r"log receiver: dropped the connection from [\d.:]+ \(node ([0-9a-f]{32})\): (.*)", node.log())


def dropped(node, nid, pattern):
    """Wait for the receiver's log to say it dropped nid's connection with a reason matching pattern."""
    return wait_for(f"a drop of node {nid.hex()} matching {pattern!r}",
                    lambda: [why for who, why in drops(node) if who == nid.hex() and re.search(pattern, why)],
                    timeout=10)


def test_every_connection_the_receiver_drops_says_why(receiver):
    nid = os.urandom(16)
    rec = [fl.encode_record(fl.OP_SET, b"k%d" % i, b"v", i) for i in range(1, 4)]

    s = rw.FakeSender(receiver.rport, nid)  # a gap: LSN 3 while nothing is held
    assert s.batch(rec[2]) is None
    s.close()
    dropped(receiver, nid, r"a batch from LSN 3 leaves a gap: held up to 0")

    s = rw.FakeSender(receiver.rport, nid)  # the frame names LSNs its records do not carry
    s.link.send(rw.BATCH, 1, 2, rec[0])
    assert s.link.closed() is None
    s.close()
    dropped(receiver, nid, r"a batch named LSNs 1-2 but carried 1 records up to LSN 1")

    s = rw.FakeSender(receiver.rport, nid)  # one HELLO per connection
    s.link.send(rw.HELLO, rw.VERSION, 0, nid)
    assert s.link.closed() is None
    s.close()
    dropped(receiver, nid, r"a second HELLO")

    s = rw.FakeSender(receiver.rport, nid)  # a frame a sender never sends
    s.link.send(rw.HELLO_ACK, 0, 0, b"")
    assert s.link.closed() is None
    s.close()
    dropped(receiver, nid, r"an unexpected frame")

    old = rw.FakeSender(receiver.rport, nid)  # one sender per node: the newest wins
    new = rw.FakeSender(receiver.rport, nid)
    assert old.link.closed() is None
    dropped(receiver, nid, r"replaced by a newer connection of the same node")
    assert new.batch(rec[0]) == 1  # the newer one is served
    new.close()
    dropped(receiver, nid, r"the peer closed the connection")
