"""mosquitto's byte-level conformance vectors (``test/broker/data/*.json``, run by its
``test/broker/msg_sequence_test.py``), fetched from Debian's mosquitto source package and run
against any MQTT server on loopback.

Nothing of mosquitto is kept in this repository: ``fetch()`` downloads the source package with
a temporary deb-src list (the mirror of the machine's own ``debian.sources``), unpacks it with
``dpkg-source -x`` and caches ``test/`` under the venv, so a second run does not refetch.
Debian 12's own mosquitto (2.0.11) predates the vectors: the source package is the next Debian
release's (``SOURCE_SUITE``), pinned to ``SOURCE_VERSION`` so the set of cases stays fixed.

Each vector is a scripted conversation: the runner (as mosquitto's ``MsgSequence``) connects
with mosquitto's default CONNECT (client id = the case's name, keep alive 60), then sends,
expects and publishes (through a helper client) what the vector says, then checks that the
server closed the connection or, for ``expect_disconnect: false``, that it still answers a
PINGREQ. The helpers ``gen_connect``/``gen_connack``/``gen_publish``... are mosquitto's own
``test/mosq_test.py`` from the package. Two points differ from mosquitto's runner, both because
it assumes a mosquitto with its default configuration on port 1888 (docs/mqtt.md):

* a CONNACK is compared as a packet, not as bytes: same flags, same reason code, every property
  mosquitto sends present with the same value; a server may add the properties in
  ``EXTRA_CONNACK_PROPS`` (capabilities and limits a 5.0 server announces);
* the helper publisher connects to the server's port (mosquitto's uses 1888), and the runner
  reads whole packets (mosquitto's does one ``recv`` of the expected length, and waits out its
  2 s timeout when the server sent a shorter packet);
* where a vector expects the server to close, a PINGREQ follows its bytes: a server still
  connected answers it (a byte: the case fails at once), one that closed does not (mosquitto's
  runner waits 2 s for a byte instead: too short a deadline for a busy machine, too long to
  wait out in every failing case).

``python -m tests.edge.mosquitto_vectors fetch`` fetches; ``... run`` runs every case against a
fresh edge and prints the verdicts in the format of ``mosquitto_vectors_expected.txt``.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

SOURCE_PACKAGE = "mosquitto"
SOURCE_VERSION = "2.0.21-1"
"""The Debian source package version whose vectors ``mosquitto_vectors_expected.txt`` lists."""
SOURCE_SUITE = "trixie"
"""Debian 13: its mosquitto carries ``msg_sequence_test.py``; Debian 12's 2.0.11 does not."""
MACHINE_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
CACHE_DIR = Path(sys.prefix) / "cache" / "mosquitto-vectors"
"""Under the venv (``make clean`` removes it); holds the unpacked ``test/`` only."""
EXPECTED_FILE = Path(__file__).with_name("mosquitto_vectors_expected.txt")
FETCH_TIMEOUT_S = 300.0
CASE_TIMEOUT_S = 10.0
"""Per socket operation (mosquitto's runner: 2 s, which a busy 2-core machine exceeded once
for a CONNACK; a case that passes never waits it out)."""

# MQTT 5.0 CONNACK properties a server may announce beyond mosquitto's defaults: each states a
# capability or a limit, none changes what the vectors exchange after the CONNACK.
EXTRA_CONNACK_PROPS = {0x24: "maximum_qos", 0x25: "retain_available",
                       0x27: "maximum_packet_size", 0x28: "wildcard_subscription_available",
                       0x29: "subscription_identifier_available",
                       0x2A: "shared_subscription_available"}


class VectorsUnavailable(Exception):
    """The source package could not be fetched or unpacked (the message says why)."""


# -- fetch ---------------------------------------------------------------------------------

