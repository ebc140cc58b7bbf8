"""The data-path agent's output: sending the out queues and the outbox on UDP, fabric
groups and shared-memory rings, and the counters it publishes for the status (``Output``,
one part of ``DataPlaneAgent``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from appliance.config import (
    OUTBOX_FRAMES,
    STATUS_IDLE_REFRESH_NS,
    STATUS_REFRESH_NS,
)
from appliance.dataplane.names import CLIENT_SHM, CLIENT_UDP, FABRIC
from appliance.dataplane.status_channels import sample_channel
from channels.base import EACH_SLOT, FrameArrays, FrameBatch
from datapath.protocol import frame_layout as fl


class Output:
    """Sending (UDP, groups, rings, the outbox) and the published counters. Its
    methods run on the data-path thread with the agent's state (``DataPlaneAgent`` inherits
    them)."""

    def _send_outbox(self) -> int:
        done = 0
        outbox = self.outbox
        while outbox and done < OUTBOX_FRAMES:
            channel, dest, frame = outbox.popleft()
            done += 1
            if channel == "ring":  # a refused shm login: answer on the client's ring once
                self._answer_ring(dest, frame)
                continue
            if channel not in self.channels and channel != CLIENT_SHM:
                self.counters["outbox_no_channel"] += 1
                continue
            self._out[channel].add_frame(dest, frame)
        return done

    def _answer_ring(self, ring: object, frame: bytes) -> None:
        from channels.shm import ShmChannel

        try:
            with ShmChannel(tx=str(ring)) as tx:
                b = FrameBatch(1, fl.align8(len(frame)))
                b.append(frame)
                tx.send(b)
        except Exception:  # the client went away: nothing to answer
            self.counters["ring_answer_failed"] += 1

    # --- sending ------------------------------------------------------------------------------
    def _send_udp(self, name: str) -> Callable[[FrameBatch], None]:
        sign = name == FABRIC  # plain DATA frames to neighbours carry the DATA MAC
        clients = name == CLIENT_UDP  # every frame to a session with a key carries its MAC

        def send(batch: FrameBatch) -> None:
            channel = self.channels.get(name)
            if channel is None:
                self.counters[f"{name}_no_channel"] += batch.count
                return
            if sign:
                self.data_auth.sign(name, batch, self.tables, time.time_ns())
            elif clients:
                self.session_auth.sign(name, batch, time.time_ns())
            self.counted_udp_send(name, batch.count, channel.send(batch, EACH_SLOT))
        return send

    def counted_udp_send(self, name: str, count: int, sent: int) -> None:
        """``sent`` of ``count`` frames went out on UDP channel ``name``: the rest are
        counted as dropped under back-pressure."""
        if sent < count:
            self.counters[f"{name}_backpressure_drops"] += count - sent

    def _send_group(self, name: str) -> Callable[[FrameBatch], None]:
        def send(batch: FrameBatch) -> None:
            self.data_auth.sign(name, batch, self.tables, time.time_ns())
            sent = self.channels[name].send(batch, None)  # the channel's group
            if sent < batch.count:
                self.counters["group_backpressure_drops"] += batch.count - sent
        return send

    def _send_shm(self, batch: FrameBatch) -> None:
        n = batch.count
        self.session_auth.sign(CLIENT_SHM, batch, time.time_ns())
        dests = batch.peer_ids[:n]
        for sid in np.unique(dests).tolist():
            session = self.sessions.get(sid)
            if session is None or session.tx is None:
                self.counters["shm_no_session"] += 1
                continue
            sel = np.flatnonzero(dests == sid)
            frames = FrameArrays(batch.buf, batch.offsets[sel], batch.lengths[sel], len(sel))
            try:
                sent = session.tx.send(frames)
            except Exception:  # the client's ring is gone: its session will time out
                self.counters["shm_send_failed"] += len(sel)
                continue
            if sent < len(sel):
                self.counters["shm_backpressure_drops"] += len(sel) - sent

    # --- counters -----------------------------------------------------------------------------
    def _publish(self, now_ns: int) -> None:
        self._publish_at_ns = now_ns + (STATUS_REFRESH_NS if self._active_since_publish
                                        else STATUS_IDLE_REFRESH_NS)
        self._active_since_publish = False
        self.express.fold()  # what its kernels counted since
        nic = self.nic
        self.published = {  # channel samples: the control thread computes their percentiles
            "channels": [sample_channel(name, ch) for name, ch in self._status_channels()],
            "counters": {**self.counters, **self.digests, **self.guaranteed.snapshot(),
                         **self._channel_counters(), **self.flows.counts(),
                         "duplicates_dropped": self.dedup.dropped,
                         "rendezvous_duplicates_dropped": self.rdv_dedup.dropped,
                         **self.data_auth.counters(), **self.session_auth.counters(),
                         **(self.telemetry.counters() if self.telemetry is not None else {}),
                         "frames_too_large": sum(q.too_large for q in self._out.values())},
            "offload": {"verdicts": nic.counters(), "malformed": nic.malformed(),
                        "snapshot_version": nic.snapshot.version,
                        "parked": len(self._parked),
                        "last_unknown_keys": " ".join(f"{k:#018x}" for k in self.unknown_keys)},
            "sessions": {sid: {"published": s.published, "delivered": s.delivered,
                               "denied": s.denied} for sid, s in self.sessions.items()},
            "persist_failed": dict(self.guaranteed.persist_failed),
            "attribute_counts": ({"events": self.attribute_counts.events,
                                  "counts": dict(self.attribute_counts.counts)}
                                 if self.tables.rendezvous else None),
        }

    def _status_channels(self) -> list[tuple[str, Any]]:
        """Every channel, and the parts a channel reports apart (the fabric's RDMA links,
        appliance/dataplane/fabric_links.py)."""
        out = []
        for name, channel in self.channels.items():
            out.append((name, channel))
            parts = getattr(channel, "status_parts", None)
            if parts is not None:
                out.extend(parts())
        return out

    def _channel_counters(self) -> dict[str, int]:
        """Counters a channel keeps of its own (the fabric's RDMA links)."""
        out: dict[str, int] = {}
        for channel in self.channels.values():
            counters = getattr(channel, "status_counters", None)
            if counters is not None:
                out.update(counters())
        return out
