"""Authentication of the NBD port (issue 15, round 2): TLS through NBD_OPT_STARTTLS.

Real clients (nbdinfo, nbdcopy, nbdsh: libnbd over GnuTLS) with nbds:// URLs against
`kvstore blockdev serve --tls on|require`, x509 (certificates from kvstore.tlscerts, laid out
as libnbd's tls-certificates directory wants: ca-cert.pem, client-cert.pem, client-key.pem) and
pre-shared keys (tls-psk-file, psktool's "identity:hexkey" lines); a raw socket for the exact
option replies (NBD_REP_ERR_TLS_REQD, ERR_POLICY) and for a broken TLS handshake. The protected
mode (no plain TCP listener beyond loopback) is checked without binding anything but loopback.
"""
import os
import re
import shutil

import pytest

from helpers import nbdwire as w
from helpers.blockdev import Device, have_our_server, nbdsh, random_image, run, sha256_file
from kvstore import ConfigError
from kvstore.config import BlockdevConfig
from kvstore.tlscerts import make_certs

pytestmark = pytest.mark.skipif(not have_our_server(), reason="no C NBD server in this tree")

MiB = 1 << 20
PSK_KEY = "8b1a32e6c9d0b2f7a4c3e1d5f60718293a4b5c6d7e8f90a1b2c3d4e5f6071829"


# ---- certificates, keys and the servers (one per module per mode: each start is a process)

@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """{"server": kvstore.tlscerts files, "good"/"nocert"/"strange"/"wrongca": libnbd dirs,
    "psk"/"badpsk": PSK files}."""
    root = tmp_path_factory.mktemp("nbd-tls")
    ours, other = make_certs(str(root / "ca")), make_certs(str(root / "other"), ca_name="someone-else")

    def libnbd_dir(name, ca, cert=None, key=None):
        d = root / name
        d.mkdir()
        for src, dst in ((ca, "ca-cert.pem"), (cert, "client-cert.pem"), (key, "client-key.pem")):
            if src:
                shutil.copy(src, d / dst)
        return str(d)

    psk, badpsk = root / "keys.psk", root / "bad.psk"
    psk.write_text(f"# psktool -u alice -p keys.psk\nalice:{PSK_KEY}\n")
    badpsk.write_text(f"alice:{PSK_KEY[::-1]}\n")
    for p in (psk, badpsk):
        os.chmod(p, 0o600)
    return {
        "server": ours,
        "good": libnbd_dir("good", ours["ca_crt"], ours["client_crt"], ours["client_key"]),
        "nocert": libnbd_dir("nocert", ours["ca_crt"]),  # trusts the server, has no certificate
        "wrongca": libnbd_dir("wrongca", ours["ca_crt"], other["client_crt"], other["client_key"]),
        "strange": libnbd_dir("strange", other["ca_crt"], ours["client_crt"], ours["client_key"]),  # distrusts it
        "psk": str(psk), "badpsk": str(badpsk),
    }


def x509_args(pki, mode):
    s = pki["server"]
    return ["--tls", mode, "--tls-cert-file", s["server_crt"], "--tls-key-file", s["server_key"],
            "--tls-ca-cert-file", s["ca_crt"]]


def serve(tmp_path_factory, *args):
    work = str(tmp_path_factory.mktemp("dev"))
    return Device("kvstore", "64M", "--durability", "none", "--port", 0, "--threads", 2,
                  "--data-dir", os.path.join(work, "data"), *args, workdir=work).start()


@pytest.fixture(scope="module")
def required(pki, tmp_path_factory):
    dev = serve(tmp_path_factory, *x509_args(pki, "require"))
    yield dev
    assert dev.stop() == 0, dev.log()[-2000:]


