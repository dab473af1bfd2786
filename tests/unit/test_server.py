"""server/: creating a node's front ends over the engine (srv_create), at the C level
where a failure's code can be seen directly."""
import errno
import os

from kvstore import Store, durability
from kvstore._native import ffi, lib
from kvstore.config import ServerConfig
from kvstore.server import c_config

WAKEUP_LIST = 1024  # MAX_NOTIFY in ext/durability/wal.c


def test_a_full_log_wakeup_list_is_reported_as_enospc_with_its_reason(tmp_path):
    """srv_create once returned a stale -EINVAL when the log's wake-up list was full
    (the code of an earlier check, not the failure's): a caller mapping codes to
    exceptions then blamed the settings. The real -ENOSPC must come back."""
    store = Store()
    log = durability.Log(store, str(tmp_path), 1)
    evfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        for _ in range(WAKEUP_LIST):
            assert lib.wal_subscribe(log._w, evfd) == 0
        assert lib.wal_subscribe(log._w, evfd) == -errno.ENOSPC  # the list is full
        cfg, keep = c_config(ServerConfig(port=0, threads=1, durability="disk", data_file=False).validate(),
                             wal=log._w)
        out = ffi.new("struct srv **")
        err = ffi.new("char[256]")
        rc = lib.srv_create(out, store._t, cfg, err, 256)
        if rc == 0:
            lib.srv_destroy(out[0])
        assert rc == -errno.ENOSPC, (rc, ffi.string(err))
        assert b"wake-up list" in ffi.string(err)
    finally:
        log.close()
        os.close(evfd)
