"""BMv2 running p4/topicwire decides what the software NIC decides, frame by frame.

Where ``p4c-bm2-ss``, ``simple_switch`` and ``simple_switch_CLI`` are on PATH (p4lang's
packages; the project's Vagrantfile installs them) this compiles the program, checks that
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap, wrpcap

from appliance.cli import p4_cmd
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
                          "model packages, installed by the project's Vagrantfile)")

PROGRAM = p4_cmd.P4_PROGRAM_DIR / "topicwire.p4"
INGRESS_PORT = 0
DATA_PORTS = (1, 2, 3, 4, 5, 6)
CPU = model.CPU_PORT
SWITCH_WAIT_S = 3
"""Seconds simple_switch waits (``--use-files``) before reading the input pcaps: the time
the entries have to be loaded in."""
SWITCH_TIMEOUT_S = 60
SETTLE_S = 2.0
"""Output counts unchanged this long after the wait: the switch is done."""


@dataclass(frozen=True)
class Case:
    name: str
    frame: NativeFrame
    single_message: bool = True
    """False: the program hands the frame to the CPU whatever its content."""


def _quote(symbol: str, price: int, schema: Schema = QUOTE) -> bytes:
    return schema.encode({"symbol": symbol, "price": price, "size": 1, "venue": 7})


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
    ]


def _packet(case: Case) -> Ether:
    return (Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
            / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=40000, dport=NATIVE_UDP_PORT)
            / case.frame)


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
    return {c.name: (ports if c.single_message else frozenset({CPU}))
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
    assert ports["retransmission"] == ports["no payload, no ACL"] == {1}
    assert ports["two messages"] == ports["admin frame"] == ports["bad magic"] == {CPU}


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


def _run_switch(program: Path, commands: list[str], packets: list[Ether],
                workdir: Path) -> dict[int, list[bytes]]:
    ports = (INGRESS_PORT, *DATA_PORTS, CPU)
    for port in ports:
        wrpcap(str(workdir / f"pcap{port}_in.pcap"), packets if port == INGRESS_PORT else [])
    thrift = _free_port()
    argv = ["simple_switch", "--use-files", str(SWITCH_WAIT_S), "--thrift-port", str(thrift)]
    for port in ports:
        argv += ["-i", f"{port}@pcap{port}"]
    switch = subprocess.Popen([*argv, str(program)], cwd=workdir, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        _load(thrift, commands)
        return _collect(workdir, ports)
    finally:
        switch.terminate()
        switch.wait(timeout=10)


def _load(thrift: int, commands: list[str]) -> None:
    deadline = time.monotonic() + SWITCH_WAIT_S
    while True:
        run = subprocess.run(["simple_switch_CLI", "--thrift-port", str(thrift)],
                             input="\n".join(commands) + "\n", capture_output=True, text=True,
                             timeout=60)
        if run.returncode == 0 and "Error" not in run.stdout:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"simple_switch_CLI failed:\n{run.stdout}\n{run.stderr}")
        time.sleep(0.2)


def _collect(workdir: Path, ports: tuple[int, ...]) -> dict[int, list[bytes]]:
    def read() -> dict[int, list[bytes]]:
        out = {}
        for port in ports:
            path = workdir / f"pcap{port}_out.pcap"
            out[port] = [bytes(p) for p in rdpcap(str(path))] if path.exists() and \
                path.stat().st_size > 24 else []
        return out

    deadline = time.monotonic() + SWITCH_TIMEOUT_S
    time.sleep(SWITCH_WAIT_S)
    last, stable_since = None, time.monotonic()
    while time.monotonic() < deadline:
        outputs = read()
        counts = {p: len(v) for p, v in outputs.items()}
        if counts != last:
            last, stable_since = counts, time.monotonic()
        elif time.monotonic() - stable_since >= SETTLE_S:
            return outputs
        time.sleep(0.2)
    raise AssertionError("simple_switch did not settle; see its log")


@requires_bmv2
def test_p4c_makes_the_checked_in_p4info(compiled):
    ours = p4_cmd.P4Info.parse(p4_cmd.DEFAULT_P4INFO.read_text())
    theirs = p4_cmd.P4Info.parse((compiled / "topicwire.p4info.txt").read_text())
    assert theirs == ours


@requires_bmv2
def test_bmv2_sends_every_frame_where_the_software_nic_does(compiled, tmp_path):
    snapshot = tmp_path / "snapshot.json"
    runtime_json.save(entry_set(), snapshot)
    p4_cmd.write_entries(snapshot, tmp_path / "entries", bmv2_json=compiled / "topicwire.json")
    commands = (tmp_path / "entries" / p4_cmd.COMMANDS_FILE).read_text().splitlines()
    all_cases = cases()
    packets = [_packet(c) for c in all_cases]
    outputs = _run_switch(compiled / "topicwire.json", commands, packets, tmp_path)
    sent_on: dict[str, set[int]] = {c.name: set() for c in all_cases}
    by_bytes = {bytes(p): c.name for p, c in zip(packets, all_cases)}
    for port, frames in outputs.items():
        for raw in frames:
            name = next((n for b, n in by_bytes.items() if raw[:len(b)] == b), None)
            assert name is not None, f"port {port} sent a frame that was not sent in"
            sent_on[name].add(port)
    expected = expected_ports()
    assert {n: frozenset(p) for n, p in sent_on.items()} == expected
