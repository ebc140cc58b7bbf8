"""Password credentials of P&M identities: scrypt hashes, and the challenge-response login.

An identity's ``password`` in ``pm.identities`` is never the password itself but the text

    scrypt:N:r:p:SALT_HEX:HASH_HEX

(scrypt cost ``N``, a power of two, block size ``r``, parallelism ``p``, a random salt of
16..64 bytes and a 32-byte derived key). ``hash_password`` makes one;
``python -m appliance.control.credentials`` reads a password on standard input and prints
its line for the config. ``verify_password`` compares in constant time. The MQTT edge
checks CONNECT's username/password against the identity's ``verifier`` in its copy of P&M's
document (``verify_with_verifier``, docs/mqtt.md), so an edge whose P&M is remote checks
passwords too.

``scram_sha256`` is a second, optional credential: SCRAM-SHA-256's stored keys (RFC 5802/
7677: salt, iteration count, StoredKey, ServerKey; ``hash_scram``, or ``--scram`` on the
command line), for MQTT 5.0 enhanced authentication at the edge (appliance/edge/mqtt/
handle_auth.py). The computations are scramp's (PyPI), not ours.

Native clients never send the password: they prove they know it (SCRAM's exchange, RFC
5802 section 3, with scrypt for the salted password and keyed BLAKE2b-256 for HMAC and H):

    SaltedPassword  = scrypt(password, salt, N, r, p)        (the stored HASH)
    ClientKey       = BLAKE2b(key=SaltedPassword, "Client Key")
    StoredKey       = BLAKE2b(ClientKey)
    ServerKey       = BLAKE2b(key=SaltedPassword, "Server Key")
    AuthMessage     = "topicwire-login-v1" | identity | client nonce | server nonce | node
    ClientProof     = ClientKey XOR BLAKE2b(key=StoredKey, AuthMessage)
    ServerSignature = BLAKE2b(key=ServerKey, AuthMessage)
    SessionKey      = BLAKE2b(key=ClientKey, "topicwire-session-v1|" AuthMessage)

P&M distributes each identity's ``verifier`` (salt, N, r, p, StoredKey, ServerKey: not the
hash, from which a login could be made) to every appliance; an appliance checks a proof
with it (``verify_proof``) and signs its answer, which the client checks (the appliance
knew the verifier). The server nonce is fresh per login and used once, so a captured login
cannot be replayed. Every frame the client then sends carries the frame MAC under the
session key (datapath/protocol/frame_mac.py; docs/security.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import sys
from dataclasses import dataclass

SCRYPT_N = 1 << 14
"""Default scrypt cost (CPU/memory); 16 MiB of memory per check with r = 8."""
SCRYPT_R = 8
SCRYPT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
SCRYPT_MAX_N = 1 << 20
"""A stored hash asking for more is refused (a check must not take seconds or GiBs)."""
SCRYPT_MAX_MEMORY_BYTES = 1 << 30
PREFIX = "scrypt"


class CredentialError(ValueError):
    """A stored credential that does not parse (what is wrong, never the secret)."""


@dataclass(frozen=True)
class ScryptHash:
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def text(self) -> str:
        return f"{PREFIX}:{self.n}:{self.r}:{self.p}:{self.salt.hex()}:{self.digest.hex()}"


def parse_hash(text: object) -> ScryptHash:
    """The parts of ``scrypt:N:r:p:SALT_HEX:HASH_HEX`` (raises ``CredentialError``)."""
    if not isinstance(text, str):
        raise CredentialError("must be a string \"scrypt:N:r:p:SALT_HEX:HASH_HEX\"")
    parts = text.strip().split(":")
    if len(parts) != 6 or parts[0] != PREFIX:
        raise CredentialError("must be \"scrypt:N:r:p:SALT_HEX:HASH_HEX\" (make one with "
                              "`python -m appliance.control.credentials`), not a password")
    try:
        n, r, p = (int(x) for x in parts[1:4])
        salt, digest = bytes.fromhex(parts[4]), bytes.fromhex(parts[5])
    except ValueError:
        raise CredentialError("N, r and p must be decimal integers and salt and hash hex")\
            from None
    if not (2 <= n <= SCRYPT_MAX_N and n & (n - 1) == 0):
        raise CredentialError(f"N must be a power of two in [2, {SCRYPT_MAX_N}], not {n}")
    if not (1 <= r <= 32 and 1 <= p <= 16):
        raise CredentialError(f"r must be in [1, 32] and p in [1, 16], not {r} and {p}")
    if not 16 <= len(salt) <= 64 or len(digest) != HASH_BYTES:
        raise CredentialError(f"the salt must be 16..64 bytes and the hash {HASH_BYTES}")
    if 128 * r * n * 2 > SCRYPT_MAX_MEMORY_BYTES:
        raise CredentialError("N and r ask for more than 1 GiB of memory per check")
    return ScryptHash(n, r, p, salt, digest)


def _derive(password: bytes, h: ScryptHash) -> bytes:
    return hashlib.scrypt(password, salt=h.salt, n=h.n, r=h.r, p=h.p,
                          maxmem=SCRYPT_MAX_MEMORY_BYTES, dklen=len(h.digest))


def hash_password(password: str | bytes, *, n: int = SCRYPT_N, r: int = SCRYPT_R,
                  p: int = SCRYPT_P) -> str:
    """The stored form of a password, with a fresh random salt."""
    raw = password.encode() if isinstance(password, str) else password
    h = ScryptHash(n, r, p, os.urandom(SALT_BYTES), b"\x00" * HASH_BYTES)
    return ScryptHash(n, r, p, h.salt, _derive(raw, h)).text()


def verify_password(stored: str, password: bytes) -> bool:
    """Whether ``password`` is the one ``stored`` was made from (constant-time compare);
    False for a stored text that does not parse."""
    try:
        h = parse_hash(stored)
    except CredentialError:
        return False
    return hmac.compare_digest(_derive(password, h), h.digest)


# --- the challenge-response login --------------------------------------------------------------
NONCE_BYTES = 16
KEY_BYTES = 32
LOGIN_CONTEXT = b"topicwire-login-v1"
SESSION_CONTEXT = b"topicwire-session-v1|"


def _h(data: bytes, key: bytes = b"") -> bytes:
    return hashlib.blake2b(data, key=key, digest_size=KEY_BYTES).digest()


def verifier_of(stored: str) -> dict[str, object]:
    """What P&M distributes for an identity with password hash ``stored`` (raises
    ``CredentialError``): scrypt's parameters and salt, StoredKey and ServerKey, hex."""
    h = parse_hash(stored)
    client_key = _h(b"Client Key", h.digest)
    return {"n": h.n, "r": h.r, "p": h.p, "salt": h.salt.hex(),
            "stored_key": _h(client_key).hex(), "server_key": _h(b"Server Key", h.digest).hex()}


