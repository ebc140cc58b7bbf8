"""BMv2 running p4/topicwire decides what the software NIC decides, frame by frame.

Where ``p4c-bm2-ss``, ``simple_switch`` and ``simple_switch_CLI`` are on PATH (p4lang's
packages p4lang-p4c and p4lang-bmv2, not in Debian 12) this compiles the program, checks that
p4c's P4Info is the checked-in one, programs the switch with ``topicwire p4 entries``'
commands for the snapshot of tests/p4/snapshot.py, sends scapy-built frames through it
(``simple_switch --use-files``: pcap files per port, no root needed) and compares the ports
each frame leaves on with the software NIC's decision for the same frame. Elsewhere the
BMv2 tests skip with that reason; the software NIC's half of the comparison runs anyway.

Single-message DATA and RETRANSMISSION frames are decided by the program; every other frame
(several messages, admin frames, malformed frames) goes to the CPU port (p4/README.md).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP, IPOption_NOP
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap, wrpcap

from appliance.ops.cli import p4_cmd
from datapath.config import NATIVE_UDP_PORT
from datapath.protocol.frame_layout import FrameType
from datapath.protocol.scapy_native import HelloEntry, NativeFrame, NativeMessage
from nic_offload import model, runtime_json
from nic_offload.schema import Schema
from nic_offload.snapshot import Snapshot
from nic_offload.softnic import SoftNic
from nic_offload.softnic.layout import DescriptorKind, MessageVerdict
from tests.p4.snapshot import QUOTE, entry_set

TOOLS = ("p4c-bm2-ss", "simple_switch", "simple_switch_CLI")
MISSING = [tool for tool in TOOLS if shutil.which(tool) is None]
requires_bmv2 = pytest.mark.skipif(
    bool(MISSING), reason=f"needs {', '.join(MISSING)} on PATH (p4lang's p4c and behavioral-"
                          "model: p4lang's packages p4lang-p4c and p4lang-bmv2, which "
                          "Debian 12 does not carry)")

PROGRAM = p4_cmd.P4_PROGRAM_DIR / "topicwire.p4"
INGRESS_PORT = 0
DATA_PORTS = (1, 2, 3, 4, 5, 6)
CPU = model.CPU_PORT
SWITCH_WAIT_S = 10
"""Seconds simple_switch waits (``--use-files``) before reading the input pcaps: the time
the entries have to be loaded in (the test fails, saying so, if loading takes longer)."""
SWITCH_TIMEOUT_S = 60
SETTLE_S = 2.0
"""Output counts unchanged this long after the wait: the switch is done."""


@dataclass(frozen=True)
class Case:
    name: str
    frame: NativeFrame
    single_message: bool = True
    """False: the program hands the frame to the CPU whatever its content."""
    ip: dict = field(default_factory=dict)
    """IPv4 fields to override (a bad checksum, options, a fragment)."""
    udp: dict = field(default_factory=dict)
    """UDP fields to override (a length that disagrees with the frame)."""
    cut_bytes: int = 0
    """Bytes cut off the end of the packet (a truncated capture)."""

    @property
    def program_decides(self) -> bool:
        """Does the program decide this packet (else: the CPU port, whatever the frame)?"""
        return self.single_message and not (self.ip or self.udp or self.cut_bytes)


def _quote(symbol: str, price: int, venue: int = 7, schema: Schema = QUOTE) -> bytes:
    return schema.encode({"symbol": symbol, "price": price, "size": 1, "venue": venue})


def _data(key: int, seq: int, payload: bytes = b"", *, frame_type: int = FrameType.DATA,
          topic: bytes = b"", flags: int = 0) -> NativeFrame:
    return NativeFrame(frame_type=frame_type, stream_id=1, entries=[NativeMessage(
        topic_key=key, sequence=seq, data=payload, topic=topic, flags=flags)])


def cases() -> list[Case]:
    """One frame per decision the pipeline can make, plus frames it leaves to the CPU."""
    ibm, msft_big, msft_small = _quote("IBM", 100), _quote("MSFT", 200_000), _quote("MSFT", 10)
    return [
        Case("forward to a port", _data(0x1001, 1, ibm)),
        Case("forward to a multicast group", _data(0x1002, 2, ibm)),
        Case("drop", _data(0x1003, 3, ibm)),
        Case("punt", _data(0x1004, 4, ibm)),
        Case("unknown key", _data(0x9999, 5, ibm)),
        Case("key zero", _data(0, 6, ibm)),
        Case("ACL accept", _data(0x1005, 7, ibm)),
        Case("ACL log", _data(0x1005, 8, msft_big)),
        Case("ACL reject", _data(0x1005, 9, msft_small)),
        Case("ACL accept to a group", _data(0x1006, 10, ibm)),
        Case("ACL short payload", _data(0x1005, 11, b"IBM\x00\x00\x00")),
        Case("ACL accept in the last stage", _data(0x1007, 24, ibm)),
        Case("ACL reject in the last stage", _data(0x1007, 25, _quote("IBM", 100, venue=8))),
        Case("no payload, no ACL", _data(0x1001, 12)),
        Case("retransmission", _data(0x1001, 13, ibm, frame_type=FrameType.RETRANSMISSION,
                                     flags=1)),
        Case("topic string after the payload", _data(0x1005, 14, ibm, topic=b"nyse/ibm")),
        Case("two messages", NativeFrame(frame_type=FrameType.DATA, stream_id=1, entries=[
            NativeMessage(topic_key=0x1001, sequence=15, data=ibm),
            NativeMessage(topic_key=0x1003, sequence=16, data=ibm)]), single_message=False),
        Case("admin frame", NativeFrame(frame_type=FrameType.HELLO, entries=[
            HelloEntry(node_id=17, node_name=b"core-1")]), single_message=False),
        Case("bad magic", NativeFrame(magic=0x1234, entries=[
            NativeMessage(topic_key=0x1001, sequence=18, data=ibm)]), single_message=False),
        Case("bad IPv4 checksum", _data(0x1001, 19, ibm), ip={"chksum": 0x1234}),
        Case("IPv4 options", _data(0x1001, 20, ibm), ip={"options": [IPOption_NOP()] * 4}),
        Case("IPv4 fragment", _data(0x1001, 21, ibm), ip={"flags": "MF"}),
        Case("UDP length shorter than the frame", _data(0x1001, 22, ibm),
             udp={"len": 8 + 72}),
        Case("truncated packet", _data(0x1001, 23, ibm), cut_bytes=8),
    ]


def _packet(case: Case) -> bytes:
    """The Ethernet frame sent into the switch (never onto a network: a pcap file)."""
    packet = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
                   / IP(src="10.0.0.1", dst="10.0.0.2", **case.ip)
                   / UDP(sport=40000, dport=NATIVE_UDP_PORT, **case.udp) / case.frame)
    return packet[:len(packet) - case.cut_bytes]


def software_nic_ports(frames: list[bytes]) -> list[frozenset[int]]:
    """Ports the software NIC sends each single-message frame to (CPU for punts)."""
    snapshot = Snapshot.build(entry_set())
    nic = SoftNic(snapshot)
    buf = np.frombuffer(b"".join(frames), dtype=np.uint8).copy()
    lengths = np.array([len(f) for f in frames], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    result = nic.process(buf, offsets, lengths)
    out: list[set[int]] = [set() for _ in frames]
    descriptors = {int(d["index"]): d for d in nic.descriptors[:result.descriptors]}
    for m in range(result.messages):
        frame = int(nic.batch[m]["frame_index"])
        verdict = MessageVerdict(int(nic.verdicts[m]))
        if verdict in (MessageVerdict.PUNTED, MessageVerdict.UNKNOWN_KEY):
            out[frame].add(CPU)
        elif verdict in (MessageVerdict.FORWARDED, MessageVerdict.LOGGED):
            d = descriptors[m]
            target = int(d["target"])
            if int(d["kind"]) == DescriptorKind.GROUP:
                out[frame].update(snapshot.group_ports(target))
            else:
                out[frame].add(target)
    return [frozenset(ports) for ports in out]


def expected_ports() -> dict[str, frozenset[int]]:
    """What BMv2 must do with each case: the software NIC's decision, or the CPU port."""
    all_cases = cases()
    decided = software_nic_ports([bytes(c.frame) for c in all_cases])
    return {c.name: (ports if c.program_decides else frozenset({CPU}))
            for c, ports in zip(all_cases, decided)}


