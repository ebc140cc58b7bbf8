"""The decoder fuzzer: mutated inputs through each decoder in this process.

Each target takes one input and either returns or raises its documented error; anything
else escaping is a finding (its input is saved in tests/fuzz/corpus, once per exception
type and place). Two targets are also checked against the reference decoder
(``decode_frame``): the batch decoder and the software NIC must give every frame the
reason it gives (a disagreement is a finding too).

- ``decode_frame``: ``codec.decode_frame`` (a whole datagram, at an offset in a larger
  buffer, in a stream: ``iter_frames``), then ``Frame.admin()`` or every message's
  ``snapshot()``; raises only ``ProtocolError``;
- ``batch``: ``batch.decode_frames`` and ``channels.base.decode_batch`` (numba) over bursts:
  raise nothing, and give each frame the reference decoder's reason;
- ``softnic``: ``SoftNic.process`` (numba) over bursts: raises nothing, and counts the
  malformed frames by the reference decoder's reasons;
- ``document``: ``control.documents.validate`` (every kind, every sender): a dict or
  ``DocumentError``;
- ``config``: ``config.parse_config`` (documents) and ``load_config`` (TOML files):
  ``ConfigError``;
- ``registry``: ``KeyRegistry.load`` (registry files): ``RegistryError``;
- ``pcap``: ``pcap.dissect`` to its last record (captures): ``UserError`` for a capture it
  cannot read;
- ``mqtt``: the MQTT edge's compiled framing kernel (``fastcodec.Framer``, numba) over a
  stream of packets, whole and split into two reads, both protocol levels, against codec.py
  framing and decoding the same stream as the connection did before (the same packets,
  refusals and bytes taken; a disagreement is a finding).
"""

from __future__ import annotations

import copy
import json
import logging
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from appliance.control.documents import ACCEPTED
from datapath.protocol.admin_layout import ControlKind
from datapath.protocol.codec import decode_frame, decode_header, iter_frames
from datapath.protocol.errors import MalformedReason, ProtocolError
from datapath.protocol.frame_layout import MESSAGE_FRAME_TYPES
from tests.fuzz import corpus
from tests.fuzz import seeds as S
from tests.fuzz.mutate import Mutator

SENDERS = (None, "client", "neighbour", "appliance")
BATCH = 64
"""Frames per call of the batch decoder and the software NIC."""


class Finding(Exception):
    """A decoder disagreed with the reference decoder."""


def expected_status(frame: bytes) -> int:
    """The reason (0: valid) the batch decoder and the NIC must give ``frame``: the reference
    decoder's, over the header only for an admin frame (their bodies are the control
    path's)."""
    try:
        header = decode_header(frame)
    except ProtocolError as exc:
        return int(exc.reason)
    if header.frame_type not in MESSAGE_FRAME_TYPES:
        return 0
    try:
        decode_frame(frame)
    except ProtocolError as exc:
        return int(exc.reason)
    return 0


# --- targets: each takes one input (a burst of frames for the batch decoder and the NIC) ------
def t_decode_frame(frame: bytes) -> str:
    try:
        f = decode_frame(frame)
    except ProtocolError as exc:
        outcome = exc.reason.name.lower()
    else:
        outcome = "valid"
        if f.is_message_frame:
            for m in f.messages():
                m.snapshot()
        else:
            f.admin()
        if f.auth is not None:
            bytes(f.signed_bytes())
    # the same bytes inside a larger buffer, and as a stream
    padded = b"\xa5" * 8 + frame + b"\x5a" * 8
    try:
        decode_frame(padded, 8, len(frame))
    except ProtocolError:
        pass
    try:
        for g in iter_frames(frame + frame):
            if not g.is_message_frame:
                g.admin()
    except ProtocolError:
        pass
    return outcome


class BatchTarget:
    """``decode_frames`` and ``decode_batch`` over a burst, against the reference decoder."""

    def __init__(self) -> None:
        from channels.base import FrameBatch
        from datapath.protocol.batch import new_message_batch

        self.fb = FrameBatch(BATCH)
        self.messages = new_message_batch(BATCH * 64)
        self.status = np.zeros(BATCH, np.uint8)
        self.types = np.zeros(BATCH, np.uint8)

    def __call__(self, frames: list[bytes]) -> str:
        from channels.base import decode_batch
        from channels.stats import ChannelStats
        from datapath.protocol.batch import decode_frames

        want = [expected_status(f) for f in frames]
        fb = self.fb
        fb.clear()
        for f in frames:
            fb.append(f)
        n = len(frames)
        done = 0
        while done < n:  # the messages array may fill: decode the rest next, as documented
            result = decode_frames(fb.buf, fb.offsets[done:n], fb.lengths[done:n],
                                   self.messages, self.status[done:], self.types[done:])
            if result.frames == 0:
                raise Finding(f"decode_frames made no progress at frame {done}")
            done += result.frames
        got = self.status[:n].tolist()
        if got != want:
            i = next(i for i in range(n) if got[i] != want[i])
            raise Finding(f"decode_frames says {_reason(got[i])} for a frame the reference "
                          f"decoder calls {_reason(want[i])}", frames[i])
        stats = ChannelStats()
        self.status[:] = 0
        decode_batch(fb, self.messages, self.status, self.types, stats)
        return "batch"


