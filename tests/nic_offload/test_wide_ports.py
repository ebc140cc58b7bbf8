"""Egress ports are 16-bit logical ports: the compiler, the model and the software NIC take
ports past the 9 bits of a switch port (a session of an appliance with 10,000 of them), and
refuse 65,536 and up with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from datapath.protocol import codec
from datapath.topics.registry import KeyRegistry
from nic_offload import model
from nic_offload.compiler import OffloadCompiler
from nic_offload.errors import CompileError, ModelError
from nic_offload.model import EntrySet, KeyAction, KeyRows, MulticastGroup
from nic_offload.snapshot import Snapshot
from nic_offload.softnic import SoftNic
from nic_offload.softnic import layout as L
from nic_offload.softnic.layout import MessageVerdict as V


def test_the_port_space_is_16_bits_and_the_cpu_port_keeps_its_number():
    assert (model.EGRESS_PORT_BITS, model.MAX_EGRESS_PORT) == (16, 65_535)
    assert (model.PHYSICAL_PORT_BITS, model.MAX_PHYSICAL_PORT) == (9, 511)
    assert model.CPU_PORT == 255
    # the software NIC's slot value word holds a 16-bit target (port or group)
    assert L.TARGET_MASK >> L.TARGET_SHIFT == model.MAX_EGRESS_PORT == model.MAX_GROUP


def test_the_compiler_takes_ports_up_to_65535_and_refuses_wider_ones():
    compiler = OffloadCompiler(KeyRegistry())
    compiler.add_egress("top", 65_535)
    for port in (65_536, 100_000, -1):
        with pytest.raises(CompileError, match=r"port .* must be 0\.\.65535 and not the CPU"):
            compiler.add_egress(f"e{port}", port)
    with pytest.raises(CompileError, match="not the CPU port 255"):
        compiler.add_egress("cpu", model.CPU_PORT)


def test_the_model_refuses_a_port_or_a_group_member_past_16_bits():
    rows = KeyRows(np.array([5], np.uint64), np.array([KeyAction.FORWARD], np.uint8),
                   np.array([65_536], np.uint32), np.zeros(1, np.uint16))
    with pytest.raises(ModelError, match=r"egress port exceeds 16 bits \(0\.\.65535\)"):
        rows.validate(model.DEFAULT_SPEC)
    entries = EntrySet(model.DEFAULT_SPEC, KeyRows(
        np.array([5], np.uint64), np.array([KeyAction.FORWARD_GROUP], np.uint8),
        np.array([1], np.uint32), np.zeros(1, np.uint16)), (),
        (MulticastGroup(1, (2, 65_536)),), 1)
    with pytest.raises(ModelError, match=r"needs ports in 0\.\.65535"):
        entries.validate()


def test_a_subscription_of_a_port_past_511_forwards_there_through_the_software_nic():
    """Compiled from subscriptions (one egress at 40,000; two more share a group with a port
    past 511), then run by the software NIC on real frames: the descriptors name them."""
    registry = KeyRegistry()
    wide, shared = registry.key_for("wide/t"), registry.key_for("shared/t")
    compiler = OffloadCompiler(registry)
    compiler.add_egress("s40000", 40_000)
    compiler.add_egress("s600", 600)
    compiler.add_egress("s3", 3)
    compiler.subscribe("s40000", "wide/#")
    compiler.subscribe("s600", "shared/#")
    compiler.subscribe("s3", "shared/#")
    snap = compiler.build()
    nic = SoftNic(Snapshot.build(snap.entries))
    frame = codec.encode_data_frame([{"topic_key": wide, "payload": b"x" * 8},
                                     {"topic_key": shared, "payload": b"y" * 8}])
    buf = np.frombuffer(frame, np.uint8).copy()
    result = nic.process(buf, np.zeros(1, np.int64), np.array([len(frame)], np.int64))
    assert nic.verdicts[:result.messages].tolist() == [V.FORWARDED, V.FORWARDED]
    descs = nic.descriptors[:result.descriptors]
    assert descs["kind"].tolist() == [L.DescriptorKind.PORT, L.DescriptorKind.GROUP]
    assert int(descs["target"][0]) == 40_000
    assert nic.snapshot.group_ports(int(descs["target"][1])) == (3, 600)