def test_the_cases_cover_every_decision_of_the_software_nic():
    ports = expected_ports()
    assert ports["forward to a port"] == {1}
    assert ports["forward to a multicast group"] == {2, 3}
    assert ports["drop"] == frozenset() and ports["ACL reject"] == frozenset()
    assert ports["punt"] == ports["unknown key"] == ports["key zero"] == {CPU}
    assert ports["ACL accept"] == ports["ACL log"] == ports["topic string after the payload"] \
        == {4}
    assert ports["ACL accept to a group"] == {5, 6}
    assert ports["ACL short payload"] == frozenset()
    assert ports["ACL accept in the last stage"] == {3}
    assert ports["ACL reject in the last stage"] == frozenset()
    assert ports["retransmission"] == ports["no payload, no ACL"] == {1}
    for name in ("two messages", "admin frame", "bad magic", "bad IPv4 checksum",
                 "IPv4 options", "IPv4 fragment", "UDP length shorter than the frame",
                 "truncated packet"):
        assert ports[name] == {CPU}, name


def test_wire_level_cases_really_are_broken_the_way_they_say():
    by_name = {c.name: Ether(_packet(c)) for c in cases()}
    good = by_name["forward to a port"]
    assert IP(bytes(good[IP])).chksum == good[IP].chksum  # scapy computed a valid one
    assert by_name["bad IPv4 checksum"][IP].chksum != good[IP].chksum
    assert by_name["IPv4 options"][IP].ihl == 6
    assert by_name["IPv4 fragment"][IP].flags.MF
    assert by_name["UDP length shorter than the frame"][UDP].len < good[UDP].len
    assert len(_packet(next(c for c in cases() if c.name == "truncated packet"))) == \
        len(bytes(good)) - 8


