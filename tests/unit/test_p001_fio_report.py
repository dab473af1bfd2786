"""p001_fio's reading of its CSV: ratios paired by round on each load's own number (IOPS, MiB/s,
or QD1 p50 where lower is better), the issue's targets judged from them, and the fio options
that make each load (sequential jobs on their own part of the working set)."""
import argparse

import pytest

from kvstore.experiments import p001_fio as fio


def row(rnd, backend, load, target="tcp", **v):
    base = {"iops": "1000", "bw_mib_s": "100", "p50_us": "50", "p99_us": "90", "p999_us": "200",
            "cpu_us_per_io": "5"}
    return {"round": str(rnd), "backend": backend, "load": load, "target": target, **base,
            **{k: str(x) for k, x in v.items()}}


def test_ratios_pair_rounds_and_targets_read_lower_latency_as_better(capsys):
    rows = []
    for rnd, (nbdkit, emb) in enumerate([(100, 170), (80, 120), (120, 170)]):  # 1.7, 1.5, 1.42 -> 1.5
        rows += [row(rnd, "nbdkit-memory", "rand-read-4k", iops=nbdkit),
                 row(rnd, "embedded", "rand-read-4k", iops=emb)]
    for rnd in range(3):
        rows += [row(rnd, "nbdkit-memory", "qd1-read-4k", p50_us=40), row(rnd, "embedded", "qd1-read-4k", p50_us=30)]
        rows += [row(rnd, "kvstore-node", "seq-read-128k", bw_mib_s=900),
                 row(rnd, "redis", "seq-read-128k", bw_mib_s=1000)]
    assert fio.ratio(rows, "rand-read-4k", "tcp", "embedded", "nbdkit-memory") == pytest.approx(1.5)
    fio.report(rows)
    out = capsys.readouterr().out
    assert "rand-read-4k tcp: embedded/nbdkit-memory = 1.50 -> met" in out
    assert "qd1-read-4k tcp: embedded/nbdkit-memory = 0.75 -> met" in out  # p50 30 us vs 40: lower wins
    assert "seq-read-128k tcp: kvstore-node/redis = 0.90 -> NOT met" in out
    assert "x1.50 of nbdkit" in out and "server CPU 5.00 us/IO" in out


def test_a_backend_below_the_target_is_not_met(capsys):
    rows = [row(0, "nbdkit-memory", "rand-write-4k", target="unix", iops=100),
            row(0, "embedded", "rand-write-4k", target="unix", iops=149),
            row(0, "nbdkit-memory", "qd1-read-4k", p50_us=40), row(0, "embedded", "qd1-read-4k", p50_us=41)]
    fio.report(rows)
    out = capsys.readouterr().out
    assert "rand-write-4k unix: embedded/nbdkit-memory = 1.49 -> NOT met" in out
    assert "qd1-read-4k tcp: embedded/nbdkit-memory = 1.02 -> NOT met" in out


def test_sequential_jobs_stream_their_own_part_random_jobs_the_whole_working_set():
    args = argparse.Namespace(work_set="256M", runtime=0.5, ramp=0.0)
    seq = fio.load_opts(fio.BY_LOAD["seq-read-128k"], args)
    assert "--numjobs=2" in seq and "--bs=128k" in seq and "--iodepth=8" in seq
    assert f"--size={128 << 20}" in seq and f"--offset_increment={128 << 20}" in seq
    rand = fio.load_opts(fio.BY_LOAD["rand-write-4k"], args)
    assert f"--size={256 << 20}" in rand and not any(o.startswith("--offset_increment") for o in rand)
    assert "--runtime=500ms" in rand and "--ramp_time=0ms" in rand and "--iodepth=32" in rand
    qd1 = fio.load_opts(fio.BY_LOAD["qd1-read-4k"], args)
    assert "--numjobs=1" in qd1 and "--iodepth=1" in qd1


@pytest.mark.parametrize("text, n", [("32M", 32 << 20), ("1G", 1 << 30), ("512MiB", 512 << 20), ("4096", 4096)])
def test_sizes_read_as_fio_and_nbdkit_do(text, n):
    assert fio.size_bytes(text) == n
