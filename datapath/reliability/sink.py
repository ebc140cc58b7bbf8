"""Where the transport's frames go: the one interface between reliability and channels.

The data path must not import ``channels`` (channels -> datapath), so senders and receivers
emit frames through a ``FrameSink`` that the channel glue provides. ``dest`` is opaque here:
the channel's own address type (a sockaddr tuple, a group, a peer id), passed through as given.
"""

from __future__ import annotations

from typing import Protocol


class FrameSink(Protocol):
    """Sends one frame. The buffer is only valid during the call: copy or send before returning."""

    def send_frame(self, frame: memoryview, dest: object) -> None: ...


class CollectingSink:
    """A sink that keeps a copy of every frame (tests, tools, single-process loops)."""

    def __init__(self) -> None:
        self.frames: list[tuple[bytes, object]] = []

    def send_frame(self, frame: memoryview, dest: object) -> None:
        self.frames.append((bytes(frame), dest))

    def take(self) -> list[tuple[bytes, object]]:
        """The frames sent since the last take, oldest first."""
        frames, self.frames = self.frames, []
        return frames
