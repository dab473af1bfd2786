"""Shared fixtures for kvstore's tests.

Servers under test:
  kv            - one kvstore Node (2 pollers) for a whole test module
  kv_fresh      - a kvstore Node of its own for one test
  redis_server  - a real redis-server (session), the reference for byte comparisons
  redis_auth / kv_auth - the same two with requirepass set (module)
  c             - a redis-py client (str replies) on kv, its keyspace emptied first

The kvstore servers run with --durability none (memory only) unless a test passes
durability=...: `kvstore serve` defaults to disk, the tests here check commands and
protocol. Each has a fresh temporary data dir; nothing is written into the repository.
Every server listens on 127.0.0.1 on a port the OS picked. redis-server is
started with --save '' --appendonly no (no files), and --databases 1, as kvstore
has a single database (its CONFIG GET databases says 1), so that SELECT 1 means
the same thing on both.

Library code (RESP codec, connections, servers) is in the helpers package next to this file.
"""
import pytest

from helpers.conn import client
from helpers.servers import PASSWORD, RedisServer, need, start_node, stop_node


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def kv():
    """A kvstore server (2 pollers, 256 MB bound) shared by one test module."""
    n = start_node(threads=2, max_memory="256mb")
    yield n
    stop_node(n)


@pytest.fixture
def kv_fresh():
    """A kvstore server for one test."""
    n = start_node(threads=2)
    yield n
    stop_node(n)


@pytest.fixture
def kv_node_factory():
    """Start kvstore servers with any settings; all are stopped after the test."""
    nodes = []

    def make(**settings):
        settings.setdefault("threads", 2)
        n = start_node(**settings)
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        if n.proc:
            stop_node(n)


@pytest.fixture(scope="module")
def kv_auth():
    n = start_node(threads=2, requirepass=PASSWORD)
    yield n
    stop_node(n)


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server, the reference implementation."""
    need("redis-server")
    r = RedisServer().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def redis_auth():
    need("redis-server")
    r = RedisServer("--requirepass", PASSWORD).start()
    yield r
    r.stop()


@pytest.fixture
def c(kv):
    """decode_responses client on an empty keyspace."""
    cl = client(kv.port, decode_responses=True)
    cl.flushall()
    yield cl
    cl.close()
