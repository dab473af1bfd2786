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


@pytest.mark.skipif(not (shutil.which("redis-server") and shutil.which("mosquitto")),
                    reason="p004_write compares kvstore with redis-server and mosquitto")
@pytest.mark.timeout(300)
def test_p004_write_quick_writes_every_server_and_batch_and_draws_them(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KVSTORE_RESULTS"}
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "experiment", "run", "p004_write", "--quick", "--",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=280, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = common.read_csv(tmp_path / "p004_write.csv")
    # QUICK: 1 round, k = 1 and 8, the eight servers (kvstore over RESP and UDP, Redis, Mosquitto)
    assert {(x["server"], x["batch"]) for x in rows} == {
        (s, k) for s in ("kvstore", "kvstore-disk", "kvstore-udp", "kvstore-udp-disk", "redis", "redis-aof",
                         "mosquitto-qos0", "mosquitto-qos1") for k in ("1", "8")}
    for x in rows:
        assert int(x["messages"]) > 0 and float(x["throughput"]) > 0, x
        assert float(x["p99_us"]) >= float(x["p50_us"]) > 0 and x["message_bytes"] == "85", x
        assert x["cpu_us_per_msg"] != "" and float(x["server_cpu_s"]) >= 0, x
    assert (tmp_path / "p004_write.png").read_bytes().startswith(PNG_MAGIC)
    assert "of proportional" in r.stdout and "kvstore-disk/redis-aof" in r.stdout
    assert "kvstore-udp/kvstore" in r.stdout


def run_quick(name, tmp_path, timeout=280):
    env = {k: v for k, v in os.environ.items() if k != "KVSTORE_RESULTS"}
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "experiment", "run", name, "--quick", "--",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / f"{name}.png").read_bytes().startswith(PNG_MAGIC)
    return r, common.read_csv(tmp_path / f"{name}.csv")


@pytest.mark.skipif(not shutil.which("mosquitto"), reason="p004_mqtt compares kvstore with mosquitto")
@pytest.mark.timeout(300)
def test_p004_mqtt_quick_publishes_and_delivers_on_every_server_and_load(tmp_path):
    r, rows = run_quick("p004_mqtt", tmp_path)
    # QUICK: 1 round, one subscriber; QoS 0 on the three servers, QoS 1 on the two durable-or-broker ones
    assert {(x["load"], x["server"]) for x in rows} == {
        ("qos0", "kvstore"), ("qos0", "kvstore-disk"), ("qos0", "mosquitto"), ("qos1", "kvstore-disk"),
        ("qos1", "mosquitto")}
    for x in rows:
        assert x["subscribers"] == "1" and x["message_bytes"] == "85", x
        assert int(x["published"]) > 0 and float(x["throughput"]) > 0, x
        assert int(x["delivered"]) > 0 and float(x["deliver_throughput"]) > 0, x
        assert int(x["lost"]) == max(0, int(x["published"]) * int(x["subscribers"]) - int(x["delivered"])), x
        assert 0 < float(x["dlv_p50_us"]) <= float(x["dlv_p99_us"]) <= float(x["dlv_p999_us"]), x
        assert 0 < float(x["ack_p50_us"]) <= float(x["ack_p99_us"]), x
        assert x["cpu_us_per_delivered"] != "" and float(x["server_cpu_s"]) >= 0, x
        if x["server"].startswith("kvstore"):  # subscribers read the streams' tails: nothing is dropped
            assert x["lost"] == "0", x
    assert "target qos0 subs 1: kvstore/mosquitto delivered msg/s" in r.stdout
    assert "target qos1 subs 1: kvstore-disk/mosquitto delivered msg/s" in r.stdout


@pytest.mark.skipif(not shutil.which("redis-server"), reason="p004_read compares kvstore with redis-server")
@pytest.mark.timeout(300)
def test_p004_read_quick_drains_every_server_and_counts_them(tmp_path):
    r, rows = run_quick("p004_read", tmp_path)
    assert {(x["server"], x["count"]) for x in rows} == {
        (s, k) for s in ("kvstore", "kvstore-disk", "redis", "redis-aof") for k in ("1", "100")}
    for x in rows:  # every message written was read and acknowledged (the experiment checks it too)
        assert x["messages"] == "20000" and float(x["throughput"]) > 0 and x["cpu_us_per_msg"] != "", x
    assert "kvstore-disk/redis-aof" in r.stdout


