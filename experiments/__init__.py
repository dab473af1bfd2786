"""kvstore.experiments: the measurements that reproduce the papers' results (pNNN_: paper NNN
of shared/papers) and kvstore's own (kv_), one module each, listed in EXPERIMENTS.

Every experiment module has the same small interface, driven by common.main:
  NAME              its name, and the base name of its result files (OUT/NAME[_TAG].{csv,png}:
                    --out DIR, a new ./kvstore-results/NAME-<time> by default, or --update-results)
  QUICK             the arguments of a smoke-scale run (seconds to a minute; notebooks and tests)
  add_args(ap)      its own options, added to the parser common.parser builds
  check_args(args)  optional: adjusts or refuses the parsed options before a run
  measure(args)     runs it, writes args.csv as points finish, returns the CSV's rows
  report(rows)      optional: prints the summary (medians, ratios, the paper's numbers)
  draw(rows, png)   plots the CSV's rows (as read back: every value a string) into png
  main(argv=None)   common.main(module, argv): the command line, `--plot-only` redraws from the CSV
Run one as `kvstore experiment run NAME [--quick] [-- options]` or
`python experiments/NAME.py [options]`.
"""
import dataclasses
import importlib


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str         # module name and result file base name
    paper: str        # "000".."004" (shared/papers), or "kv" for kvstore's own measurements
    description: str  # one line, for `kvstore experiment list`

    def module(self):
        return importlib.import_module(f"{__name__}.{self.name}")


EXPERIMENTS = [
    Experiment("p000_table1", "000", "Table 1: inserts/s of each architecture for N, NH, NHD, NHL, NHDL"),
    Experiment("p000_fig4", "000", "Fig. 4: remote-log throughput vs maximum logs per batch"),
    Experiment("p000_bosc_sweep", "000", "BOSC: effective disk updates/s vs memory and request rate, vs naive"),
    Experiment("p000_durability", "000", "durability none/disk/remote (+memory full) vs Redis AOF"),
    Experiment("p000_nhd", "000", "NHD at scale: memory-full inserts of new keys vs in-memory NH, records per block, sweep MB/s vs fio"),
    Experiment("p001_kvs", "001", "Fig. 6: the KVS alone, 4 KiB GET/SET latency vs throughput (open-loop sweep), "
               "kvstore vs Redis vs memcached, CPU per request"),
    Experiment("p001_fio", "001", "Figs. 7-9: the block device under fio (4 KiB random IOPS, 128 KiB sequential MB/s, "
               "QD1 latency), raw/ext4/xfs, each backend beside nbdkit memory"),
    Experiment("p002_flexpoll", "002", "FlexPoll: strict / flexpoll / direct EPOLLOUT policies"),
    Experiment("p003_ldu_scalability", "003", "LDU Figs 2.8-2.10, Table 2.1: throughput and idle time vs threads"),
    Experiment("p003_ldu_rw_ratio", "003", "LDU Fig 2.11: throughput vs read:write ratio"),
    Experiment("p003_ldu_kvstore_queue", "003", "LDU in kvstore: the dirty-key queue, LDU vs a locked queue"),
    Experiment("p004_write", "004", "message queue: XADD write throughput vs batch size k (85-byte messages), "
               "kvstore memory/disk vs Redis without/with AOF always"),
    Experiment("p004_read", "004", "message queue: consumers draining streams with XREADGROUP COUNT k + XACK, "
               "kvstore memory/disk vs Redis without/with AOF always"),
    Experiment("p004_pull", "004", "message queue: UDP pulls of sealed batches from the XDP first level vs the engine "
               "vs an XDP bounce-only packet rate (root, veth in a network namespace)"),
    Experiment("p004_spill", "004", "message queue: one durable stream larger than --max-memory (old batches in the "
               "data file's batch store) vs the same stream in memory: XADD msg/s, random XRANGE latency"),
    Experiment("p004_mqtt", "004", "message queue over MQTT: 85-byte messages, publishers to many topics, "
               "subscribers to t/#, QoS 0 and 1, kvstore memory/disk vs Mosquitto: delivered msg/s, latency, "
               "CPU per message, messages dropped"),
    Experiment("kv_peer_compare", "kv", "kvstore vs Redis vs memcached, same loads, same run"),
    Experiment("kv_accept_modes", "kv", "connection placement: SO_REUSEPORT listeners vs accept-and-hand-off"),
    Experiment("kv_build_compare", "kv", "this build against a baseline build: throughput and CPU per request"),
    Experiment("kv_store_calls", "kv", "embedded Store calls per second: the cffi path vs the Cython one"),
    Experiment("kv_datafile_io", "kv", "the data file's sweep I/O: buffered vs O_DIRECT vs io_uring, memory-full inserts"),
    Experiment("kv_tls_cost", "kv", "TLS on the RESP port: kvstore vs Redis, plain vs TLS, P1 and P16, CPU per request"),
    Experiment("kv_repl_tls_cost", "kv", "--repl-tls: remote-mode SET with the replication link plain vs in TLS, "
               "P1 and P16, CPU per request"),
    Experiment("kv_cluster_throughput", "kv", "a cluster of 1, 2, 4 nodes under redis-benchmark --cluster: "
               "requests/s and requests per CPU-second of the nodes"),
    Experiment("kv_active_expiry", "kv", "active expiry: 1 M keys with a 1 s TTL reclaimed under a write load, and its cost"),
]
BY_NAME = {e.name: e for e in EXPERIMENTS}


def find(name):
    """The Experiment called name; LookupError naming the known ones otherwise."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise LookupError(f"unknown experiment {name!r}; known: {', '.join(BY_NAME)}") from None
