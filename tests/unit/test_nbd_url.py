"""The block device's network backend URLs (ext/frontend/nbd_netkv_open.c, nk_parse_url):
what each part becomes, every malformed form refused with a message that says what is
wrong and what is accepted, and no message that shows the password."""
import pytest

from kvstore._native import ffi, lib


def parse(url):
    u = ffi.new("struct nk_url *")
    err = ffi.new("char[512]")
    rc = lib.nk_parse_url(url.encode(), u, err, 512)
    if rc:
        return rc, ffi.string(err).decode()
    return rc, {"scheme": ffi.string(u.scheme).decode(), "host": ffi.string(u.host).decode(), "port": u.port,
                "user": ffi.string(u.user).decode(), "password": ffi.string(u.password).decode(),
                "has_password": u.has_password, "db": u.db}


@pytest.mark.parametrize("url, want", [
    ("kvstore://127.0.0.1:6380", dict(scheme="kvstore", host="127.0.0.1", port=6380, has_password=0, db=-1)),
    ("kvstore://localhost", dict(host="localhost", port=6380)),
    ("redis://h", dict(scheme="redis", port=6379)),
    ("memcached://h", dict(scheme="memcached", port=11211)),
    ("redis://:secret@h:7000/3", dict(password="secret", has_password=1, user="", port=7000, db=3)),
    ("redis://alice:secret@h:7000", dict(user="alice", password="secret", db=-1)),
    ("redis://:p%40ss%3Aw@h:1", dict(password="p@ss:w")),     # percent-encoded
    ("redis://:p@ss@h:1", dict(password="p@ss", host="h")),    # the last '@' ends the credentials
    ("redis://:@h:1", dict(password="", has_password=1)),
    ("kvstore://[::1]:6380", dict(host="::1", port=6380)),
    ("redis://h:1/", dict(db=-1)),
])
def test_parts(url, want):
    rc, got = parse(url)
    assert rc == 0, got
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize("url, message", [
    ("", "backend URL is empty: expected embedded, kvstore://"),
    ("ftp://h:1", 'backend "ftp://...": unknown scheme: expected embedded, kvstore://[:PASSWORD@]HOST:PORT, '
                  "redis://[[USER]:PASSWORD@]HOST:PORT[/DB] or memcached://HOST:PORT"),
    ("redis:/h:1", "unknown scheme"),
    ("embedded", "unknown scheme"),  # not a network backend: nbd_backend_find sends it elsewhere
    ("redis://:1", "no host: expected redis://HOST:PORT"),
    ("redis://", "no host"),
    ("redis://h:0", 'port "0": expected a number from 1 to 65535'),
    ("redis://h:65536", 'port "65536": expected a number from 1 to 65535'),
    ("redis://h:x", 'port "x": expected a number'),
    ("redis://h:", 'port "": expected a number'),
    ("redis://h:1/x", 'database "x": expected a number (redis://HOST:PORT/DB)'),
    ("redis://h:1/-1", 'database "-1"'),
    ("redis://user@h:1", "credentials without a ':' before '@': expected [USER]:PASSWORD@"),
    ("redis://:%zz@h:1", "bad % escape"),
    ("redis://:%00@h:1", "bad % escape"),
    ("redis://[::1:1", "'[' without ']' around an IPv6 address"),
    ("redis://[::1]x", "expected ':PORT' after ']'"),
    ("redis://" + "h" * 300 + ":1", "host too long (at most 255 bytes)"),
    ("redis://:" + "p" * 300 + "@h:1", "user or password too long (at most 255 bytes)"),
])
def test_errors(url, message):
    rc, err = parse(url)
    assert rc == -22, err  # -EINVAL
    assert message in err


@pytest.mark.parametrize("url", ["redis://:topsecret@h:x", "redis://u:topsecret@h:1/x", "redis://:topsecret@:1",
                                 "ftp://:topsecret@h", "nope:topsecret@h"])
def test_errors_never_show_the_password(url):
    rc, err = parse(url)
    assert rc == -22 and "topsecret" not in err, err
