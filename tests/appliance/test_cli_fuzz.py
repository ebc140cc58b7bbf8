"""Every ``topicwire`` command meets bad input with one line, exit 2, no traceback, no hang.

Arguments: hypothesis (derandomized: the same examples every run) mutates a working
invocation of each command that ends by itself (``run``, ``demo``, ``warm``, ``bench`` and
``routes`` run for long by design and are left out), replacing, inserting or dropping tokens
and adding the command's own options with hostile values: huge, negative, NaN, text that is
not UTF-8, 2,000-byte strings, NATS subjects. Input files: the fuzzers' seeded mutator
(tests/fuzz/mutate.py) makes captures, subscription request files, configs, registry files
and P4 snapshots. Each invocation runs in this process against a real appliance on
127.0.0.1 with an alarm as its deadline. What must hold: the exit code is 0, 1 or 2; a
failure's last stderr line starts with ``topicwire``; exit 2 is exactly one stderr line;
never a traceback or an internal error; never past the deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.config import parse_config
from appliance.node import Appliance
from appliance.ops.cli import build_parser, main
from tests.appliance.helpers import free_port
from tests.fuzz.mutate import Mutator
from tests.fuzz.seeds import config_seeds, pcap_seed, registry_seed, toml_of

DEADLINE_S = 30
"""No invocation may take longer (the slowest fine one, a login, takes well under a second)."""
HOSTILE = ["", "-1", "0", "nan", "inf", "-inf", "1e400", str(2**40), str(2**64), "0x10", "1.5",
           "a" * 2000, "x\udcff\udcfe", "prices.>", "a.*.c", "#", "+", "a/#/b", "a/b#", "-",
           "--", "\n", "\u20ac/\u00e9", " 1", "missing.file", "udp://", "shm://", "a" * 300]
"""Values a user (or a script gone wrong) passes; none is the path of a file to overwrite."""
SNAPSHOT = Path(__file__).resolve().parents[1] / "p4" / "golden" / "snapshot.json"


class Hung(BaseException):
    """The alarm went off: the command did not end by its deadline."""


def _on_alarm(_signum: int, _frame: object) -> None:
    raise Hung


def invoke(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in this process: (exit code, stdout, stderr); Hung past the deadline."""
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, DEADLINE_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse: --help, or a refusal
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return code, out.getvalue(), err.getvalue()


def check(argv: list[str]) -> int:
    """Run ``argv`` and hold it to the convention; returns its exit code."""
    try:
        code, _, err = invoke(argv)
    except Hung:
        pytest.fail(f"no end within {DEADLINE_S} s: topicwire {argv!r}")
    lines = err.strip().splitlines()
    assert code in (0, 1, 2), (code, argv, err)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    if code != 0 and "--help" not in argv and "-h" not in argv:
        assert lines and lines[-1].startswith("topicwire"), (argv, err)
    if code == 2 and "--help" not in argv and "-h" not in argv:
        assert len(lines) == 1, (argv, err)
    return code


