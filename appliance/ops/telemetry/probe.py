"""An appliance's path telemetry: recorders on the fabric channel, probes, the writer.

``PathTelemetry`` lives on the data-path thread (the data-path agent calls it): it records
every received fabric burst (``on_batch``: one kernel call), sends each configured neighbour
a probe every ``probe_interval_ns`` (``do_work``), closes the windows when the wall clock
passes their end and offers them to the ``TelemetryWriter``, whose own thread writes the
Parquet files. Nothing here waits for I/O: a full writer queue drops and counts.

A probe is a DATA frame without messages (docs/routing.md, "Telemetry")::

    header: DATA, msg_count 0, frame_len 40, source_session = this node,
            dest_session = 0, stream_id = PROBE_STREAM_ID, send_ts_ns (stamped by the channel)
    body:   u64 sequence number, per (this node, neighbour), from 0

Neighbours are named by their configured fabric address (peer id), so windows carry names
even before a neighbour's HELLO arrives.
"""

from __future__ import annotations

import struct
import time
from typing import Any

from appliance.ops.telemetry.config import PROBE_BODY_BYTES, PROBE_STREAM_ID
from appliance.ops.telemetry.settings import TelemetrySettings
from appliance.ops.telemetry.store import TelemetryStore
from appliance.ops.telemetry.windows import WindowRecorder
from appliance.ops.telemetry.writer import TelemetryWriter
from datapath.protocol import frame_layout as fl

WALL_CHECK_INTERVAL_NS = 10_000_000
"""How often (monotonic) the wall clock is read to see whether a window ended."""
_PROBE_BYTES = fl.FRAME_HEADER_BYTES + PROBE_BODY_BYTES
_SEQ = struct.Struct(">Q")


def probe_frame(node_id: int, seq: int) -> bytes:
    """A probe frame (module docstring); the channel stamps ``send_ts_ns``."""
    return fl.FRAME_HEADER_STRUCT.pack(fl.FRAME_MAGIC, fl.PROTOCOL_VERSION,
                                       int(fl.FrameType.DATA), 0, 0, _PROBE_BYTES, node_id, 0,
                                       PROBE_STREAM_ID, 0) + _SEQ.pack(seq)


def is_probe(stream_id: int, frame_type: int) -> bool:
    """Whether a frame header's fields say probe (the classifier skips probes)."""
    return stream_id == PROBE_STREAM_ID and frame_type == int(fl.FrameType.DATA)


class PathTelemetry:
    """See the module docstring. ``channel`` is the data path's fabric channel name."""

    def __init__(self, appliance: str, node_id: int, neighbours: dict[int, str],
                 settings: TelemetrySettings, channel: str = "fabric") -> None:
        self.settings = settings
        self.channel = channel
        self.names = dict(neighbours)
        now = time.time_ns()
        self.recorder = WindowRecorder(appliance, channel, window_ns=settings.window_ns,
                                       now_ns=now)
        self.writer = TelemetryWriter(TelemetryStore(settings.dir, tag=appliance),
                                      retention_ns=settings.retention_ns)
        self._probe = {peer: bytearray(probe_frame(node_id, 0)) for peer in self.names}
        self._seq = dict.fromkeys(self.names, 0)
        self._probe_at_ns = 0
        self._wall_at_ns = 0
        self.probes_sent = 0
        self.windows_offered = 0

    def start(self) -> PathTelemetry:
        self.writer.start(name=f"{self.recorder.appliance}-telemetry")
        return self

    def close(self) -> None:
        """Close the open window and stop the writer (it writes what is queued)."""
        closed = self.recorder.close_if_due(self.recorder.window_end_ns, self.names)
        if closed is not None:
            self.writer.offer(closed)
        self.writer.close()

    # --- data-path thread ---------------------------------------------------------------------
    def on_batch(self, name: str, batch: Any) -> None:
        if name == self.channel:
            self.recorder.on_batch(batch)

    def do_work(self, now_ns: int, queue_frame: Any, up: Any = None) -> int:
        """Send due probes through ``queue_frame(channel, peer, frame)`` to the peers ``up``
        says are (default: all; a neighbour whose node id the data path does not know yet
        cannot check a probe's MAC, so one sent then would count as lost); close a window
        that ended. ``now_ns`` is the runner's monotonic clock."""
        work = 0
        if now_ns >= self._probe_at_ns:
            self._probe_at_ns = now_ns + self.settings.probe_interval_ns
            for peer, frame in self._probe.items():
                if up is not None and not up(peer):
                    continue  # its sequence waits: no gap for a probe never sent
                seq = self._seq[peer]
                self._seq[peer] = seq + 1
                _SEQ.pack_into(frame, fl.FRAME_HEADER_BYTES, seq)
                queue_frame(self.channel, peer, frame)
                work += 1
                self.probes_sent += 1
        if now_ns >= self._wall_at_ns:
            self._wall_at_ns = now_ns + WALL_CHECK_INTERVAL_NS
            closed = self.recorder.close_if_due(time.time_ns(), self.names)
            if closed is not None:
                self.windows_offered += len(closed)
                self.writer.offer(closed)
                work += 1
        return work

    def counters(self) -> dict[str, int]:
        return {"telemetry_probes_sent": self.probes_sent,
                "telemetry_windows": self.windows_offered,
                "telemetry_untracked_frames": self.recorder.untracked_frames,
                **{f"telemetry_{k}": int(v) for k, v in self.writer.counters().items()}}


def attach(config: Any, channels: dict[str, Any]) -> PathTelemetry | None:
    """The appliance's ``PathTelemetry`` when ``[telemetry]`` is configured and it has a fabric
    channel; else None."""
    settings = getattr(config, "telemetry", None)
    if settings is None or "fabric" not in channels:
        return None
    from channels.udp import peer_id_of

    names = {peer_id_of(*nb.address): nb.name for nb in config.neighbours}
    return PathTelemetry(config.name, config.node_id, names, settings)
