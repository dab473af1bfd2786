"""Paper 004, a stream larger than memory: one durable stream written past --max-memory, its old
batches evicted to the data file's batch store and read back on demand, against the same
stream with memory to spare, side by side.

Per point, on a fresh kvstore node in `disk` mode with a data file (one poller), either
`fits` (--max-memory FITS, far above the stream) or `spills` (--max-memory SPILLS, a fraction
of it): --messages 85-byte messages are appended to one stream by `kvstore bench --xadd` (C,
--conns connections x 16 in flight; each reply waits for the log's fsync), then --reads random
`XRANGE key <random ms> + COUNT 10` over the whole stream are timed one at a time from this
process (a redis-py connection, replies parsed as RESP), each after a PING timed the same way:
the round trip alone, client and server wake-ups included, which is most of an in-memory read's
latency here (server CPU per read counts the PING too). Rounds alternate
the settings A B A B. Reported: XADD messages/s and server CPU per message; XRANGE p50/p99,
server CPU per read and batches read back from the store per read; the node's memory in use
and the batches evicted (INFO persistence). Load generator and server share this 2-core VM.

The issue's requirement: sealed batches are written sequentially and can leave memory; an old
range is read back without blocking a poller (the command waits for the loader thread, the
poller serves other connections meanwhile).

    kvstore experiment run p004_spill          -> OUT/p004_spill.{csv,png}
"""
import pathlib
import random
import shutil
import statistics
import sys
import tempfile
import time

import redis

from kvstore import Node
from kvstore.experiments import common

NAME = "p004_spill"
QUICK = ["--rounds", "1", "--messages", "60000", "--reads", "300", "--spills", "2mb"]
SETTINGS = ["fits", "spills"]
COLORS = {"fits": "#6baed6", "spills": "#08306b"}
MSG = 85
KEY = "key:000000000000"  # kvstore bench --xadd's first key: keyspace 1 is one stream


def persistence(c):
    p = c.info("persistence")
    return {k: int(p.get(k, 0)) for k in ("datafile_batches_evicted", "datafile_batches_loaded",
                                          "datafile_batches_written", "datafile_batch_segments")}


def point(setting, rnd, args, tmp):
    mem = args.fits if setting == "fits" else args.spills
    node = Node(port=0, data_dir=tmp / f"{setting}-{rnd}", durability="disk", data_file=True, max_memory=mem,
                threads=1)
    with node, redis.Redis(port=node.port) as c:
        cpu0, t0 = common.cpu_seconds(node.pid), time.monotonic()
        w = common.kvbench.run(port=node.port, threads=1, conns=args.conns, pipeline=16, value_size=MSG, keyspace=1,
                               ratio="1:0", requests=args.messages, xadd=True)
        wall, wcpu = time.monotonic() - t0, common.cpu_seconds(node.pid) - cpu0
        if w["errors"]:
            raise RuntimeError(f"{setting}: XADD: {w['errors']} errors, first: {w['first_error']}")
        length = c.xlen(KEY)
        if length != args.messages:
            raise RuntimeError(f"{setting}: the stream has {length} entries, {args.messages} were acknowledged")
        used = int(c.info("memory")["used_memory"])
        first = int(c.xrange(KEY, count=1)[0][0].split(b"-")[0])
        last = int(c.xrevrange(KEY, count=1)[0][0].split(b"-")[0])
        conn = c.connection_pool.get_connection("_")  # replies parsed as RESP only (no stream callback)
        p0 = persistence(c)
        rng = random.Random(rnd)
        lat, ping = [], []
        cpu1, t1 = common.cpu_seconds(node.pid), time.monotonic()
        for _ in range(args.reads):
            ms = rng.randrange(first, last + 1)
            s = time.perf_counter()
            conn.send_command("PING")
            conn.read_response()
            m = time.perf_counter()
            conn.send_command("XRANGE", KEY, f"{ms}-0", "+", "COUNT", "10")
            got = conn.read_response()
            e = time.perf_counter()
            ping.append((m - s) * 1e6)
            lat.append((e - m) * 1e6)
            if not got:
                raise RuntimeError(f"{setting}: XRANGE from {ms}-0 found nothing in a stream that goes to {last}")
        c.connection_pool.release(conn)
        rwall, rcpu = time.monotonic() - t1, common.cpu_seconds(node.pid) - cpu1  # PINGs included
        p1 = persistence(c)
    lat.sort()
    return {"round": rnd, "setting": setting, "max_memory": mem, "messages": args.messages,
            "xadd_per_s": round(args.messages / wall), "xadd_server_cpu_us": round(wcpu / args.messages * 1e6, 3),
            "used_memory_mb": round(used / 2**20, 1), "batches_written": p1["datafile_batches_written"],
            "batches_evicted": p1["datafile_batches_evicted"], "batch_segments": p1["datafile_batch_segments"],
            "reads": args.reads, "ping_p50_us": round(statistics.median(ping), 1),
            "xrange_p50_us": round(statistics.median(lat), 1),
            "xrange_p99_us": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1),
            "xrange_per_s": round(args.reads / rwall), "xrange_server_cpu_us": round(rcpu / args.reads * 1e6, 1),
            "batches_loaded_per_read": round((p1["datafile_batches_loaded"] - p0["datafile_batches_loaded"])
                                             / args.reads, 2)}


