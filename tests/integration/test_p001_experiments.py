"""Paper 001's experiments (p001_kvs: Fig. 6; p001_fio: Figs. 7-9) at their --quick scale, run
as the installed command runs them: each writes its CSV (every server / backend it could start,
every load, the numbers the figures need) and draws its PNG from it."""
import os
import shutil
import subprocess
import sys

import pytest

from kvstore.experiments import common

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(name, out, *extra, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "KVSTORE_RESULTS"}
    return subprocess.run([sys.executable, "-m", "kvstore.cli", "experiment", "run", name, "--quick", "--",
                           "--out", str(out), *extra], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.skipif(not (shutil.which("redis-server") and shutil.which("memcached")),
                    reason="Fig. 6 compares kvstore with redis-server and memcached (make deps installs them)")
@pytest.mark.timeout(300)
def test_p001_kvs_quick_writes_every_server_op_and_rate_and_draws_them(tmp_path):
    r = run("p001_kvs", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = common.read_csv(tmp_path / "p001_kvs.csv")
    # QUICK: 1 round, two open-loop rates + the closed-loop point, GET and SET, three servers
    assert {(x["server"], x["op"], x["rate"]) for x in rows} == {
        (s, op, rate) for s in ("kvstore", "redis", "memcached") for op in ("GET", "SET")
        for rate in ("5000", "20000", "0")}
    for x in rows:
        assert float(x["throughput"]) > 0 and float(x["p99_us"]) >= float(x["p50_us"]) > 0, x
        assert x["cpu_us_per_req"] != "" and float(x["server_cpu_s"]) >= 0, x
        assert int(x["requests"]) > 0 and x["value_size"] == "4096"
        if x["op"] == "GET":
            assert float(x["hit_ratio"]) > 0.5, x  # preloaded: GETs read 4 KiB values, not misses
    assert (tmp_path / "p001_kvs.png").read_bytes().startswith(PNG_MAGIC)
    assert "GET closed-loop max: kvstore" in r.stdout and "kvstore/memcached" in r.stdout