@pytest.mark.timeout(300)
def test_p004_spill_quick_evicts_and_reads_back_only_the_stream_larger_than_memory(tmp_path):
    r, rows = run_quick("p004_spill", tmp_path)
    by = {x["setting"]: x for x in rows}
    assert set(by) == {"fits", "spills"}
    for x in rows:  # every acknowledged message is in the stream (the experiment checks XLEN too)
        assert x["messages"] == "60000" and float(x["xadd_per_s"]) > 0, x
        assert 0 < float(x["xrange_p50_us"]) <= float(x["xrange_p99_us"]), x
    # with memory to spare nothing leaves it; past --max-memory old batches go to the batch
    # store and random reads over the whole stream bring some back
    assert by["fits"]["batches_evicted"] == "0" and float(by["fits"]["batches_loaded_per_read"]) == 0, by["fits"]
    assert int(by["spills"]["batches_evicted"]) > 100, by["spills"]
    assert float(by["spills"]["batches_loaded_per_read"]) > 0, by["spills"]
    assert float(by["spills"]["used_memory_mb"]) < float(by["fits"]["used_memory_mb"]), rows
    assert "spills/fits XADD msg/s" in r.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="p004_pull runs its server in a network namespace (root)")
@pytest.mark.timeout(300)
def test_p004_pull_quick_measures_every_mode(tmp_path):
    r, rows = run_quick("p004_pull", tmp_path)
    modes = {x["mode"]: x for x in rows}
    assert set(modes) == {"bounce", "bounce-copy", "l1-hot", "l1-hit", "l1-miss", "detached"}
    for x in rows:
        assert int(x["pulls"]) > 0 and float(x["throughput"]) > 0 and x["server_cpu_us_per_pull"] != "", x
        assert 0 < float(x["p50_us"]) <= float(x["p99_us"]), x  # the generator's latency histogram
    # the kernel answered the hits and almost none of the misses; the bounces answered in XDP
    for m in ("l1-hot", "l1-hit"):
        assert int(modes[m]["xdp_answered"]) >= 0.9 * int(modes[m]["pulls"]), modes[m]
        assert float(modes[m]["server_process_cpu_s"]) < 0.5, modes[m]  # kvstore itself did (nearly) nothing
    # the hot set is the first --hot batches (8 in QUICK) of the 30-odd sealed ones
    assert int(modes["l1-hot"]["pulled_batches"]) == 8 < int(modes["l1-hit"]["pulled_batches"]), rows
    assert int(modes["l1-miss"]["xdp_answered"]) < 0.2 * int(modes["l1-miss"]["pulls"]), modes["l1-miss"]
    for m in ("bounce", "bounce-copy"):
        assert int(modes[m]["xdp_answered"]) >= int(modes[m]["pulls"]), modes[m]
    assert "l1-hit/bounce" in r.stdout and "l1-hot/bounce" in r.stdout and "l1-hit/l1-miss" in r.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the XDP pull generator needs root")
def test_xdp_pull_generator_refuses_bad_settings():
    """kvstore.bench.pull_xdp (ext/bench/pullgen.c) says what was wrong and what it accepts,
    before it loads or attaches anything."""
    from kvstore import bench
    from kvstore.errors import ConfigError
    base = dict(ifname="lo", dst_mac="02:00:00:00:00:01", src_addr="127.0.0.1", dst_addr="127.0.0.1", port=9,
                duration=0.1)
    for bad, text in (({"window": 0}, "window: expected 1..65536"), ({"streams": 0}, "streams: expected 1..1000000"),
                      ({"batches": 0}, "batches: expected at least 1"), ({"dst_mac": "nope"}, "destination MAC"),
                      ({"dst_addr": "::1"}, "addresses: expected IPv4"), ({"duration": 0}, "duration: expected")):
        with pytest.raises(ConfigError, match=text):
            bench.pull_xdp(**{**base, **bad})
    with pytest.raises(OSError, match="interface kvnosuch0"):
        bench.pull_xdp(**{**base, "ifname": "kvnosuch0"})