def measure(args):
    sweep = common.Sweep(args.csv, ("round", "setting"), args.rounds * len(SETTINGS), args)
    try:
        for rnd in range(args.rounds):
            for setting in (SETTINGS if rnd % 2 == 0 else SETTINGS[::-1]):
                if sweep.has(round=rnd, setting=setting):
                    continue
                tmp = pathlib.Path(tempfile.mkdtemp(prefix="kv-p004-spill-"))
                try:
                    row = point(setting, rnd, args, tmp)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                sweep.add(row, f"round {rnd} {setting:6s} ({row['max_memory']}): XADD {row['xadd_per_s']:>9,}/s "
                               f"({row['xadd_server_cpu_us']} us CPU), {row['used_memory_mb']} MB in memory, "
                               f"{row['batches_evicted']:,} batches evicted; XRANGE p50 {row['xrange_p50_us']} us "
                               f"p99 {row['xrange_p99_us']} us, {row['batches_loaded_per_read']} batches read "
                               f"back per read ({row['xrange_server_cpu_us']} us CPU)")
    finally:
        sweep.close()
    return sweep.rows


def summary(rows):
    """{setting: {field: (median, min, max)}} of the numeric fields."""
    out = {}
    for s in SETTINGS:
        mine = [r for r in rows if r["setting"] == s]
        if mine:
            out[s] = {f: (statistics.median(float(r[f]) for r in mine), min(float(r[f]) for r in mine),
                          max(float(r[f]) for r in mine))
                      for f in ("xadd_per_s", "xadd_server_cpu_us", "used_memory_mb", "batches_evicted", "ping_p50_us",
                                "xrange_p50_us", "xrange_p99_us", "xrange_server_cpu_us", "batches_loaded_per_read")}
    return out


def report(rows):
    s = summary(rows)
    for k, v in s.items():
        print(f"{k:6s} XADD {v['xadd_per_s'][0]:>9,.0f}/s [{v['xadd_per_s'][1]:,.0f}-{v['xadd_per_s'][2]:,.0f}] "
              f"{v['xadd_server_cpu_us'][0]:.2f} us CPU; {v['used_memory_mb'][0]:.0f} MB in memory, "
              f"{v['batches_evicted'][0]:,.0f} batches evicted; PING p50 {v['ping_p50_us'][0]:.0f} us, "
              f"XRANGE p50 {v['xrange_p50_us'][0]:.0f} us "
              f"p99 {v['xrange_p99_us'][0]:.0f} us, {v['xrange_server_cpu_us'][0]:.0f} us CPU, "
              f"{v['batches_loaded_per_read'][0]:.1f} batches read back per read")
    for f, what in (("xadd_per_s", "XADD msg/s"), ("xrange_p50_us", "XRANGE p50"), ("xrange_p99_us", "XRANGE p99")):
        x = common.paired(rows, "setting", "spills", "fits", field=f)
        if x is not None:
            print(f"spills/fits {what}: {x:.2f}")


