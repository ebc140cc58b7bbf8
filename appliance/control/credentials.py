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


def main() -> int:
    """Read one password line on standard input, print its stored form."""
    line = sys.stdin.readline().rstrip("\n")
    if not line:
        print("credentials: give the password on standard input", file=sys.stderr)
        return 2
    print(hash_password(line))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
