"""Paper 004's experiments at their --quick scale, run as the installed command runs them:
each writes its CSV (every server, every batch size, the numbers the figure needs) and
draws its PNG from it."""
import os
import shutil
import subprocess
import sys

import pytest

from kvstore.experiments import common

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not shutil.which("redis-server"), reason="p004_write compares kvstore with redis-server")
@pytest.mark.timeout(300)
def test_p004_write_quick_writes_every_server_and_batch_and_draws_them(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KVSTORE_RESULTS"}
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "experiment", "run", "p004_write", "--quick", "--",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=280, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = common.read_csv(tmp_path / "p004_write.csv")
    # QUICK: 1 round, k = 1 and 8, the four servers
    assert {(x["server"], x["batch"]) for x in rows} == {
        (s, k) for s in ("kvstore", "kvstore-disk", "redis", "redis-aof") for k in ("1", "8")}
    for x in rows:
        assert int(x["messages"]) > 0 and float(x["throughput"]) > 0, x
        assert float(x["p99_us"]) >= float(x["p50_us"]) > 0 and x["message_bytes"] == "85", x
        assert x["cpu_us_per_msg"] != "" and float(x["server_cpu_s"]) >= 0, x
    assert (tmp_path / "p004_write.png").read_bytes().startswith(PNG_MAGIC)
    assert "of proportional" in r.stdout and "kvstore-disk/redis-aof" in r.stdout