# --- BMv2 -----------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("p4build")
    run = subprocess.run(
        ["p4c-bm2-ss", "--p4v", "16", "-o", str(build / "topicwire.json"),
         "--p4runtime-files", str(build / "topicwire.p4info.txt"), str(PROGRAM)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return build


def _run_switch(program: Path, commands: list[str], packets: list[bytes],
                workdir: Path) -> dict[int, list[bytes]]:
    """Start simple_switch on pcap files, program it before it reads its input, return the
    packets each port sent."""
    ports = (INGRESS_PORT, *DATA_PORTS, CPU)
    for port in ports:
        wrpcap(str(workdir / f"pcap{port}_in.pcap"),
               [Ether(p) for p in packets] if port == INGRESS_PORT else [])
    thrift = _free_port()
    argv = ["simple_switch", "--use-files", str(SWITCH_WAIT_S), "--thrift-port", str(thrift)]
    for port in ports:
        argv += ["-i", f"{port}@pcap{port}"]
    log = workdir / "simple_switch.log"
    with log.open("w") as log_file:
        started = time.monotonic()
        switch = subprocess.Popen([*argv, str(program)], cwd=workdir, stdout=log_file,
                                  stderr=subprocess.STDOUT)
        try:
            _load(thrift, commands, switch, log)
            loaded_s = time.monotonic() - started
            assert loaded_s < SWITCH_WAIT_S, (
                f"loading the entries took {loaded_s:.1f} s, longer than the switch waits "
                f"before reading its input ({SWITCH_WAIT_S} s); raise SWITCH_WAIT_S")
            time.sleep(max(0.0, SWITCH_WAIT_S - loaded_s))
            return _collect(workdir, ports, log)
        finally:
            switch.terminate()
            switch.wait(timeout=10)


def _load(thrift: int, commands: list[str], switch: subprocess.Popen, log: Path) -> None:
    """Wait for the switch's Thrift port, then run the commands once (a retry would add the
    entries twice)."""
    deadline = time.monotonic() + SWITCH_WAIT_S
    while True:
        if switch.poll() is not None:
            raise AssertionError(f"simple_switch exited ({switch.returncode}):\n"
                                 f"{log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", thrift), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"simple_switch's Thrift port {thrift} never opened; "
                                     f"see {log}") from None
            time.sleep(0.1)
    run = subprocess.run(["simple_switch_CLI", "--thrift-port", str(thrift)],
                         input="\n".join(commands) + "\n", capture_output=True, text=True,
                         timeout=60)
    if run.returncode != 0 or "Error" in run.stdout or "Invalid" in run.stdout:
        raise AssertionError(f"simple_switch_CLI refused the entries:\n{run.stdout}\n"
                             f"{run.stderr}")


def _collect(workdir: Path, ports: tuple[int, ...], log: Path) -> dict[int, list[bytes]]:
    """Every port's output once the counts stop changing (BMv2 flushes each packet)."""
    def read() -> dict[int, list[bytes]]:
        out = {}
        for port in ports:
            path = workdir / f"pcap{port}_out.pcap"
            out[port] = [bytes(p) for p in rdpcap(str(path))] if path.exists() and \
                path.stat().st_size > 24 else []
        return out

    deadline = time.monotonic() + SWITCH_TIMEOUT_S
    last, stable_since = None, time.monotonic()
    while time.monotonic() < deadline:
        outputs = read()
        counts = {p: len(v) for p, v in outputs.items()}
        if counts != last:
            last, stable_since = counts, time.monotonic()
        elif time.monotonic() - stable_since >= SETTLE_S:
            return outputs
        time.sleep(0.2)
    raise AssertionError(f"simple_switch did not settle; see {log}")


@requires_bmv2
def test_p4c_makes_the_checked_in_p4info(compiled):
    ours = p4_cmd.P4Info.parse(p4_cmd.DEFAULT_P4INFO.read_text())
    theirs = p4_cmd.P4Info.parse((compiled / "topicwire.p4info.txt").read_text())
    assert theirs == ours


@requires_bmv2
def test_bmv2_sends_every_frame_where_the_software_nic_does(compiled, tmp_path):
    snapshot = tmp_path / "snapshot.json"
    runtime_json.save(entry_set(), snapshot)
    p4_cmd.write_entries(snapshot, tmp_path / "entries", bmv2_json=compiled / "topicwire.json",
                         port_map={p: p for p in DATA_PORTS})  # logical port p: switch port p
    commands = (tmp_path / "entries" / p4_cmd.COMMANDS_FILE).read_text().splitlines()
    all_cases = cases()
    packets = [_packet(c) for c in all_cases]
    outputs = _run_switch(compiled / "topicwire.json", commands, packets, tmp_path)
    sent_on: dict[str, set[int]] = {c.name: set() for c in all_cases}
    by_bytes = {p: c.name for p, c in zip(packets, all_cases)}
    assert len(by_bytes) == len(all_cases), "two cases send the same bytes"
    for port, frames in outputs.items():
        for raw in frames:
            name = by_bytes.get(raw)  # the program forwards frames unchanged
            assert name is not None, f"port {port} sent a frame that was not sent in"
            sent_on[name].add(port)
    expected = expected_ports()
    assert {n: frozenset(p) for n, p in sent_on.items()} == expected