def verify_with_verifier(verifier: dict[str, object], password: bytes) -> bool:
    """Whether ``password`` is the one behind an identity's ``verifier`` (``verifier_of``):
    scrypt under the verifier's parameters and salt, then StoredKey compared in constant time
    (SCRAM's property: StoredKey checks a password given in clear, and cannot itself log in).
    An appliance whose P&M is remote checks an MQTT CONNECT's password this way, with the
    verifier of its copy of P&M's document. False for parameters outside ``parse_hash``'s
    bounds or a verifier that does not parse."""
    try:
        h = parse_hash(f"{PREFIX}:{verifier['n']}:{verifier['r']}:{verifier['p']}:"
                       f"{verifier['salt']}:" + "00" * HASH_BYTES)
        stored = bytes.fromhex(str(verifier["stored_key"]))
    except (CredentialError, KeyError, ValueError):
        return False
    return hmac.compare_digest(_h(_h(b"Client Key", _derive(password, h))), stored)


def auth_message(identity: str, client_nonce: bytes, server_nonce: bytes, node: str) -> bytes:
    return b"|".join((LOGIN_CONTEXT, identity.encode(), client_nonce, server_nonce,
                      node.encode()))


def client_proof(password: bytes, challenge: dict[str, object], message: bytes
                 ) -> tuple[bytes, bytes, bytes]:
    """(ClientProof, the ServerSignature to expect, the session key) for ``password`` under
    a challenge's scrypt parameters (``n``, ``r``, ``p``, ``salt`` hex); raises
    ``CredentialError`` for parameters a check must not run (``parse_hash``'s bounds)."""
    salt = str(challenge["salt"])
    h = parse_hash(f"{PREFIX}:{challenge['n']}:{challenge['r']}:{challenge['p']}:{salt}:"
                   + "00" * HASH_BYTES)
    salted = _derive(password, h)
    client_key = _h(b"Client Key", salted)
    signature = _h(message, _h(client_key))
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    return proof, _h(message, _h(b"Server Key", salted)), session_key(client_key, message)