def _mirror_uri() -> str:
    """The Debian mirror apt already uses (the first ``URIs:`` of the machine's sources)."""
    try:
        for line in MACHINE_SOURCES.read_text().splitlines():
            if line.startswith("URIs:") and line.split()[1:]:
                uri = line.split()[1]
                if "security" not in uri:
                    return uri
    except OSError as e:
        raise VectorsUnavailable(f"mosquitto vectors: cannot read {MACHINE_SOURCES}: {e}") from e
    raise VectorsUnavailable(f"mosquitto vectors: no Debian mirror in {MACHINE_SOURCES}")


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                              timeout=FETCH_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VectorsUnavailable(f"mosquitto vectors: {' '.join(cmd[:2])} failed: {e}") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise VectorsUnavailable(f"mosquitto vectors: {' '.join(cmd[:2])} exited "
                                 f"{proc.returncode}: {' | '.join(tail)}")


def fetch(cache_dir: Path = CACHE_DIR) -> Path:
    """The unpacked ``test/`` of mosquitto's source package, fetched once into ``cache_dir``.
    Raises ``VectorsUnavailable`` when it cannot be fetched."""
    tests = cache_dir / SOURCE_VERSION / "test"
    if (tests / "broker" / "msg_sequence_test.py").exists():
        return tests
    for tool in ("apt-get", "dpkg-source"):
        if shutil.which(tool) is None:
            raise VectorsUnavailable(f"mosquitto vectors: {tool} is missing (make test installs "
                                     "dpkg-dev)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        work = Path(tmp)
        (work / "sources").mkdir()
        (work / "lists" / "partial").mkdir(parents=True)
        (work / "cache" / "archives" / "partial").mkdir(parents=True)
        (work / "sources" / "src.sources").write_text(
            f"Types: deb-src\nURIs: {_mirror_uri()}\nSuites: {SOURCE_SUITE}\n"
            "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
        opts = ["-o", "Dir::Etc::SourceList=/dev/null",
                "-o", f"Dir::Etc::SourceParts={work / 'sources'}",
                "-o", f"Dir::State::Lists={work / 'lists'}",
                "-o", f"Dir::Cache={work / 'cache'}"]
        _run(["apt-get", *opts, "-qq", "update"], work)
        _run(["apt-get", *opts, "-qq", "source", "--download-only",
              f"{SOURCE_PACKAGE}={SOURCE_VERSION}"], work)
        dsc = next(work.glob(f"{SOURCE_PACKAGE}_*.dsc"), None)
        if dsc is None:
            raise VectorsUnavailable("mosquitto vectors: apt-get source left no .dsc")
        _run(["dpkg-source", "--no-check", "-x", dsc.name, "src"], work)
        unpacked = work / "src" / "test"
        if not (unpacked / "broker" / "msg_sequence_test.py").exists():
            raise VectorsUnavailable(f"mosquitto vectors: {dsc.name} has no "
                                     "test/broker/msg_sequence_test.py")
        tests.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tests, ignore_errors=True)
        shutil.move(str(unpacked), tests)
    return tests


# -- cases ---------------------------------------------------------------------------------

@dataclass
class Case:
    """One vector: ``cid`` is ``FILE/group/name`` (``#n`` appended to the n-th repeat)."""

    cid: str
    name: str
    version: int
    connect: bool
    expect_disconnect: bool
    msgs: list[dict] = field(default_factory=list)


def load_cases(tests: Path) -> list[Case]:
    """Every enabled case of ``broker/data/*.json``, in the order mosquitto's runner takes
    them (files sorted by name, then as written)."""
    cases: list[Case] = []
    seen: Counter[str] = Counter()
    for path in sorted((tests / "broker" / "data").glob("*.json")):
        for group in json.loads(path.read_text()):
            if group.get("disable"):
                continue
            for t in group["tests"]:
                base = f"{path.stem}/{group['group']}/{t['name']}"
                seen[base] += 1
                cid = base if seen[base] == 1 else f"{base}#{seen[base]}"
                cases.append(Case(cid, f"{group['group']} {t['name']}", t.get("ver", 4),
                                  t.get("connect", True), t.get("expect_disconnect", True),
                                  t["msgs"]))
    return cases


def mosq_test(tests: Path) -> ModuleType:
    """mosquitto's ``test/mosq_test.py`` from the fetched package (packet generators)."""
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))
    return importlib.import_module("mosq_test")