def tcp_of(dev):
    """(host, port) of the device's nbd:// or nbds:// URI."""
    hostport = dev.uri.split("://", 1)[1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    return host, int(port)


def certs(uri, d):
    return f"{uri}?tls-certificates={d}"


def sh(uri, code, check=True):
    """nbdsh running code against uri, whose tls-certificates / tls-psk-file it may read
    (nbdsh -u refuses local files in a URI); CompletedProcess."""
    script = f"h.set_uri_allow_local_file(True)\nh.connect_uri({uri!r})\n{code}"
    return run("nbdsh", "-c", script, check=check)


# ---- a raw client for the option replies (tests/helpers/nbdwire.py)

def raw(dev):
    """A plain connection to dev's TCP listener in its option phase (fixed newstyle, NO_ZEROES)."""
    c = w.Conn(tcp_of(dev), timeout=20)
    c.greeting()
    c.client_flags()
    return c


def final(c, opt, data=b""):
    """Send an option; its final reply (type, data)."""
    r = c.option_replies(opt, data)[-1]
    return r.type, r.data


# ---- x509, --tls require

def test_client_with_certificate_round_trips_with_nbdcopy(required, pki, tmp_path):
    assert required.uri.startswith("nbds://127.0.0.1:")  # the ready line says TLS is needed
    uri = certs(required.uri, pki["good"])
    info = run("nbdinfo", uri).stdout
    assert "with TLS" in info and "export-size: 67108864" in info
    src, back = tmp_path / "src.img", tmp_path / "back.img"
    random_image(src, 16 * MiB, seed=15)
    run("nbdcopy", src, uri)
    run("nbdcopy", uri, back)
    assert sha256_file(back, 16 * MiB) == sha256_file(src)
    # an unaligned write through TLS (read-modify-write of the edge blocks), read back
    out = sh(uri, "h.pwrite(b'tls' * 3000, 4095); print(bytes(h.pread(9000, 4095)) == b'tls' * 3000)").stdout
    assert out.strip() == "True"


@pytest.mark.parametrize("client", ["nocert", "wrongca"])
def test_client_without_the_right_certificate_gets_nothing(required, pki, client):
    assert "export-size" in run("nbdinfo", certs(required.uri, pki["good"])).stdout  # the control
    r = run("nbdinfo", certs(required.uri, pki[client]), check=False)
    assert r.returncode != 0
    assert "export-size" not in r.stdout and "67108864" not in r.stdout + r.stderr
    # nor data: nbdsh never gets a handle that reads
    r = sh(certs(required.uri, pki[client]), "print(h.pread(4096, 0))", check=False)
    assert r.returncode != 0 and "b'" not in r.stdout


def test_client_that_does_not_trust_the_server_refuses_it(required, pki):
    assert "export-size" in run("nbdinfo", certs(required.uri, pki["good"])).stdout  # the control
    r = run("nbdinfo", certs(required.uri, pki["strange"]), check=False)
    assert r.returncode != 0 and "export-size" not in r.stdout


def test_plain_client_is_refused_with_tls_reqd(required):
    plain = required.uri.replace("nbds://", "nbd://")
    r = run("nbdinfo", plain, check=False)
    assert r.returncode != 0 and "export-size" not in r.stdout
    with raw(required) as c:
        for opt, data in ((w.OPT_GO, w.info_data("")), (w.OPT_INFO, w.info_data("kvstore")), (w.OPT_LIST, b"")):
            typ, _ = final(c, opt, data)
            assert typ == w.REP_ERR_TLS_REQD, (opt, hex(typ))  # and the connection stays open for STARTTLS
        c.send_option(w.OPT_EXPORT_NAME, b"kvstore")
        with pytest.raises(w.Closed, match="EOF after 0 of 1"):
            c.recv_exact(1)  # EXPORT_NAME has no error reply: closed without a byte (no size)


def test_bad_tls_handshake_closes_only_that_connection(required, pki):
    with raw(required) as other, raw(required) as bad:  # other: in its option phase meanwhile
        assert final(bad, w.OPT_STARTTLS) == (w.REP_ACK, b"")
        bad.send(b"\x16\x03\x01\x00\x05hello, not a ClientHello" * 4)
        assert bad.closed_by_server(timeout=20)
        assert final(other, w.OPT_LIST)[0] == w.REP_ERR_TLS_REQD  # still served
        assert final(other, w.OPT_ABORT) == (w.REP_ACK, b"")
    assert "export-size" in run("nbdinfo", certs(required.uri, pki["good"])).stdout  # and new ones too
    resp = re.search(r"RESP on 127\.0\.0\.1:(\d+)", required.log()).group(1)
    assert "blockdev_tls:require" in run("redis-cli", "-p", resp, "INFO", "blockdev").stdout


# ---- --tls on (offered), --tls off, PSK

def test_tls_on_serves_plain_and_tls_clients(pki, tmp_path_factory):
    dev = serve(tmp_path_factory, *x509_args(pki, "on"))
    try:
        assert dev.uri.startswith("nbd://")
        nbdsh(dev.uri, "h.pwrite(b'P' * 4096, 0)")
        tls = certs(dev.uri.replace("nbd://", "nbds://"), pki["good"])
        out = sh(tls, "print(h.get_tls_negotiated(), bytes(h.pread(4, 0)))").stdout
        assert out.split() == ["True", "b'PPPP'"]  # the same device, through TLS
        r = run("nbdinfo", dev.uri.replace("nbd://", "nbds://") + f"?tls-certificates={pki['nocert']}", check=False)
        assert r.returncode != 0 and "export-size" not in r.stdout  # offered does not mean unchecked
    finally:
        assert dev.stop() == 0, dev.log()[-2000:]


def test_starttls_without_tls_is_refused_by_policy(tmp_path_factory):
    dev = serve(tmp_path_factory)
    try:
        with raw(dev) as c:
            assert final(c, w.OPT_STARTTLS)[0] == w.REP_ERR_POLICY
            assert final(c, w.OPT_ABORT) == (w.REP_ACK, b"")
    finally:
        assert dev.stop() == 0, dev.log()[-2000:]


def test_pre_shared_keys(pki, tmp_path_factory):
    dev = serve(tmp_path_factory, "--tls", "require", "--tls-psk-file", pki["psk"], "--tls-auth-clients", "no")
    try:
        # libnbd takes the PSK identity from the URI's user (nbds://alice@HOST...; else the login name)
        user = dev.uri.replace("nbds://", "nbds://{}@")
        good = f"{user.format('alice')}?tls-psk-file={pki['psk']}"
        out = sh(good, "h.pwrite(b'K' * 8192, 4096); print(h.get_tls_negotiated(), bytes(h.pread(2, 4095)))").stdout
        assert out.split() == ["True", "b'\\x00K'"]
        for bad in (f"{user.format('alice')}?tls-psk-file={pki['badpsk']}",  # wrong key
                    f"{user.format('mallory')}?tls-psk-file={pki['psk']}"):  # unknown identity
            r = run("nbdinfo", bad, check=False)
            assert r.returncode != 0 and "export-size" not in r.stdout
    finally:
        assert dev.stop() == 0, dev.log()[-2000:]


# ---- protected mode (nothing binds beyond loopback here)

def test_non_loopback_listener_needs_tls_require_or_an_explicit_opt_out(pki):
    with pytest.raises(ConfigError, match=r"0\.0\.0\.0 is not a loopback address.*--no-protected-mode"):
        BlockdevConfig(size="1G", listen="0.0.0.0:10809").validate()
    with pytest.raises(ConfigError, match="--no-protected-mode"):
        BlockdevConfig(size="1G", listen="192.0.2.1:10809", tls="on", **files(pki)).validate()
    BlockdevConfig(size="1G", listen="0.0.0.0:10809", tls="require", **files(pki)).validate()
    BlockdevConfig(size="1G", listen="0.0.0.0:10809", protected_mode=False).validate()
    BlockdevConfig(size="1G", listen="127.0.0.2:10809").validate()  # all of 127/8 is loopback


def test_c_side_refuses_a_plain_non_loopback_listener_before_binding():
    from kvstore._native import ffi, lib
    from kvstore.blockdev import c_nbd_config
    cfg, keep = c_nbd_config(BlockdevConfig(size="1M", listen="0.0.0.0:0", protected_mode=False).validate())
    cfg.allow_plain_remote = 0  # as a caller that never heard of it (zeroed struct)
    err, out = ffi.new("char[512]"), ffi.new("struct nbd_server **")
    assert lib.nbd_create(out, cfg, ffi.NULL, err, 512) < 0
    assert "--no-protected-mode" in ffi.string(err).decode()


def test_tls_settings_are_checked_at_start(pki, tmp_path):
    with pytest.raises(ConfigError, match="tls_cert_file: --tls require needs --tls-cert-file"):
        BlockdevConfig(size="1G", tls="require").validate()
    with pytest.raises(ConfigError, match="not both"):
        BlockdevConfig(size="1G", tls="on", tls_psk_file=pki["psk"], **files(pki)).validate()
    bad = tmp_path / "bad.psk"
    bad.write_text("alice:zz\n")
    from kvstore.blockdev import BlockDevice
    with pytest.raises(ConfigError, match="line 1: the key is not hexadecimal"):
        BlockDevice(size="1M", backend="redis://127.0.0.1:1", tls="require", tls_psk_file=str(bad),
                    tls_auth_clients="no").start()


def files(pki):
    s = pki["server"]
    return dict(tls_cert_file=s["server_crt"], tls_key_file=s["server_key"], tls_ca_cert_file=s["ca_crt"])


def test_serve_refuses_a_plain_non_loopback_listener(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "blockdev", "serve", "--size", "1M", "--listen",
                        "0.0.0.0:0", "--durability", "none", "--port", "0", "--data-dir", str(tmp_path / "d")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "listening on" not in r.stdout
    assert "not a loopback address" in r.stderr and "--no-protected-mode" in r.stderr