class SoftNicTarget:
    """``SoftNic.process`` over a burst: its malformed counts are the reference decoder's."""

    def __init__(self) -> None:
        from datapath.topics.registry import KeyRegistry
        from nic_offload.compiler import OffloadCompiler
        from nic_offload.snapshot import SnapshotSwitch
        from nic_offload.softnic import SoftNic

        self.nic = SoftNic(SnapshotSwitch(OffloadCompiler(KeyRegistry()).build()))
        self.buf = np.zeros(BATCH * 65_536, np.uint8)

    def __call__(self, frames: list[bytes]) -> str:
        nic = self.nic
        offsets, lengths, pos = [], [], 0
        for f in frames:
            self.buf[pos:pos + len(f)] = np.frombuffer(f, np.uint8)
            offsets.append(pos)
            lengths.append(len(f))
            pos += (len(f) + 7) & ~7
        before = dict(nic.malformed())
        offs = np.asarray(offsets, np.int64)
        lens = np.asarray(lengths, np.int64)
        done = 0
        while done < len(frames):
            result = nic.process(self.buf, offs[done:], lens[done:])
            if result.frames == 0:
                raise Finding(f"SoftNic.process made no progress at frame {done}")
            done += result.frames
        after = nic.malformed()
        got = Counter({k: v - before.get(k, 0) for k, v in after.items()})
        want = Counter(_reason(s) for f in frames if (s := expected_status(f)))
        if +got != +want:
            raise Finding(f"the software NIC counted {dict(+got)} malformed, the reference "
                          f"decoder {dict(+want)}")
        return "burst"


MQTT_MAX_PACKET = (1 << 20, 48)
"""``mqtt.max_packet_bytes`` values the ``mqtt`` target frames with."""


def t_mqtt(data: bytes) -> str:
    """The compiled framing of an MQTT stream against codec.py's (tests/edge/mqtt_reference.py)."""
    from appliance.edge.mqtt.codec import Refusal
    from tests.edge.mqtt_reference import compiled, reference

    outcome = "incomplete"
    for version in (4, 5):
        for max_packet in MQTT_MAX_PACKET:
            want = reference(data, version, max_packet)
            cut = len(data) // 2
            for chunks in ([data], [data[:cut], data[cut:]]):
                got = compiled(chunks, version, max_packet)
                if got != want:
                    raise Finding(f"MQTT framing of {len(data)} bytes (level {version}, max "
                                  f"{max_packet}, {len(chunks)} reads): kernel {got!r}, "
                                  f"codec.py {want!r}"[:2000])
            if version == 5 and max_packet == MQTT_MAX_PACKET[0]:
                stop = want[2] or (want[0][-1] if want[0] and isinstance(want[0][-1], Refusal)
                                   else None)
                outcome = stop.reason if stop is not None else f"{len(want[0])}_packets"
    return outcome


def t_document(item: tuple[ControlKind, str, str | None]) -> str:
    from appliance.control.documents import DocumentError, validate

    kind, text, sender = item
    try:
        doc = validate(kind, text, sender)
    except DocumentError as exc:
        return exc.reason
    if not isinstance(doc, dict):
        raise Finding(f"validate returned a {type(doc).__name__}")
    return "valid"


_SCRATCH: list[Path] = []
"""The directory the file targets write their input to (one per process)."""


def scratch(name: str) -> Path:
    if not _SCRATCH:
        _SCRATCH.append(Path(tempfile.mkdtemp(prefix="topicwire-fuzz-")))
    return _SCRATCH[0] / name


def t_config(item: tuple[str, Any]) -> str:
    from appliance.config import load_config, parse_config
    from appliance.errors import ConfigError

    form, value = item
    try:
        if form == "dict":
            parse_config(value)
        else:
            path = scratch("fuzz.toml")
            path.write_bytes(value)
            load_config(path)
    except ConfigError:
        return "refused"
    return "valid"


def t_registry(data: bytes) -> str:
    from datapath.topics.registry import KeyRegistry, RegistryError

    path = scratch("registry.json")
    path.write_bytes(data)
    try:
        KeyRegistry.load(path)
    except RegistryError:
        return "refused"
    return "valid"


