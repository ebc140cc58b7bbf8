"""The management API over TLS (``mgmt.tls_cert_file``, ``mgmt.tls_key_file``, and client
certificates with ``mgmt.tls_client_ca_file``): a real appliance (``topicwire run``), real
certificates made by ``openssl``, ``topicwire status`` and Python's ``ssl`` as clients."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import urllib.request

import pytest

from tests.appliance.helpers import ROOT, free_port, run_appliance, stop, wait_for, write_config

CLI = [sys.executable, "-c", "import sys; from appliance.ops.cli import main; "
       "sys.exit(main(sys.argv[1:]))"]


def _certificate(directory, name: str) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (it is its own CA) and its key."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", f"/CN={name}", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return str(cert), str(key)


def _config(tmp_path, mgmt: str) -> tuple[str, int]:
    port = free_port()
    config = write_config(tmp_path / "a.toml", f"""
[appliance]
name = "tls{port}"
[clients]
udp = "127.0.0.1:{free_port()}"
[pm]
anonymous = true
require_passwords = false
[mgmt]
listen = "127.0.0.1:{port}"
{mgmt}
""")
    return str(config), port


def _status(port: int, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + ["status", "--mgmt", f"https://127.0.0.1:{port}", "--json",
                                 *extra], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.fixture
def certs(tmp_path):
    return {"server": _certificate(tmp_path, "server"), "client": _certificate(tmp_path,
                                                                             "client")}


def test_the_api_answers_over_tls_and_a_plain_or_untrusted_client_gets_nothing(tmp_path, certs):
    cert, key = certs["server"]
    config, port = _config(tmp_path, f'tls_cert_file = "{cert}"\ntls_key_file = "{key}"')
    proc = run_appliance(config)
    try:
        done = _status(port, "--ca-file", cert)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["node"]["name"] == f"tls{port}"
        # without the CA the server's certificate is not trusted: unreachable, exit 1
        untrusted = _status(port)
        assert untrusted.returncode == 1 and "certificate verify failed" in untrusted.stderr
        # plain HTTP to the TLS port: no answer in the clear, and the API goes on serving
        with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
            plain.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            plain.settimeout(10)
            try:
                answer = plain.recv(4096)
            except (ConnectionResetError, TimeoutError):
                answer = b""
            assert b"node" not in answer and not answer.startswith(b"HTTP/")
        ctx = ssl.create_default_context(cafile=cert)
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/node", context=ctx,
                                    timeout=10) as answer:
            assert json.loads(answer.read())["node"]["name"] == f"tls{port}"
    finally:
        assert stop(proc) == 0


def test_client_certificates_are_required_when_a_client_ca_is_configured(tmp_path, certs):
    cert, key = certs["server"]
    ccert, ckey = certs["client"]
    config, port = _config(tmp_path, f'tls_cert_file = "{cert}"\ntls_key_file = "{key}"\n'
                                     f'tls_client_ca_file = "{ccert}"')
    proc = run_appliance(config)
    try:
        without = _status(port, "--ca-file", cert)
        assert without.returncode == 1, without.stdout
        done = _status(port, "--ca-file", cert, "--cert-file", ccert, "--key-file", ckey)
        assert done.returncode == 0, done.stderr
        # a certificate the client CA did not sign is refused too
        other, other_key = _certificate(tmp_path, "stranger")
        assert _status(port, "--ca-file", cert, "--cert-file", other,
                       "--key-file", other_key).returncode == 1
        assert wait_for(lambda: _status(port, "--ca-file", cert, "--cert-file", ccert,
                                        "--key-file", ckey).returncode == 0)
    finally:
        assert stop(proc) == 0


@pytest.mark.parametrize("mgmt, key", [
    ('tls_cert_file = "{cert}"', "mgmt.tls_cert_file"),
    ('tls_key_file = "{key}"', "mgmt.tls_key_file"),
    ('tls_client_ca_file = "{cert}"', "mgmt.tls_client_ca_file"),
    ('tls_cert_file = "{key}"\ntls_key_file = "{key}"', "mgmt.tls_cert_file"),
    ('tls_cert_file = "{cert}"\ntls_key_file = "{cert}"', "mgmt.tls_cert_file"),
    ('tls_cert_file = "{cert}"\ntls_key_file = "/nonexistent.key"', "mgmt.tls_key_file"),
])
def test_a_bad_tls_config_stops_the_appliance_with_one_line_naming_the_key(tmp_path, certs,
                                                                         mgmt, key):
    cert, pkey = certs["server"]
    config, _ = _config(tmp_path, mgmt.format(cert=cert, key=pkey))
    done = subprocess.run(CLI + ["run", "--config", config], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert key in done.stderr and "Traceback" not in done.stderr


def test_status_refuses_tls_files_for_a_plain_url_and_unreadable_ones():
    done = subprocess.run(CLI + ["status", "--mgmt", "http://127.0.0.1:1", "--ca-file",
                                 "/etc/hostname"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "https://" in done.stderr
    done = subprocess.run(CLI + ["status", "--mgmt", "https://127.0.0.1:1", "--ca-file",
                                 "/nonexistent.pem"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "/nonexistent.pem" in done.stderr
