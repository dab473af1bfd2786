"""Paper 000's durability experiments (p000_durability, p000_nhd): the pieces that decide what
their numbers mean — pinning a whole process, rounds paired side by side, older CSVs."""
import os
import subprocess
import sys
import time

import pytest

from kvstore.experiments import p000_durability as dur
from kvstore.experiments import p000_nhd as nhd


def allowed_cpus(pid):
    """{tid: the CPUs that thread may run on}, from /proc."""
    return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two CPUs to choose from")
def test_pin_moves_every_thread_of_the_process_not_only_its_first():
    # a process with threads already running, as a server is when a load is pinned
    code = ("import threading, time\n"
            "for _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            "print('ready', flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        one = {min(os.sched_getaffinity(0))}
        dur.pin(p.pid, one)
        cpus = allowed_cpus(p.pid)
        assert len(cpus) == 4
        assert all(c == one for c in cpus.values()), cpus
    finally:
        p.kill()
        p.wait()


def test_cpu_halves_keep_the_node_apart_from_peer_and_load():
    halves = dur.cpu_halves()
    if len(os.sched_getaffinity(0)) < 2:
        assert halves is None
        return
    node, rest = halves
    assert node and rest and not node & rest and node | rest == set(os.sched_getaffinity(0))


def test_a_durability_csv_from_before_pinning_reads_as_unpinned(capsys):
    old = [{"round": str(r), "tool": "kvstore-bench", "server": s, "pipeline": "16", "requests": "1000",
            "throughput": str(t), "p50_us": "1", "p99_us": "2", "wall_s": "1", "server_cpu_s": "0.5"}
           for r, (a, b) in enumerate([(1000, 400), (800, 400), (1200, 480)])
           for s, t in (("kvstore-none", a), ("kvstore-remote", b))]
    assert set(dur.spread(old)) == {("kvstore-bench", 16, "none", "kvstore-none"),
                                    ("kvstore-bench", 16, "none", "kvstore-remote")}
    # paired per round: 0.4, 0.5, 0.4 -> 0.4 (a ratio of medians would say 400/1000 too, by chance only)
    assert dur.ratio(old, "kvstore-bench", 16, "none", "kvstore-remote") == pytest.approx(0.4)
    dur.report(old)
    assert "NHL/NH 0.40" in capsys.readouterr().out


def nhd_rows(pairs, rpb=("4.0", "6.0", "")):
    rows = [{"round": "before", "server": "fio", "pipeline": "", "kind": "write", "MBps": "1000"},
            {"round": "before", "server": "fio", "pipeline": "", "kind": "read", "MBps": ""}]  # fio failed
    for rnd, (nh, nhd_t) in enumerate(pairs):
        rows.append({"round": str(rnd), "server": "NH", "pipeline": "16", "kind": "insert", "throughput": str(nh)})
        rows.append({"round": str(rnd), "server": "NHD", "pipeline": "16", "kind": "insert",
                     "throughput": str(nhd_t), "records_per_block": rpb[rnd], "write_MBps": "100",
                     "memory_keys": "10"})
    return rows


def test_nhd_ratio_is_paired_per_round_with_its_spread():
    s = nhd.summary(nhd_rows([(100, 50), (400, 100), (200, 120)]))
    assert s[16]["ratio"] == pytest.approx(0.5)  # rounds: 0.5, 0.25, 0.6
    assert s[16]["ratio_range"] == (pytest.approx(0.25), pytest.approx(0.6))
    assert s[16][("NHD", "records_per_block")] == (5.0, 4.0, 6.0)  # a round that wrote no block is left out
    assert s["fio"] == {"write": 1000.0, "read": None}


def test_nhd_report_and_plot_survive_a_run_without_fio_or_blocks(tmp_path, capsys):
    rows = nhd_rows([(100, 50)], rpb=("",))
    nhd.report(rows)
    out = capsys.readouterr().out
    assert "NHD/NH 0.50" in out and "no block written" in out
    nhd.draw(rows, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 0


def test_flusher_cpu_falls_back_to_the_busiest_unnamed_thread():
    # this process stands for the server: an unnamed thread that has burnt ~0.3 s of CPU, still alive
    import threading
    done, spun = threading.Event(), threading.Event()

    def busy():
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass
        spun.set()
        done.wait(10)

    t = threading.Thread(target=busy)
    t.start()
    try:
        spun.wait(10)
        me = type("Me", (), {"pid": os.getpid()})
        main = open(f"/proc/{os.getpid()}/comm").read().strip()
        if open(f"/proc/{os.getpid()}/task/{t.native_id}/comm").read().strip() != main:
            pytest.skip("this Python names its threads")
        cpu, source, tid = nhd.flusher_cpu(me, {})
        assert source == "busiest-unnamed-thread" and cpu >= 0.25 and tid == t.native_id
        assert nhd.flusher_cpu(me, {"datafile_sweep_cpu_seconds": "1.5"}) == (1.5, "info", None)  # INFO first
    finally:
        done.set()
        t.join()


def test_flusher_cpu_reads_the_same_thread_at_the_end_of_a_run_as_at_its_start():
    """The busiest unnamed thread may change during a run: the end of the run reads the
    thread chosen at its start, not the busiest one then (two threads' CPU would mix)."""
    import threading

    def spinner(seconds, spun, done):
        def busy():
            end = time.thread_time() + seconds
            while time.thread_time() < end:
                pass
            spun.set()
            done.wait(10)
        return threading.Thread(target=busy)

    done = threading.Event()
    s1, s2 = threading.Event(), threading.Event()
    first = spinner(0.2, s1, done)
    first.start()
    try:
        s1.wait(10)
        me = type("Me", (), {"pid": os.getpid()})
        main = open(f"/proc/{os.getpid()}/comm").read().strip()
        if open(f"/proc/{os.getpid()}/task/{first.native_id}/comm").read().strip() != main:
            pytest.skip("this Python names its threads")
        cpu0, _, tid = nhd.flusher_cpu(me, {})
        assert tid == first.native_id
        second = spinner(0.6, s2, done)  # busier than the first by the end of the "run"
        second.start()
        s2.wait(10)
        assert nhd.flusher_cpu(me, {})[2] == second.native_id  # a fresh pick takes the other thread
        cpu1, source, tid1 = nhd.flusher_cpu(me, {}, tid)
        assert tid1 == tid and source == "busiest-unnamed-thread" and cpu1 - cpu0 < 0.15
    finally:
        done.set()
        first.join()
        if "second" in locals():
            second.join()
