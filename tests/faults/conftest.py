"""Fixtures of the fault-injection tests: a data dir and disk-mode nodes on it.

  data_dir - an empty directory for one test
  nodes    - start(data_dir, **settings) -> a started disk-mode Node (a new one each call,
             with the test module's NODE_DEFAULTS under settings, e.g. {"data_file": True});
             whatever still runs at the end of the test is killed
"""
import pytest

from helpers import faultlib as fl


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.fixture
def nodes(request):
    with fl.started_nodes(**getattr(request.module, "NODE_DEFAULTS", {})) as start:
        yield start
