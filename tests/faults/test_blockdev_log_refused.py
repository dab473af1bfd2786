"""The block device's FLUSH while the disk refuses the log (issue 15: FLUSH completes only
when every covered write is durable). The embedded engine in disk mode has its data dir on a
small ext4 filesystem (tests/helpers/loopfs.py; needs root) that a ballast file fills: single
WRITEs are acknowledged (write-back: held in memory) until the log can no longer be written.
A FLUSH then must not succeed: the acknowledged writes are not durable. Once the ballast goes,
the log's retry writes them, a FLUSH succeeds, and after kill -9 and a restart every
acknowledged write is there."""
import os
import time

import pytest

from helpers import loopfs
from helpers import nbdwire as w

pytestmark = [pytest.mark.root, pytest.mark.slow]

BS = 4096
LEFT_FREE = 3 << 20   # what the ballast leaves for the log: a few hundred 4 KiB records


class DiskTarget(w.Target):
    """`kvstore blockdev serve --durability disk` with its data dir where the test says."""

    def __init__(self, data_dir, **kw):
        super().__init__("kvstore", **kw)
        self.data_dir = str(data_dir)

    def argv(self):
        a = super().argv()
        a[a.index("--durability") + 1] = "disk"
        a[a.index("--data-dir") + 1] = self.data_dir
        return a


def block(i):
    return (b"%08d" % i) * (BS // 8)


def test_flush_fails_while_the_log_is_refused_and_covers_its_writes_after(tmp_path):
    with loopfs.small_fs(tmp_path, 40) as mnt:
        data = mnt / "data"
        ballast = mnt / "ballast"
        with open(ballast, "wb") as f:
            st = os.statvfs(mnt)
            os.posix_fallocate(f.fileno(), 0, st.f_bavail * st.f_frsize - LEFT_FREE)
        t = DiskTarget(data, size=64 << 20).start()
        acked = []
        try:
            with t.open() as c:
                c.sock.settimeout(5)
                for i in range(4 * LEFT_FREE // BS):
                    try:
                        r = c.write(i * BS, block(i))
                    except TimeoutError:
                        break   # a write waiting for the disk: the log is refused
                    if r.error:
                        break   # refused (the disk refuses the log)
                    acked.append(i)
                else:
                    raise AssertionError("the disk never filled")
                assert acked
                c.sock.settimeout(3)
                try:
                    r = c.request(w.CMD_FLUSH)
                    assert r.error != 0, "FLUSH succeeded while the writes it covers cannot be written"
                except TimeoutError:
                    pass   # waiting for the disk is allowed too
            os.unlink(ballast)
            with t.open() as c:   # the log's retry writes the held records: a FLUSH succeeds
                deadline = time.monotonic() + 60
                while c.request(w.CMD_FLUSH).error:
                    assert time.monotonic() < deadline, "FLUSH never succeeded after the disk had room"
                    time.sleep(0.2)
            t.proc.kill()
            t.proc = None
            t2 = DiskTarget(data, size=64 << 20).start()
            try:
                with t2.open() as c:
                    lost = [i for i in acked if c.read(i * BS, BS).data != block(i)]
                assert not lost, f"{len(lost)} of {len(acked)} acknowledged and flushed blocks lost: {lost[:5]}"
            finally:
                t2.stop()
        finally:
            t.stop()
