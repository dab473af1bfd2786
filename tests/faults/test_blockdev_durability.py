"""The block device's FLUSH promise across a crash (issue 15): once FLUSH (or a write with
FUA) has returned, kill -9 and a restart lose nothing it covered -- with the embedded engine
in disk mode (the block device's own process killed) and with a kvstore node in disk mode
as the backend (the node killed and restarted, the NBD server reconnecting to it).
nbdkit's file plugin (FLUSH = fdatasync) runs the same test as the reference.

Writes come from two connections: a FLUSH on one covers the writes completed on the other
(the multi-conn promise). Writes after the last FLUSH are not checked (they may or may not
survive: a disk's volatile cache).
"""
import json

import pytest

from helpers.blockdev import Backend, Device, nbdsh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SIZE = 16 << 20

# Region A (first 4 MiB) is written from h, region B (next 4 MiB) from h2; unaligned writes,
# trims and zeroes among them; then h.flush(). Region C gets FUA writes from h2. The moment the
# last FUA write returns, the script kills (SIGKILL) the process that holds the blocks, so
# nothing after the replies has time to make them durable. Prints the sha256 of A+B+C.
WRITE = r"""
import hashlib, json, os, random, signal
rng = random.Random(2015)
h2 = nbd.NBD()
h2.connect_uri(URI_)
MiB = 1 << 20
model = bytearray(h.pread(12 * MiB, 0))
def put(x, off, data, flags=0):
    x.pwrite(data, off, flags)
    model[off:off + len(data)] = data
for region, x in ((0, h), (4 * MiB, h2)):
    for i in range(150):
        off = region + rng.randrange(0, 4 * MiB - 70000)
        put(x, off, rng.randbytes(rng.choice((4096, 512, 5000, 65536, 69999))))
    x.trim(3 * 4096, region + 8 * 4096)
    model[region + 8 * 4096:region + 11 * 4096] = bytes(3 * 4096)
    x.zero(10000, region + 1 * MiB + 100)
    model[region + MiB + 100:region + MiB + 10100] = bytes(10000)
h.flush()                      # covers h2's completed writes too
for i in range(40):            # FUA: each durable on its own
    put(h2, 8 * MiB + rng.randrange(0, 4 * MiB - 9000), rng.randbytes(rng.choice((4096, 9000, 100))),
        nbd.CMD_FLAG_FUA)
os.kill(KILL_, signal.SIGKILL)
print(json.dumps(dict(sha=hashlib.sha256(model).hexdigest())))
"""

# Read A+B+C back, retrying while the backend is not reachable yet (a restarted kvstore node:
# the NBD server's reads fail with EIO until it has reconnected).
READ = r"""
import hashlib, json, time
deadline = time.monotonic() + 60
while True:
    try:
        data = h.pread(12 << 20, 0)
        break
    except nbd.Error as e:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
print(json.dumps(dict(sha=hashlib.sha256(data).hexdigest())))
"""


def _sha(uri, code, kill=0):
    code = code.replace("URI_", repr(uri)).replace("KILL_", str(kill))
    return json.loads(nbdsh(uri, code, timeout=180).strip().splitlines()[-1])["sha"]


@pytest.mark.parametrize("kind", ["nbdkit-file", "embedded", "kvstore"])
def test_flushed_blocks_survive_kill_9(kind, tmp_path):
    backend = None
    if kind == "nbdkit-file":
        dev = Device("nbdkit-file", SIZE, workdir=str(tmp_path))
    elif kind == "embedded":
        dev = Device("kvstore", SIZE, "--backend", "embedded", "--durability", "disk", "--data-dir",
                     tmp_path / "data", "--port", 0, "--server-threads", 1, "--threads", 2, workdir=str(tmp_path))
    else:
        backend = Backend("kvstore", durability="disk").start()
        dev = Device("kvstore", SIZE, "--backend", backend.url, "--threads", 2, workdir=str(tmp_path))
    try:
        dev.start()
        # the process holding the blocks: the block device's own, or the node (the NBD server stays)
        victim = dev.proc.pid if backend is None else backend.node.pid
        written = _sha(dev.uri, WRITE, kill=victim)
        if backend is None:
            dev.kill()  # reaps it
            dev.start()
        else:
            backend.kill()
            backend.start()
        assert _sha(dev.uri, READ) == written, dev.log()[-3000:]
        # and once more after a clean stop of everything
        dev.stop()
        if backend is not None:
            backend.node.stop()
            backend.start()
        dev.start()
        assert _sha(dev.uri, READ) == written
    finally:
        dev.stop()
        if backend is not None:
            backend.stop()