def verify_proof(verifier: dict[str, object], message: bytes, proof: bytes) -> bytes | None:
    """The session key when ``proof`` shows knowledge of the password behind ``verifier``
    for ``message`` (constant-time compare), else None."""
    stored = bytes.fromhex(str(verifier["stored_key"]))
    if len(proof) != KEY_BYTES:
        return None
    client_key = bytes(a ^ b for a, b in zip(proof, _h(message, stored)))
    if not hmac.compare_digest(_h(client_key), stored):
        return None
    return session_key(client_key, message)


def session_key(client_key: bytes, message: bytes) -> bytes:
    """The key of the session's frame MAC: known to the client (from its password) and to
    the appliance (ClientKey, recovered from the proof), to no one who saw the login."""
    return _h(SESSION_CONTEXT + message, client_key)


def server_signature(verifier: dict[str, object], message: bytes) -> bytes:
    return _h(message, bytes.fromhex(str(verifier["server_key"])))


# --- SCRAM-SHA-256 (RFC 5802/7677) for MQTT 5.0 enhanced authentication -------------------------
SCRAM_MECHANISM = "SCRAM-SHA-256"
SCRAM_PREFIX = "scram-sha-256"
SCRAM_ITERATIONS = 4096
"""Default PBKDF2 iteration count (RFC 7677's minimum, scramp's default); the client pays it
per login, the edge never runs PBKDF2."""
SCRAM_MIN_ITERATIONS = 4096
SCRAM_MAX_ITERATIONS = 10_000_000
"""A stored key asking for more is refused: a client would be told to spend minutes."""
SCRAM_SALT_BYTES = (12, 64)
"""Bounds of a stored salt (scramp refuses under 12 bytes)."""
SCRAM_KEY_BYTES = 32


@dataclass(frozen=True)
class ScramKeys:
    """An identity's SCRAM-SHA-256 stored keys: what a server keeps (RFC 5802 section 3),
    from which no login can be made."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    def text(self) -> str:
        return (f"{SCRAM_PREFIX}:{self.iterations}:{self.salt.hex()}:{self.stored_key.hex()}:"
                f"{self.server_key.hex()}")

    def document(self) -> dict[str, object]:
        """The form P&M's document carries (appliance/control/documents.py ``SCRAM``)."""
        return {"i": self.iterations, "salt": self.salt.hex(),
                "stored_key": self.stored_key.hex(), "server_key": self.server_key.hex()}

    def auth_info(self) -> tuple[bytes, bytes, bytes, int]:
        """scramp's ``auth_fn`` answer: (salt, StoredKey, ServerKey, iteration count)."""
        return self.salt, self.stored_key, self.server_key, self.iterations


def _scram_keys(iterations: int, salt: bytes, stored: bytes, server: bytes) -> ScramKeys:
    if not SCRAM_MIN_ITERATIONS <= iterations <= SCRAM_MAX_ITERATIONS:
        raise CredentialError(f"the iteration count must be in [{SCRAM_MIN_ITERATIONS}, "
                              f"{SCRAM_MAX_ITERATIONS}], not {iterations}")
    low, high = SCRAM_SALT_BYTES
    if not low <= len(salt) <= high:
        raise CredentialError(f"the salt must be {low}..{high} bytes, not {len(salt)}")
    if len(stored) != SCRAM_KEY_BYTES or len(server) != SCRAM_KEY_BYTES:
        raise CredentialError(f"StoredKey and ServerKey must be {SCRAM_KEY_BYTES} bytes each "
                              "(SHA-256)")
    return ScramKeys(iterations, salt, stored, server)