def t_pcap(data: bytes) -> str:
    from datapath.errors import UserError
    from datapath.protocol.pcap import CaptureSummary, dissect, format_record

    path = scratch("capture.pcap")
    path.write_bytes(data)
    summary = CaptureSummary()
    try:
        for record in dissect(path, 47_470, summary=summary):
            format_record(record)
    except UserError:
        return "refused"
    json.dumps(summary.as_dict())
    return "read"


def _reason(value: int) -> str:
    try:
        return MalformedReason(value).name.lower()
    except ValueError:
        return str(value)


# --- inputs -----------------------------------------------------------------------------------
class Inputs:
    """Mutated inputs of each target, from the seeds (``seeds.py``)."""

    def __init__(self, rng: random.Random) -> None:
        from appliance.control.auth import FabricAuth

        self.rng = rng
        self.m = Mutator(rng)
        auth = FabricAuth(bytes.fromhex(S.FABRIC_KEY), 1, 1)
        fs = S.frame_seeds(4242, 7, auth)
        self.frames = fs.anon + fs.neighbour + fs.stranger
        self.derived: list[bytes] = []
        self.documents = S.document_seeds()
        self.configs = S.config_seeds()
        self.tomls = [S.toml_of(c) for c in self.configs]
        self.registry = S.registry_seed()
        self.pcap = S.pcap_seed()
        self.mqtt_packets = S.mqtt_seeds()

    def frame(self) -> bytes:
        rng = self.rng
        if rng.random() < 0.05:
            out = self.m.control(rng.choice(self.frames))
            if out is not None:
                if len(self.derived) < 512:
                    self.derived.append(out)
                else:
                    self.derived[rng.randrange(512)] = out
                return out
        pool = self.derived if self.derived and rng.random() < 0.2 else self.frames
        return self.m.frame(rng.choice(pool), self.frames)

    def frames_burst(self) -> list[bytes]:
        return [self.frame() for _ in range(self.rng.randrange(1, BATCH + 1))]

    def document(self) -> tuple[ControlKind, str, str | None]:
        rng = self.rng
        kind, text = rng.choice(self.documents)
        if rng.random() < 0.1:
            kind = rng.choice(list(ControlKind))
        text = self.m.document(text) if rng.random() < 0.8 else self.m.text(text)
        senders = [s for s in SENDERS[1:] if kind in ACCEPTED[s]]
        sender = rng.choice(senders) if senders and rng.random() < 0.7 else rng.choice(SENDERS)
        return kind, text, sender

    def config(self) -> tuple[str, Any]:
        rng = self.rng
        if rng.random() < 0.6:
            doc = copy.deepcopy(rng.choice(self.configs))
            for _ in range(rng.choice((1, 1, 2, 3))):
                doc = self.m.json(doc)
            return "dict", doc
        text = rng.choice(self.tomls)
        for _ in range(rng.choice((1, 2))):
            text = self.m.text(text)
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            data = text.encode("utf-8", "surrogatepass")
        return "toml", self.m.blob(data) if rng.random() < 0.2 else data

    def registry_file(self) -> bytes:
        rng = self.rng
        if rng.random() < 0.5:
            try:
                doc = json.loads(self.registry)
                for _ in range(rng.choice((1, 2))):
                    doc = self.m.json(doc)
                return json.dumps(doc).encode()
            except (ValueError, RecursionError):
                pass
        return self.m.blob(self.registry.encode())

    def pcap_file(self) -> bytes:
        return self.m.blob(self.pcap)

    def mqtt_stream(self) -> bytes:
        """One to eight seed packets, one of them (or the stream) mutated."""
        rng = self.rng
        packets = [rng.choice(self.mqtt_packets) for _ in range(rng.randrange(1, 9))]
        i = rng.randrange(len(packets))
        packets[i] = self.m.frame(packets[i], self.mqtt_packets)
        data = b"".join(packets)
        return self.m.blob(data) if rng.random() < 0.2 else data


def targets(inputs: Inputs) -> dict[str, tuple[Callable[[], Any], Callable[[Any], str]]]:
    """name -> (make an input, run the target on it)."""
    return {
        "decode_frame": (inputs.frame, t_decode_frame),
        "batch": (inputs.frames_burst, BatchTarget()),
        "softnic": (inputs.frames_burst, SoftNicTarget()),
        "document": (inputs.document, t_document),
        "config": (inputs.config, t_config),
        "registry": (inputs.registry_file, t_registry),
        "pcap": (inputs.pcap_file, t_pcap),
        "mqtt": (inputs.mqtt_stream, t_mqtt),
    }


