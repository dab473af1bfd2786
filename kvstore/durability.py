"""The durability log from Python: recovery into a Store, opening the group-committed log."""
import dataclasses
import os
import time

from kvstore import errors
from kvstore._native import ffi, lib


@dataclasses.dataclass
class Recovery:
    records: int
    first_lsn: int
    last_lsn: int
    segments: int
    bytes: int
    truncated_bytes: int
    problem: str
    seconds: float

    def summary(self):
        if not self.segments:
            return "no log found: starting empty"
        rng = f"LSN {self.first_lsn}..{self.last_lsn}" if self.records else f"up to LSN {self.last_lsn}"
        s = (f"recovered {self.records:,} records ({rng}) from {self.segments} log segment(s), "
             f"{self.bytes:,} bytes, in {self.seconds:.3f} s")
        return s + (f"; {self.problem}" if self.problem else "")


def log_dir(data_dir):
    return os.path.join(data_dir, "log")


def recover(store, data_dir, repair=True):
    """Replay <data_dir>/log into store. Raises errors.CorruptLogError if the log is
    damaged anywhere but its torn tail (nothing after the damage is applied)."""
    rec = ffi.new("struct wal_recovery *")
    err = ffi.new("char[1024]")
    t0 = time.monotonic()
    rc = lib.wal_recover(store._t, log_dir(data_dir).encode(), 0, 1 if repair else 0, rec, err, 1024)
    msg = ffi.string(err).decode(errors="replace")
    if rc == -84:  # EILSEQ
        raise errors.CorruptLogError(
            f"{msg}. The server will not start on a damaged log: move the damaged segment away "
            f"(keeping a copy) to start from what precedes it.")
    if rc < 0:
        errors.raise_for(rc, msg)
    return Recovery(rec.records, rec.first_lsn, rec.last_lsn, rec.segments, rec.bytes, rec.truncated_bytes,
                    ffi.string(rec.problem).decode(errors="replace"), time.monotonic() - t0)


class Log:
    """An open group-committed log attached to a store's table (every write is logged)."""

    def __init__(self, store, data_dir, first_lsn, sync=True):
        cfg = ffi.new("struct wal_config *")
        self._dir = ffi.new("char[]", log_dir(data_dir).encode())
        cfg.dir = self._dir
        cfg.sync = 1 if sync else 0
        cfg.first_lsn = first_lsn
        # Fault injection for tests and experiments: a disk this much slower per sync.
        cfg.sync_delay_us = int(os.environ.get("KVSTORE_FAULT_SYNC_DELAY_US", "0"))
        out = ffi.new("struct wal **")
        err = ffi.new("char[512]")
        rc = lib.wal_open(out, cfg, err, 512)
        if rc < 0:
            raise errors.ServerError(ffi.string(err).decode(errors="replace"), -rc)
        self._w = out[0]
        self._store = store
        rc = lib.wal_start(self._w)
        if rc < 0:
            lib.wal_close(self._w)
            raise errors.ServerError("cannot start the log thread", -rc)
        lib.kvt_set_log(store._t, ffi.addressof(lib, "wal_log_fn"), self._w)

    def stats(self):
        st = ffi.new("struct wal_stats *")
        lib.wal_get_stats(self._w, st)
        return {f: getattr(st, f) for f in ("appended_lsn", "durable_lsn", "groups", "records", "bytes",
                                            "syncs", "sync_ns_total", "sync_ns_max", "max_group_records",
                                            "failed")}

    def close(self):
        """Detach from the table, write and sync what is buffered, stop the log thread."""
        if self._w is not None:
            lib.kvt_set_log(self._store._t, ffi.NULL, ffi.NULL)
            lib.wal_close(self._w)
            self._w = None
