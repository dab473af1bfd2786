"""A small ext4 filesystem for a test, mounted on a loop device (needs root, as CI runs),
and a ballast file that fills it: how the disk-full tests make a disk refuse writes.

  small_fs(tmp_path, mb) - context manager: the mount point of a new mb-MiB ext4
                           (4 KiB blocks, no journal, no reserved blocks: its free
                           space is what statvfs says), unmounted at the end
  fill_up(path)          - a file at path taking every free block of its filesystem
"""
import contextlib
import errno
import os
import shutil
import subprocess

import pytest


def _run(*args):
    subprocess.run(args, check=True, capture_output=True, timeout=60)


@contextlib.contextmanager
def small_fs(tmp_path, mb):
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a loop filesystem (CI runs as root)")
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    img, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(mb << 20)
    _run("mkfs.ext4", "-q", "-F", "-b", "4096", "-m", "0", "-O", "^has_journal", str(img))
    _run("mount", "-o", "loop", str(img), str(mnt))
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill_up(path):
    """Allocate a file at path until its filesystem has no block left (halving the
    request after each refusal down to one block). Returns its size."""
    size, chunk = 0, 64 << 20
    with open(path, "wb") as f:
        while chunk >= 4096:
            try:
                os.posix_fallocate(f.fileno(), size, chunk)
                size += chunk
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                chunk //= 2
    return size