def corpus_entry(target: str, item: Any, note: str) -> dict[str, Any]:
    """The corpus file of one input (corpus.py)."""
    if target == "document":
        kind, text, sender = item
        return {"target": target, "kind": kind.name, "sender": sender, "note": note,
                "hex": text.encode("utf-8", "surrogatepass").hex()}
    if target == "config":
        form, value = item
        if form == "dict":
            return {"target": target, "form": "dict", "note": note,
                    "hex": json.dumps(value).encode("utf-8", "surrogatepass").hex()}
        return {"target": target, "form": "toml", "note": note, "hex": value.hex()}
    if target in ("batch", "softnic"):
        return {"target": target, "note": note, "frames": [f.hex() for f in item]}
    return {"target": target, "note": note, "hex": bytes(item).hex()}


def item_of(entry: dict[str, Any]) -> Any:
    """The input of a corpus entry, as its target takes it."""
    target = entry["target"]
    if target == "document":
        text = bytes.fromhex(entry["hex"]).decode("utf-8", "surrogatepass")
        return ControlKind[entry["kind"]], text, entry["sender"]
    if target == "config":
        data = bytes.fromhex(entry["hex"])
        if entry["form"] == "dict":
            return "dict", json.loads(data.decode("utf-8", "surrogatepass"))
        return "toml", data
    if target in ("batch", "softnic"):
        return [bytes.fromhex(f) for f in entry["frames"]]
    return bytes.fromhex(entry["hex"])


def where(exc: BaseException) -> str:
    """file:line of the innermost frame of ``exc``'s traceback in this project."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if "/site-packages/" not in f.filename] or frames
    f = mine[-1] if mine else None
    return f"{Path(f.filename).name}:{f.lineno}" if f else "?"


def run_decoders(seconds: float, seed: int, names: list[str] | None = None,
                 save: bool = True) -> dict[str, Any]:
    """Each target for ``seconds / len(targets)``; the summary (JSON-able)."""
    logging.getLogger("scapy").setLevel(logging.ERROR)  # its warnings about broken captures
    rng = random.Random(seed)
    inputs = Inputs(rng)
    table = targets(inputs)
    names = names or list(table)
    unknown = set(names) - set(table)
    if unknown:
        raise SystemExit(f"unknown targets: {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(table)}")
    share = seconds / len(names)
    summary: dict[str, Any] = {"seed": seed, "seconds": seconds, "targets": {}}
    total_findings = 0
    for name in names:
        make, run = table[name]
        outcomes: Counter[str] = Counter()
        findings: dict[str, str] = {}
        count = 0
        start = time.monotonic()
        deadline = start + share
        while time.monotonic() < deadline:
            item = make()
            count += len(item) if name in ("batch", "softnic") else 1
            try:
                outcomes[run(item)] += 1
            except Finding as exc:
                key = f"disagreement: {exc.args[0]}"[:300]
                outcomes["finding"] += 1
                if key not in findings:
                    findings[key] = _save(name, exc.args[1] if len(exc.args) > 1 and
                                          name == "batch" else item, key, save)
            except RecursionError as exc:  # the interpreter's, not a decoder's answer
                key = f"RecursionError at {where(exc)}"
                outcomes["finding"] += 1
                findings.setdefault(key, _save(name, item, key, save))
            except Exception as exc:  # anything else escaping is the finding
                key = f"{type(exc).__name__} at {where(exc)}: {str(exc)[:120]}"
                outcomes["finding"] += 1
                sig = f"{type(exc).__name__} at {where(exc)}"
                if not any(k.startswith(sig) for k in findings):
                    findings[key] = _save(name, item, key, save)
        elapsed = time.monotonic() - start
        total_findings += len(findings)
        print(f"fuzz decoders: {name}: {count:,} inputs in {elapsed:.1f} s, "
              f"{len(findings)} finding(s)", file=sys.stderr, flush=True)
        summary["targets"][name] = {
            "inputs": count, "seconds": round(elapsed, 1),
            "inputs_per_s": round(count / elapsed) if elapsed else 0,
            "outcomes": dict(outcomes.most_common()), "findings": findings}
    if _SCRATCH:
        shutil.rmtree(_SCRATCH.pop(), ignore_errors=True)
    summary["findings"] = total_findings
    summary["inputs"] = sum(t["inputs"] for t in summary["targets"].values())
    summary["ok"] = total_findings == 0
    return summary


def _save(target: str, item: Any, note: str, save: bool) -> str:
    if target == "batch" and isinstance(item, bytes):
        item = [item]
    if not save:
        return ""
    return corpus.save(corpus_entry(target, item, note)).name