# -- runner --------------------------------------------------------------------------------

class CaseFailed(Exception):
    pass


def _read_exactly(sock: socket.socket, n: int, what: str) -> bytes:
    out = b""
    while len(out) < n:
        try:
            chunk = sock.recv(n - len(out))
        except TimeoutError:
            raise CaseFailed(f"{what}: timed out after {out.hex(' ')!r}") from None
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise CaseFailed(f"{what}: closed after {out.hex(' ')!r}")
        out += chunk
    return out


def _read_packet(sock: socket.socket, what: str) -> bytes:
    data = _read_exactly(sock, 1, what)
    for _ in range(4):
        data += _read_exactly(sock, 1, what)
        if not data[-1] & 0x80:
            break
    length, shift = 0, 0
    for b in data[1:]:
        length |= (b & 0x7F) << shift
        shift += 7
    return data + _read_exactly(sock, length, what)


def _connack_props(packet: bytes) -> tuple[bytes, dict[int, bytes]] | None:
    """(flags and reason, {property id: raw value}) of a 5.0 CONNACK; None if it is not one."""
    if len(packet) < 5 or packet[0] != 0x20:
        return None
    head = 1
    while packet[head] & 0x80:
        head += 1
    body = packet[head + 1:]
    if len(body) < 3:
        return None
    plen, shift, i = 0, 0, 2
    while True:
        plen |= (body[i] & 0x7F) << shift
        shift += 7
        i += 1
        if not body[i - 1] & 0x80:
            break
    props, end = {}, i + plen
    sizes = {0x11: 4, 0x12: None, 0x13: 2, 0x15: None, 0x16: None, 0x17: 1, 0x1A: None,
             0x1C: None, 0x1F: None, 0x21: 2, 0x22: 2, 0x24: 1, 0x25: 1, 0x26: None, 0x27: 4,
             0x28: 1, 0x29: 1, 0x2A: 1}
    while i < end:
        pid = body[i]
        i += 1
        if pid not in sizes:
            return None
        size = sizes[pid]
        if size is None:  # a string or binary (user properties: two of them)
            n = 2 if pid == 0x26 else 1
            start = i
            for _ in range(n):
                i += 2 + int.from_bytes(body[i:i + 2], "big")
            size, i = i - start, start
        props[pid] = props.get(pid, b"") + body[i:i + size]
        i += size
    return body[:2], props


def same_packet(expected: bytes, got: bytes) -> bool:
    """``got`` is ``expected``, or both are CONNACKs that agree (the module's docstring)."""
    if got == expected:
        return True
    want, have = _connack_props(expected), _connack_props(got)
    if want is None or have is None or want[0] != have[0]:
        return False
    if any(have[1].get(pid) != value for pid, value in want[1].items()):
        return False
    return all(pid in want[1] or pid in EXTRA_CONNACK_PROPS for pid in have[1])