class _Garbage(BaseHTTPRequestHandler):
    """A server that is not a management API: half of it not even HTTP."""

    def do_GET(self) -> None:
        if self.path.endswith("status"):
            self.wfile.write(b"garbage, not a status line\r\n\r\n")
        else:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{[}not json")

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A real appliance (clients, management API), a garbage HTTP server and good files."""
    tmp = tmp_path_factory.mktemp("cli_fuzz")
    client_port, mgmt_port = free_port(), free_port()
    app = Appliance(parse_config({
        "appliance": {"name": "clifuzz"}, "clients": {"udp": f"127.0.0.1:{client_port}"},
        "mgmt": {"listen": f"127.0.0.1:{mgmt_port}"},
        "pm": {"require_passwords": False,
               "identities": {"feed": {"publish": ["prices/#"], "subscribe": ["prices/#"]}}},
    })).start()
    garbage = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    threading.Thread(target=garbage.serve_forever, daemon=True).start()
    (tmp / "capture.pcap").write_bytes(pcap_seed())
    (tmp / "requests.txt").write_text("+a/#\n-a/b/#\n+a/+/c\n")
    (tmp / "registry.json").write_text(registry_seed())
    (tmp / "a.toml").write_text(toml_of(config_seeds()[1]))
    (tmp / "snapshot.json").write_text(SNAPSHOT.read_text())
    yield {"tmp": tmp, "appliance": f"127.0.0.1:{client_port}",
           "mgmt": f"http://127.0.0.1:{mgmt_port}",
           "garbage": f"http://127.0.0.1:{garbage.server_address[1]}"}
    garbage.shutdown()
    app.stop()


def _bases(w: dict) -> dict[str, tuple[list[str], list[str]]]:
    """Working invocations: (tokens the fuzzer may change, a tail it leaves alone so the
    command still ends by itself: last occurrence of an option wins)."""
    t = w["tmp"]
    return {
        "pub": (["pub", "--appliance", w["appliance"], "--identity", "feed", "--topic",
                 "prices/a", "--size", "8"], ["--count", "1"]),
        "sub": (["sub", "--appliance", w["appliance"], "--identity", "feed", "prices/#"],
                ["--count", "1", "--seconds", "0.2"]),
        "status": (["status", "--mgmt", w["mgmt"], "--timeout", "5"], []),
        "status-garbage": (["status", "--mgmt", w["garbage"], "--json", "--timeout", "5"], []),
        "topic": (["topic", "match", "a/#", "a/b"], []),
        "topic-overlaps": (["topic", "overlaps", "a/+", "+/a", "--json"], []),
        "subs": (["subs", "replay", str(t / "requests.txt"), "--publish", "a/b/c"], []),
        "pcap": (["pcap", str(t / "capture.pcap"), "--registry", str(t / "registry.json"),
                  "--config", str(t / "a.toml")], []),
        "dissector": (["dissector", "--out", str(t / "out.lua")], []),
        "completion": (["completion", "bash"], []),
        "p4": (["p4", "entries", "--snapshot", str(t / "snapshot.json"), "--out",
                str(t / "p4out")], []),
        "help": (["--version"], []),
    }


def _options(command: list[str]) -> list[str]:
    """The option strings of the (sub)command ``command`` names."""
    parser = build_parser()
    for word in command:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--")
            and o not in ("--help", "--force", "--follow")]


@st.composite
def _mutated(draw: st.DrawFn, bases: dict) -> list[str]:
    name = draw(st.sampled_from(sorted(bases)))
    head, tail = bases[name]
    tokens = list(head)
    options = _options(tokens[:2])
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(("replace", "insert", "drop", "option")))
        at = draw(st.integers(1, max(1, len(tokens) - 1)))
        value = draw(st.sampled_from(HOSTILE))
        if op == "replace" and at < len(tokens):
            tokens[at] = value
        elif op == "insert":
            tokens.insert(at, value)
        elif op == "drop" and at < len(tokens):
            del tokens[at]
        elif options:
            tokens += [draw(st.sampled_from(options)), value]
    return tokens + tail


def test_every_working_invocation_the_fuzzer_starts_from_succeeds(world, monkeypatch) -> None:
    monkeypatch.chdir(world["tmp"])
    for name, (head, tail) in _bases(world).items():
        code = check(head + tail)
        assert code == (1 if name == "status-garbage" else 0), (name, head + tail)


def test_mutated_arguments_get_one_line_and_an_exit_code_never_a_traceback_or_a_hang(
        world, monkeypatch) -> None:
    monkeypatch.chdir(world["tmp"])
    bases = _bases(world)
    codes = []

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(_mutated(bases))
    def run(argv: list[str]) -> None:
        codes.append(check(argv))

    run()
    assert codes.count(2) > len(codes) // 3  # most mutants are refused as bad input


@pytest.mark.parametrize("argv", [
    ["sub", "--appliance", "{a}", "prices/#", "--seconds", "nan"],
    ["sub", "--appliance", "{a}", "prices/#", "--seconds", "-1"],
    ["pub", "--appliance", "{a}", "--topic", "a" * 2000],
    ["pub", "--appliance", "{a}", "--topic", "a/b", "--identity", "i" * 2000],
    ["pub", "--appliance", "{a}", "--topic", "a/b", "--namespace", "-1"],
    ["pub", "--appliance", "{a}", "--topic", "a/b", "--namespace", str(2**40)],
    ["pub", "--appliance", "{a}", "--topic", "a/\udcff"],
    ["pub", "--appliance", "{a}", "--topic", "a/b", "--message", "\udcff"],
    ["pub", "--appliance", "{a}", "--topic", "a/b", "--size", str(2**40)],
    ["sub", "--appliance", "{a}", "prices.>"],
    ["pcap", "missing.pcap"],
    ["pcap", "{t}/requests.txt"],
])
def test_the_issues_failures_are_one_line_and_exit_2(world, monkeypatch, argv) -> None:
    monkeypatch.chdir(world["tmp"])
    argv = [a.format(a=world["appliance"], t=world["tmp"]) for a in argv]
    assert check(argv) == 2


def test_an_appliance_that_is_not_there_is_exit_1_for_every_command(world) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    assert check(["pub", "--appliance", nobody, "--topic", "a/b"]) == 1
    assert check(["status", "--mgmt", f"http://{nobody}"]) == 1


_FILES = {
    # name: (seed file in the world, argv using {f} for the mutant)
    "capture": ("capture.pcap", ["pcap", "{f}"]),
    "requests": ("requests.txt", ["subs", "replay", "{f}", "--publish", "a/b/c"]),
    "config": ("a.toml", ["pcap", "capture.pcap", "--config", "{f}"]),
    "registry": ("registry.json", ["pcap", "capture.pcap", "--registry", "{f}"]),
    "snapshot": ("snapshot.json", ["p4", "entries", "--snapshot", "{f}", "--out", "p4out"]),
}


@pytest.mark.parametrize("kind", sorted(_FILES))
def test_mutated_input_files_get_one_line_and_an_exit_code(world, monkeypatch, kind) -> None:
    monkeypatch.chdir(world["tmp"])
    seed_name, argv = _FILES[kind]
    seed = (world["tmp"] / seed_name).read_bytes()
    mutator = Mutator(random.Random(f"cli-{kind}"))
    extra = [seed * 3_000, seed * 10_000] if kind == "requests" else []  # many lines (a hang)
    if kind == "capture":  # a record whose caplen is huge (was a hang)
        extra.append(seed[:24] + (1).to_bytes(4, "little") * 2 + (2**31 - 1).to_bytes(
            4, "little") * 2 + seed[40:])
    for i, data in enumerate(extra + [mutator.blob(seed) for _ in range(40)]):
        path = world["tmp"] / f"mutant-{kind}-{i}"
        path.write_bytes(data)
        check([a.format(f=path) for a in argv])


def test_the_exit_code_convention_is_documented_where_users_look() -> None:
    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    docs = (root / "docs" / "appliance.md").read_text()
    for text in (readme, docs):
        assert "130" in text and "runtime failure" in text, "exit codes 0/1/2/130 documented"


def test_ctrl_c_during_a_benchmark_is_one_line_and_exit_130_never_a_traceback() -> None:
    """Ctrl-C as a terminal sends it: SIGINT to the whole process group (the benchmark's
    child processes too), once the benchmark is under way (its progress line)."""
    import os
    import select
    import subprocess
    import time

    from tests.appliance.helpers import CLI, ROOT

    proc = subprocess.Popen([*CLI, "bench", "channel"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen = ""
    try:
        deadline = time.monotonic() + 120
        while "repeat 1/" not in seen:
            assert time.monotonic() < deadline and proc.poll() is None, seen
            if select.select([proc.stderr], [], [], 0.5)[0]:
                seen += proc.stderr.readline()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, seen + err
    assert "Traceback" not in seen + err
    assert err.strip().splitlines()[-1] == "topicwire: interrupted", err
