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


def fio_rows(path):
    return {(x["target"], x["load"], x["backend"]): x for x in common.read_csv(path)}


@pytest.mark.skipif(not (shutil.which("fio") and shutil.which("nbdkit")),
                    reason="Figs. 7-9 run fio against nbdkit memory (make deps installs both)")
@pytest.mark.timeout(400)
def test_p001_fio_quick_measures_nbdkit_and_every_backend_of_this_build(tmp_path):
    from kvstore.experiments import p001_fio
    r = run("p001_fio", tmp_path, timeout=360)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = fio_rows(tmp_path / "p001_fio.csv")
    # our four rows switch on once `kvstore blockdev serve` is in the build: then every one must start
    backends = p001_fio.BACKENDS if p001_fio.blockdev_serve_available() else ["nbdkit-memory"]
    loads = ["rand-read-4k", "rand-write-4k", "seq-read-128k", "qd1-read-4k"]  # QUICK's
    assert set(rows) == {("tcp", ld, b) for ld in loads for b in backends}, r.stderr[-3000:]
    for x in rows.values():
        assert int(x["iops"]) > 0 and int(x["ios"]) > 0, x
        assert float(x["p999_us"]) >= float(x["p99_us"]) >= float(x["p50_us"]) > 0, x
        assert x["cpu_us_per_io"] != "" and float(x["nbd_cpu_s"]) > 0, x  # the NBD server's CPU, from /proc
        if x["backend"] in ("kvstore-node", "redis", "memcached"):
            assert float(x["kv_cpu_s"]) > 0, x  # its KV server worked too
    assert rows[("tcp", "seq-read-128k", "nbdkit-memory")]["bs"] == "128k"
    assert rows[("tcp", "qd1-read-4k", "nbdkit-memory")]["iodepth"] == "1"
    assert (tmp_path / "p001_fio.png").read_bytes().startswith(PNG_MAGIC)
    assert "rand-read-4k   tcp  nbdkit-memory" in r.stdout


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/fuse"), reason="losetup and mount need root and FUSE")
@pytest.mark.skipif(not all(shutil.which(t) for t in ("fio", "nbdkit", "nbdfuse", "mkfs.ext4", "mkfs.xfs")),
                    reason="ext4/xfs targets need fio, nbdkit, nbdfuse, e2fsprogs, xfsprogs (make deps)")
@pytest.mark.timeout(400)
def test_p001_fio_measures_ext4_and_xfs_through_nbdfuse_and_cleans_up(tmp_path):
    from kvstore.experiments import p001_fio
    backends = ["nbdkit-memory"] + (["embedded"] if p001_fio.blockdev_serve_available() else [])
    loops = subprocess.run(["losetup", "-l", "-n", "-O", "BACK-FILE"], capture_output=True, text=True).stdout
    r = run("p001_fio", tmp_path, "--targets", "ext4", "xfs", "--require", "ext4", "xfs", "--backends", *backends,
            "--loads", "rand-read-4k", "qd1-read-4k", timeout=360)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = fio_rows(tmp_path / "p001_fio.csv")
    assert set(rows) == {(t, ld, b) for t in ("ext4", "xfs") for ld in ("rand-read-4k", "qd1-read-4k")
                         for b in backends}
    assert all(int(x["iops"]) > 0 and float(x["fuse_cpu_s"]) > 0 for x in rows.values())  # I/O went through FUSE
    # torn down: no mount, loop device or nbdfuse of the run left behind
    with open("/proc/mounts") as f:
        assert "p001-" not in f.read()
    after = subprocess.run(["losetup", "-l", "-n", "-O", "BACK-FILE"], capture_output=True, text=True).stdout
    assert [ln for ln in after.splitlines() if "p001-" in ln] == [], (loops, after)
