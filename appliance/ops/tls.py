"""TLS for the appliance's TCP listeners and the commands that talk to them (Python's ``ssl``).

``server_context`` makes the context of a listener from the files its config names (the
management API: ``mgmt.tls_cert_file``, ``mgmt.tls_key_file``, and ``mgmt.tls_client_ca_file``
to require client certificates signed by that CA); ``client_context`` the context of a
command (``topicwire status --ca-file``). TLS 1.2 at least; the certificate chain, key and
CA are loaded when the config is read, so a bad file stops the appliance at start with the
key named (exit 2), never at the first connection.
"""

from __future__ import annotations

import ssl
from pathlib import Path

MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_2


class TlsFileError(ValueError):
    """A certificate, key or CA file that does not load (what is wrong; never key bytes)."""


def server_context(cert_file: str | Path, key_file: str | Path,
                   client_ca_file: str | Path | None = None) -> ssl.SSLContext:
    """A listener's context: its certificate chain and key; with ``client_ca_file``, a
    client must present a certificate that CA signed."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_TLS_VERSION
    try:
        ctx.load_cert_chain(str(cert_file), str(key_file))
    except (ssl.SSLError, OSError) as exc:
        raise TlsFileError(f"cannot load the certificate chain {cert_file} with the key "
                           f"{key_file} ({_why(exc)}): give a PEM certificate (chain) and its "
                           "PEM private key") from None
    if client_ca_file is not None:
        _load_ca(ctx, client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(ca_file: str | Path | None = None, cert_file: str | Path | None = None,
                   key_file: str | Path | None = None) -> ssl.SSLContext:
    """A command's context: the server's certificate checked against ``ca_file`` (default:
    the system's CAs), host name included; ``cert_file``/``key_file``: its own certificate
    for a listener that requires one."""
    ctx = ssl.create_default_context()
    ctx.minimum_version = MIN_TLS_VERSION
    if ca_file is not None:
        _load_ca(ctx, ca_file)
    if cert_file is not None:
        try:
            ctx.load_cert_chain(str(cert_file), None if key_file is None else str(key_file))
        except (ssl.SSLError, OSError) as exc:
            raise TlsFileError(f"cannot load the client certificate {cert_file} ({_why(exc)})")\
                from None
    return ctx


def _load_ca(ctx: ssl.SSLContext, ca_file: str | Path) -> None:
    try:
        ctx.load_verify_locations(cafile=str(ca_file))
    except (ssl.SSLError, OSError) as exc:
        raise TlsFileError(f"cannot load the CA certificates {ca_file} ({_why(exc)}): give "
                           "PEM certificates") from None


def _why(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