class Runner:
    """Runs cases one after the other against one server at ``host:port``."""

    def __init__(self, tests: Path, host: str, port: int) -> None:
        self.mt = mosq_test(tests)
        self.host, self.port = host, port

    def _sock(self) -> socket.socket:
        return socket.create_connection((self.host, self.port), timeout=CASE_TIMEOUT_S)

    def _expect(self, sock: socket.socket, expected: bytes, what: str) -> None:
        got = b""
        while len(got) < len(expected):  # whole packets: a different one fails without waiting
            got += _read_packet(sock, what)
            if not expected.startswith(got):
                break
        if not same_packet(expected, got):
            raise CaseFailed(f"{what}: got {got.hex(' ')}, expected {expected.hex(' ')}")

    def _publish(self, m: dict) -> None:
        """mosquitto's helper: a 3.1.1 client ``helper`` publishes, and completes its flow."""
        mt = self.mt
        with self._sock() as sock:
            sock.sendall(mt.gen_connect("helper", keepalive=60))
            self._expect(sock, mt.gen_connack(rc=0), "helper connack")
            qos = m["qos"]
            sock.sendall(mt.gen_publish(topic=m["topic"], payload=m["payload"], qos=qos,
                                        mid=1 if qos else 0))
            if qos == 1:
                self._expect(sock, mt.gen_puback(mid=1), "helper puback")
            elif qos == 2:
                self._expect(sock, mt.gen_pubrec(mid=1), "helper pubrec")
                sock.sendall(mt.gen_pubrel(mid=1))
                self._expect(sock, mt.gen_pubcomp(mid=1), "helper pubcomp")

    def run(self, case: Case) -> str | None:
        """None when the server behaves as the vector says; else what differed."""
        mt = self.mt
        try:
            with self._sock() as sock:
                if case.connect:
                    sock.sendall(mt.gen_connect(case.name, keepalive=60,
                                                proto_ver=case.version))
                    self._expect(sock, mt.gen_connack(rc=0, proto_ver=case.version),
                                 "default connack")
                for m in case.msgs:
                    what = m.get("comment") or m["type"]
                    if m["type"] == "send":
                        try:
                            sock.sendall(bytes.fromhex(m["payload"].replace(" ", "")))
                        except (BrokenPipeError, ConnectionResetError):
                            raise CaseFailed(f"send {what}: connection closed") from None
                    elif m["type"] == "recv":
                        self._expect(sock, bytes.fromhex(m["payload"].replace(" ", "")), what)
                    elif m["type"] == "publish":
                        self._publish(m)
                if case.expect_disconnect:
                    self._closed(sock)
                else:
                    self._expect_ping(sock)
        except CaseFailed as e:
            return str(e)
        except OSError as e:
            return f"{type(e).__name__}: {e}"
        return None

    def _closed(self, sock: socket.socket) -> None:
        """The server closed the connection without sending anything more. A PINGREQ probes
        it: a server still connected answers at once, so a case fails without waiting out
        the timeout (mosquitto's runner waits 2 s for a byte)."""
        try:
            sock.sendall(self.mt.gen_pingreq())
            data = sock.recv(1)
        except (BrokenPipeError, ConnectionResetError):
            return
        except TimeoutError:
            raise CaseFailed("still connected (no close and no PINGRESP within "
                             f"{CASE_TIMEOUT_S:g} s)") from None
        if data:
            rest = b""
            try:
                rest = sock.recv(64)
            except OSError:
                pass
            raise CaseFailed(f"still connected: sent {(data + rest).hex(' ')}")

    def _expect_ping(self, sock: socket.socket) -> None:
        try:
            sock.sendall(self.mt.gen_pingreq())
        except (BrokenPipeError, ConnectionResetError):
            raise CaseFailed("disconnected (PINGREQ not sent)") from None
        self._expect(sock, self.mt.gen_pingresp(), "pingresp (still connected)")


# -- expected verdicts ---------------------------------------------------------------------

def read_expected(path: Path = EXPECTED_FILE) -> dict[str, str]:
    """{case id: "pass" or the reason it does not} from the checked-in list (tab separated:
    ``id<TAB>pass`` or ``id<TAB>fail<TAB>reason``; ``#`` starts a comment line)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        cid, verdict, *reason = line.split("\t")
        out[cid] = "pass" if verdict == "pass" else (reason[0] if reason else "fail")
    return out


def _main(argv: list[str]) -> int:
    tests = fetch()
    print(f"mosquitto vectors: {tests}", file=sys.stderr)
    if argv[:1] != ["run"]:
        return 0
    from tests.edge.test_mosquitto_vectors import start_vector_edge, warm_up

    edge = start_vector_edge()
    try:
        warm_up(edge)
        runner = Runner(tests, "127.0.0.1", edge.mqtt.address[1])
        t0, failed = time.monotonic(), 0
        for case in load_cases(tests):
            why = runner.run(case)
            failed += why is not None
            print(f"{case.cid}\tpass" if why is None else f"{case.cid}\tfail\t{why}")
        print(f"# {failed} failed, {time.monotonic() - t0:.1f} s", file=sys.stderr)
    finally:
        edge.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(_main(sys.argv[1:]))
