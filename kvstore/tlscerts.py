"""Throwaway certificates for trying TLS (--tls-port) and for the tests and experiments: a
CA, a server certificate for 127.0.0.1/localhost signed by it, and a client certificate
signed by it (for --tls-auth-clients yes), made by the `openssl` command. Not for
production: the keys are unencrypted and the CA key sits beside them."""
import os
import subprocess

FILES = ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")


def _openssl(*args, cwd):
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {p.stderr.strip()[-500:]}")


def make_certs(directory, ca_name="kvstore-test-ca", days=2):
    """Write ca.crt/ca.key, server.crt/.key (subjectAltName IP:127.0.0.1, DNS:localhost) and
    client.crt/.key into directory (created if needed); returns {name without suffix dots: path},
    e.g. {"ca_crt": ..., "server_crt": ..., "server_key": ..., "client_crt": ..., "client_key": ...}.
    Another ca_name makes an unrelated CA (certificates the first one does not trust)."""
    os.makedirs(directory, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days",
             str(days), "-subj", f"/CN={ca_name}", cwd=directory)
    with open(os.path.join(directory, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for who, subj, ext in (("server", "/CN=localhost", ["-extfile", "server.ext"]), ("client", "/CN=client", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj",
                 subj, cwd=directory)
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{who}.crt", "-days", str(days), *ext, cwd=directory)
    for key in ("ca.key", "server.key", "client.key"):
        os.chmod(os.path.join(directory, key), 0o600)
    return {name.replace(".", "_"): os.path.join(directory, name) for name in FILES}