def parse_scram(text: object) -> ScramKeys:
    """The stored keys of ``scram-sha-256:ITER:SALT_HEX:STOREDKEY_HEX:SERVERKEY_HEX`` (what
    ``hash_scram`` prints) or of PostgreSQL's ``SCRAM-SHA-256$ITER:SALT$STOREDKEY:SERVERKEY``
    (base64, as in ``pg_authid``); raises ``CredentialError``."""
    form = ('"scram-sha-256:ITER:SALT_HEX:STOREDKEY_HEX:SERVERKEY_HEX" (make one with '
            '`python -m appliance.control.credentials --scram`), not a password')
    if not isinstance(text, str):
        raise CredentialError("must be a string " + form)
    text = text.strip()
    try:
        if text.startswith(SCRAM_MECHANISM + "$"):
            head, keys = text[len(SCRAM_MECHANISM) + 1:].split("$")
            iterations, salt = head.split(":")
            stored, server = keys.split(":")
            return _scram_keys(int(iterations), *(base64.b64decode(x, validate=True)
                                                  for x in (salt, stored, server)))
        parts = text.split(":")
        if len(parts) != 5 or parts[0] != SCRAM_PREFIX:
            raise CredentialError("must be " + form)
        return _scram_keys(int(parts[1]), *(bytes.fromhex(x) for x in parts[2:]))
    except CredentialError:
        raise
    except (ValueError, binascii.Error):
        raise CredentialError("the iteration count must be a decimal integer and the salt "
                              "and keys hex (base64 in the SCRAM-SHA-256$ form)") from None


def scram_from_document(spec: object) -> ScramKeys | None:
    """The stored keys of an identity's ``scram_sha256`` in P&M's document; None when it has
    none or they do not parse."""
    if not isinstance(spec, dict):
        return None
    try:
        return _scram_keys(int(spec["i"]), *(bytes.fromhex(str(spec[k])) for k in
                                             ("salt", "stored_key", "server_key")))
    except (CredentialError, KeyError, ValueError, TypeError):
        return None


def hash_scram(password: str, *, iterations: int = SCRAM_ITERATIONS) -> str:
    """The stored SCRAM-SHA-256 keys of ``password`` (scramp's ``make_auth_info``: SASLprep,
    PBKDF2-HMAC-SHA-256 with a fresh random salt), as ``parse_scram`` reads them."""
    from scramp import ScramMechanism

    salt, stored, server, i = ScramMechanism(SCRAM_MECHANISM).make_auth_info(
        password, iteration_count=iterations)
    return _scram_keys(i, salt, stored, server).text()


def main(argv: list[str] | None = None) -> int:
    """Read one password line on standard input, print its stored form: the scrypt hash
    (``password``), or with ``--scram`` the SCRAM-SHA-256 stored keys (``scram_sha256``)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m appliance.control.credentials",
        description="read a password on standard input, print the line for "
                    "pm.identities.NAME.password (or, with --scram, .scram_sha256)")
    parser.add_argument("--scram", action="store_true",
                        help="SCRAM-SHA-256 stored keys (MQTT 5.0 enhanced authentication)")
    parser.add_argument("--iterations", type=int, default=SCRAM_ITERATIONS,
                        help=f"PBKDF2 iterations with --scram (default {SCRAM_ITERATIONS}, "
                             f"at most {SCRAM_MAX_ITERATIONS})")
    args = parser.parse_args(argv)
    line = sys.stdin.readline().rstrip("\n")
    if not line:
        print("credentials: give the password on standard input", file=sys.stderr)
        return 2
    if not args.scram:
        print(hash_password(line))
        return 0
    if not SCRAM_MIN_ITERATIONS <= args.iterations <= SCRAM_MAX_ITERATIONS:
        print(f"credentials: --iterations must be in [{SCRAM_MIN_ITERATIONS}, "
              f"{SCRAM_MAX_ITERATIONS}]", file=sys.stderr)
        return 2
    try:
        print(hash_scram(line, iterations=args.iterations))
    except Exception as exc:  # scramp's SASLprep refuses some characters
        print(f"credentials: the password cannot be used with SCRAM: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