def draw(rows, path):
    plt = common.pyplot()
    s = summary(rows)
    names = list(s)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.8))
    xs = range(len(names))

    med = [s[n]["xadd_per_s"][0] / 1e3 for n in names]
    err = [[(s[n]["xadd_per_s"][0] - s[n]["xadd_per_s"][1]) / 1e3 for n in names],
           [(s[n]["xadd_per_s"][2] - s[n]["xadd_per_s"][0]) / 1e3 for n in names]]
    ax.bar(xs, med, yerr=err, capsize=4, color=[COLORS[n] for n in names])
    for i, n in enumerate(names):
        ax.text(i, med[i] + err[1][i], f"{med[i]:,.0f} K/s\n{s[n]['used_memory_mb'][0]:.0f} MB in memory\n"
                           f"{s[n]['batches_evicted'][0]:,.0f} batches evicted", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [f"{n}\n--max-memory {rows_mem(rows, n)}" for n in names], fontsize=8)
    ax.set_ylabel("XADD, thousand messages/s (median, min-max)")
    ax.set_title("writing one durable stream (disk mode, 8 x 16 in flight)", fontsize=9)
    ax.margins(y=0.25)
    ax.grid(alpha=0.3, axis="y")
    w = 0.38
    for j, (field, label) in enumerate((("xrange_p50_us", "p50"), ("xrange_p99_us", "p99"))):
        med = [s[n][field][0] for n in names]
        bx.bar([i + (j - 0.5) * w for i in xs], med, w, label=label, color=[COLORS[n] for n in names],
               alpha=1.0 if j == 0 else 0.55)
        for i, n in enumerate(names):
            bx.text(i + (j - 0.5) * w, med[i], f"{med[i]:,.0f}", ha="center", va="bottom", fontsize=8)
    for i, n in enumerate(names):
        bx.text(i, 0, f"{s[n]['batches_loaded_per_read'][0]:.1f} batches\nread back per read", ha="center",
                va="bottom", fontsize=8, color="white")
        bx.hlines(s[n]["ping_p50_us"][0], i - w, i + w, color="black", ls=":", lw=1,
                  label="PING round trip p50" if i == 0 else None)
    bx.legend(fontsize=8)
    bx.set_xticks(list(xs), names, fontsize=8)
    bx.set_ylabel("XRANGE ... COUNT 10 latency, us (p50 solid, p99 light)")
    bx.set_title("random reads over the whole stream, one at a time, each after a PING", fontsize=9)
    bx.grid(alpha=0.3, axis="y")
    r0 = rows[0] if rows else {}
    fig.suptitle(f"Paper 004: one stream of {int(r0.get('messages', 0)):,} messages of {MSG} bytes, memory to spare vs "
                 f"larger than --max-memory (old batches in the data file's batch store), "
                 f"{len({r['round'] for r in rows})} rounds\n" + common.cores_note(shares="load generator, server"),
                 fontsize=10)
    common.save_figure(fig, path)


def rows_mem(rows, setting):
    return next((r["max_memory"] for r in rows if r["setting"] == setting), "?")


def add_args(ap):
    common.add_sweep_args(ap)
    ap.add_argument("--rounds", type=int, default=4, help="A B A B rounds")
    ap.add_argument("--messages", type=int, default=1_500_000, help="85-byte messages appended to the stream")
    ap.add_argument("--reads", type=int, default=3000, help="random XRANGE COUNT 10 reads after the writes")
    ap.add_argument("--conns", type=int, default=8, help="XADD connections, 16 in flight each")
    ap.add_argument("--fits", default="1gb", help="--max-memory of the setting the stream fits in")
    ap.add_argument("--spills", default="24mb", help="--max-memory of the setting the stream is larger than")


def main(argv=None):
    return common.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
