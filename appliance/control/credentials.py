"""Password credentials of P&M identities: scrypt hashes (``hashlib.scrypt``).

An identity's ``password`` in ``pm.identities`` is never the password itself but the text

    scrypt:N:r:p:SALT_HEX:HASH_HEX

(scrypt cost ``N``, a power of two, block size ``r``, parallelism ``p``, a random salt of
16..64 bytes and a 32-byte derived key). ``hash_password`` makes one;
``python -m appliance.control.credentials`` reads a password on standard input and prints
its line for the config. ``verify_password`` compares in constant time. The MQTT edge
checks CONNECT's username/password with it (docs/edge.md).
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
