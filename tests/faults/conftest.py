"""Fixtures of the fault-injection tests: a data dir, disk-mode nodes on it, a remote-mode pair.

  data_dir - an empty directory for one test
  nodes    - start(data_dir, **settings) -> a started disk-mode Node (a new one each call,
             with the test module's NODE_DEFAULTS under settings, e.g. {"data_file": True});
             whatever still runs at the end of the test is killed
  pair     - a helpers.pair.Pair (nodes A and B, each the other's log peer) in tmp_path,
             every node it started killed at the end
"""
import pytest

from helpers import faultlib as fl
from helpers.pair import Pair


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.fixture
def nodes(request):
    with fl.started_nodes(**getattr(request.module, "NODE_DEFAULTS", {})) as start:
        yield start


@pytest.fixture
def pair(tmp_path):
    p = Pair(tmp_path)
    yield p
    p.close()
